"""The learned prefill speed is saved beside the states and serves the next start; a fresh engine
asked for a budget probes the speed first, so in-process requests honour it too."""

import json
import os

from efim_local.engine import CompletionRequest, Engine
from efim_local.kv import StoreConfig

from tests.helpers import efim_cli, small_config, sources


def speed_files(d):
    return sorted(d.glob("speed-*.json"))


def test_the_learned_speed_serves_the_next_start(tiny_model, tmp_path):
    store = StoreConfig(tmp_path / "kv")
    with Engine(small_config(), tiny_model, store=store) as e:
        assert not e.speed.known
        e.calibrate()
        a, b = e.speed.a, e.speed.b
    (f,) = speed_files(tmp_path / "kv")
    assert f.stat().st_mode & 0o777 == 0o600
    with Engine(small_config(), tiny_model, store=store) as e:
        assert e.speed.known and (e.speed.a, e.speed.b) == (a, b)


def test_a_corrupt_or_planted_speed_file_is_ignored(tiny_model, tmp_path):
    store = StoreConfig(tmp_path / "kv")
    with Engine(small_config(), tiny_model, store=store) as e:
        e.calibrate()
    (f,) = speed_files(tmp_path / "kv")
    good = json.loads(f.read_text())
    for bad in ("not json", json.dumps(good | {"a": float("nan")}), json.dumps(good | {"a": -1}),
                json.dumps(good | {"n": "lots"}), "{" * 10_000):
        f.write_text(bad)
        with Engine(small_config(), tiny_model, store=store) as e:
            assert not e.speed.known, bad[:40]
    f.unlink()
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(good))
    os.symlink(target, f)  # never read through a link
    with Engine(small_config(), tiny_model, store=store) as e:
        assert not e.speed.known


def test_a_budget_before_anything_was_learned_probes_the_speed(tiny_model):
    text = "".join(sources()[:2])
    with Engine(small_config(n_ctx_seq=4096), tiny_model) as e:
        assert not e.speed.known
        out = e.complete(CompletionRequest(text, len(text) // 2, path="probe.py", max_prompt_ms=1))
        assert e.speed.known and out.context["reduced"]
        assert 32 <= out.context["tokens"] < out.context["full_tokens"]
        assert all(len(s.tokens) == 0 or s.path == "probe.py" for s in e.slots.slots)  # the probe's slot was emptied


def test_in_process_cli_honours_the_budget_and_reports_the_context(tiny_model, tmp_path):
    src = tmp_path / "big.py"
    src.write_text("".join(sources()[:2]))
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "EFIM_CONFIG": str(tmp_path / "none.toml")}
    (tmp_path / "none.toml").write_text("")
    for run in range(2):  # the first run probes, the second starts from the saved speed
        r = efim_cli("complete", str(src), "--line", "200", "--column", "1", "--no-daemon", "--max-prompt-ms", "1",
                     "--model", str(tiny_model), "--threads", "1", "--threads-batch", "1", "--json", env=env)
        assert r.returncode == 0, r.stderr
        ctx = json.loads(r.stdout)["context"]
        assert ctx["reduced"] and ctx["tokens"] < ctx["full_tokens"] and 0 < ctx["share"] < 1, ctx
    assert speed_files(tmp_path / "state" / "efim" / "kv")
