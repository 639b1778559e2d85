"""The CLI's model options become the Config the engine gets (no model is loaded)."""

from efim_local.cli import build_config


def test_runtime_options_pass_through():
    cfg = build_config(model=None, threads=1, threads_batch=2, n_gpu_layers=3, main_gpu=1, offload_kqv=False,
                       flash_attn=True, n_ctx=None)
    assert (cfg.n_gpu_layers, cfg.main_gpu, cfg.context.offload_kqv, cfg.context.flash_attn) == (3, 1, False, True)
    assert (cfg.context.n_threads, cfg.context.n_threads_batch) == (1, 2)
    cfg = build_config(model=None, layout=None, threads=None, offload_kqv=None, flash_attn=None)
    assert cfg.context.offload_kqv is True and cfg.context.flash_attn is False
    assert (cfg.context.n_threads, cfg.context.n_threads_batch) == (0, 0)  # chosen by the machine's cores
