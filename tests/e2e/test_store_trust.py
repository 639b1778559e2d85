"""`efim complete --no-daemon` and another user's state directory (issue 27, item 10): a `kv` that is
a symbolic link to one of the victim's directories, in an `efim` directory another user made (0777).
The store refuses it with one warning and the completion runs without saved states."""

import os
import stat

import pytest

from tests.helpers import efim_cli

OTHER_UID = 65534  # nobody


@pytest.mark.parametrize("prepared_by", ["another_user", "ourselves"])
def test_in_process_completion_refuses_a_planted_store_directory(tmp_path, tiny_model, prepared_by):
    if prepared_by == "another_user" and os.getuid() != 0:
        pytest.skip("needs root to make a directory of another user")
    victim = tmp_path / "victim"
    victim.mkdir()
    os.chmod(victim, 0o755)
    (victim / "precious").write_text("mine")
    efim = tmp_path / "state" / "efim"
    efim.mkdir(parents=True)
    os.chmod(efim, 0o777 if prepared_by == "another_user" else 0o700)
    (efim / "kv").symlink_to(victim)
    if prepared_by == "another_user":
        os.chown(efim, OTHER_UID, OTHER_UID)
    src = tmp_path / "a.py"
    src.write_text("def fib(n):\n    return n\n")
    r = efim_cli("complete", "--no-daemon", "--model", str(tiny_model), str(src), "-l", "2", "-c", "5",
                 "--max-tokens", "2", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "Traceback" not in err and err.count("serving without saved states") == 1, err
    assert "refusing" in err, err
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755  # not chmodded
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]  # nothing written into it
