"""The daemon's state directory (issue 17 items 10, 20): private, its files 0600, never written
through a symbolic link."""

import os

import pytest

from efim_local.daemon import paths
from efim_local.errors import ConfigError


def test_state_dir_is_private_and_files_are_0600(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "st"))
    (tmp_path / "st" / "efim").mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / "st" / "efim", 0o755)  # what older versions made
    pid = paths.pid_file()
    assert oct(pid.parent.stat().st_mode & 0o777) == "0o700"  # tightened
    paths.write_private(pid, "1\n")
    assert oct(pid.stat().st_mode & 0o777) == "0o600"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    pid.unlink()
    pid.symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        paths.write_private(pid, "2\n")
    assert victim.read_text() == "precious"
