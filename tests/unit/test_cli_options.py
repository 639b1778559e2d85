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


def _bench(monkeypatch, *args):
    """The SuiteConfig `efim bench ARGS` hands the suite (which is not run)."""
    from click.testing import CliRunner

    from efim_local.bench import suite
    from efim_local.cli import main

    seen = []
    monkeypatch.setattr(suite, "run", lambda cfg, log=print: seen.append(cfg) or {"json": "x.json"})
    r = CliRunner().invoke(main, ["bench", *args], standalone_mode=False)
    assert r.exception is None, r.output
    return seen[0]


def test_bench_parts_are_subcommands_with_their_own_options(monkeypatch):
    cfg = _bench(monkeypatch, "paced", "--trace", "click", "--requests", "5", "--busy", "--backend", "local:2")
    assert (cfg.parts, cfg.trace, cfg.max_requests, cfg.busy, cfg.backend) == (("paced",), "click", 5, True, "local:2")
    cfg = _bench(monkeypatch, "rounds", "--model", "gemma-text", "--files", "2", "--rounds", "3")
    assert (cfg.parts, cfg.model, cfg.rounds_files, cfg.rounds_rounds) == (("rounds",), "gemma-text", 2, 3)
    cfg = _bench(monkeypatch, "restore", "--sizes", "1024,2048", "--repeat", "1")
    assert (cfg.parts, cfg.restore_sizes, cfg.restore_repeat) == (("restore",), (1024, 2048), 1)
    assert _bench(monkeypatch, "quality", "--set", "multi").infill == "multi"
    assert _bench(monkeypatch, "all", "--quick").parts == ("paced", "replay", "rounds", "restore")


def test_bench_keeps_its_former_form(monkeypatch):
    """`efim bench --only PART [options]` and `efim bench --quick`: the single command it was."""
    cfg = _bench(monkeypatch, "--only", "paced", "--trace", "click", "--requests", "200", "--n-ctx", "4096")
    assert (cfg.parts, cfg.trace, cfg.max_requests, cfg.n_ctx) == (("paced",), "click", 200, 4096)
    cfg = _bench(monkeypatch, "--quick")
    assert cfg.quick and cfg.parts == ("paced", "replay", "rounds", "restore")
    assert _bench(monkeypatch, "--model", "default", "--only", "context", "--only", "quality").parts == \
        ("context", "quality")


def test_every_bench_subcommand_has_help_with_examples():
    """`efim bench NAME --help` exits 0 and shows an Examples block that runs `efim bench NAME`."""
    import re

    from click.testing import CliRunner

    from efim_local.cli import main
    from efim_local.cli.bench import bench

    names = [n for n, cmd in bench.commands.items() if not cmd.hidden]
    assert {"paced", "all", "cli", "drafts", "infinigen", "instant", "load", "lsp", "nvim", "overhead", "speed",
            "subtoken", "team", "user"} <= set(names)
    for name in names:
        r = CliRunner().invoke(main, ["bench", name, "--help"], standalone_mode=False)
        assert r.exit_code == 0 and r.exception is None, (name, r.output)
        block = r.output.split("Examples:\n", 1)
        assert len(block) == 2, f"efim bench {name} --help has no Examples block:\n{r.output}"
        examples = block[1].split("\n\n", 1)[0]
        assert re.search(rf"\befim bench {name}\b", examples), (name, examples)
