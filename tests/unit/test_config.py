"""config.toml and the environment: every bad value is a one-line ConfigError at load time."""

import pytest

from efim_local import config
from efim_local.errors import ConfigError
from efim_local.kv.settings import store_config


@pytest.mark.parametrize("toml, message", [
    ('max_tokens = "lots"', "'max_tokens' must be an integer, not 'lots'"),
    ("max_tokens = true", "'max_tokens' must be an integer, not True"),
    ('store = "no"', "'store' must be bool, not 'no'"),
    ("store = 0", "'store' must be bool, not 0"),
    ("ram_mb = nan", "'ram_mb' must be a finite number, not nan"),
    ("disk_mb = -1", "'disk_mb' must be in [0, 1073741824], not -1"),
    ("max_prompt_ms = inf", "'max_prompt_ms' must be a finite number, not inf"),
    ("min_state_tokens = -5", "'min_state_tokens' must be in [0, 2097152], not -5"),
    ("sparse_budget = 1.5", "'sparse_budget' must be in [0, 1], not 1.5"),
    ('layout = "psm"', "'layout' must be one of 'efim', 'fim', not 'psm'"),
    ("model = 3", "'model' must be str, not 3"),
    ('state_dir = "a\\u0000b"', "'state_dir' must not contain a NUL character"),
    ("[context]\nn_slots = 0", "'n_slots' must be in [1, 256], not 0"),
    ('[context]\ntype_k = "q9"', "'type_k' must be one of 'f32', 'f16', 'q8_0', 'q4_0', 'bf16', not 'q9'"),
    ("[context]\nflash_attn = 1", "'flash_attn' must be bool, not 1"),
    ("context = 3", "'context' must be a table ([context])"),
    ("colour = 1", "unknown config keys: colour"),
    ("max_tokens = ", None),  # not TOML
])
def test_bad_config_is_one_line(tmp_path, toml, message):
    p = tmp_path / "config.toml"
    p.write_text(toml + "\n")
    with pytest.raises(ConfigError) as e:
        config.load(p)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{p}: ")
    if message:
        assert str(e.value) == f"{p}: {message}"
    assert e.value.exit_code == 2


def test_good_config_loads_and_numbers_are_normalized(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text("store = false\nram_mb = 100\nmax_prompt_ms = 0\n[context]\nn_slots = 2\ntype_k = \"q8_0\"\n")
    cfg = config.load(p)
    assert cfg.store is False and store_config(cfg) is None
    assert cfg.ram_mb == 100.0 and isinstance(cfg.ram_mb, float) and cfg.context.n_slots == 2


def test_efim_config_must_name_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("EFIM_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match=r"^EFIM_CONFIG=.*missing\.toml: no such file$"):
        config.load()
    monkeypatch.setenv("EFIM_CONFIG", str(tmp_path))
    with pytest.raises(ConfigError, match="not a file$"):
        config.load()
    monkeypatch.delenv("EFIM_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nothing"))
    assert config.load() == config.Config()  # only the default location may be missing


def test_settings_from_the_daemon_handshake_are_checked_too():
    with pytest.raises(ConfigError, match="'n_ctx_seq' must be in"):
        config.Config.from_json({"context": {"n_ctx_seq": -1}})
    with pytest.raises(ConfigError, match="'ram_mb' must be a finite number"):
        config.Config().with_overrides(ram_mb=float("nan"))
