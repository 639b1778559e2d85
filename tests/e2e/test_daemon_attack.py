"""Issue 17: the daemon survives its clients. Each attack of tests/attack/ (the same
code ``python -m tests.attack`` runs against a user's daemon) against a real daemon over its real socket,
with short deadlines (test hooks), plus the attacks that need their own daemon (those that need no
model are unit tests: tests/unit/test_framing.py, test_watcher.py, test_paths.py), and the
socket's own deadlines, which a test has to wait out (no daemon: a socket pair)."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests import attack as A

from tests.helpers import Daemon, efim_cli, wait_until

DEADLINE = 1.0  # the test daemon's frame and send deadlines (s)


@pytest.fixture(scope="module")
def target(tmp_path_factory, tiny_model):
    d = Daemon(tmp_path_factory.mktemp("attack"), tiny_model)
    d.env.update(EFIM_TEST_HOOKS="1", EFIM_TEST_FRAME_TIMEOUT=str(DEADLINE), EFIM_TEST_SEND_TIMEOUT=str(DEADLINE))
    d.start()
    yield A.Target(d.sock, DEADLINE, DEADLINE, tmp=tmp_path_factory.mktemp("attack-scratch"))
    assert d.proc.poll() is None, "the daemon died"
    d.stop()


@pytest.mark.parametrize("name", [n for n in A.ATTACKS if n not in A.OWN_DAEMON])
def test_attack_held(target, name):
    """Each bad client of issue 17 (items 1-4, 11-14, 18, the watchdog) and of issue 27 (items 9 and
    11: refused edits behind efim lsp, LSP framing, wide roots): efim holds and serves on."""
    print(A.ATTACKS[name](target))


def test_attacks_that_start_their_own_daemon(tmp_path):
    """Issue 17 items 5 and 10: --socket at a regular file, a shared 1777 directory, a planted
    daemon.pid link; issue 27: no lock file beside a refused --socket, efim lsp when the daemon
    cannot start (item 2: started once, the reason said)."""
    rows = A.run(A.Target(tmp_path / "none.sock", tmp=tmp_path), list(A.OWN_DAEMON))
    assert [r["held"] for r in rows] == [True] * len(A.OWN_DAEMON), rows


def test_without_hooks_there_is_no_kill_method(tmp_path, tiny_model):
    d = Daemon(tmp_path, tiny_model).start()
    try:
        with pytest.raises(A.Skipped):
            A.ATTACKS["watchdog"](A.Target(d.sock, tmp=tmp_path))
    finally:
        d.stop()


def test_engine_dying_too_often_exits_nonzero_with_one_log_line(tmp_path, tiny_model):
    """The watchdog gives up after 3 restarts within a minute: exit 1, so `efim daemon start` can recover."""
    d = Daemon(tmp_path, tiny_model)
    d.env["EFIM_TEST_HOOKS"] = "1"
    d.start()
    for i in range(4):
        with A.Raw(d.sock) as c:
            assert "result" in c.exchange("_test/killEngine")
            if i < 3:  # queued behind the kill, a call is answered once the watchdog has restarted the thread
                assert "result" in c.exchange("status", rid=2)
    assert d.proc.wait(30) == 1
    err = d.proc.stderr.read().decode()
    assert err.count("the engine thread died; restarting it") == 3 and "died 4 times within a minute" in err
    assert "Traceback" not in err


# -- bounded reads of documents (item 4, CLI side) -----------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "zero", "link-to-fifo"])
def test_efim_complete_refuses_special_files_in_one_line(tmp_path, kind):
    fifo = tmp_path / "f.fifo"
    os.mkfifo(fifo)
    path = {"fifo": fifo, "zero": "/dev/zero", "link-to-fifo": tmp_path / "link.py"}[kind]
    if kind == "link-to-fifo":
        path.symlink_to(fifo)
    r = efim_cli("complete", str(path), "-l", "1", "-c", "1", "--no-daemon")
    assert r.returncode == 2 and r.stderr.decode().strip() == f"efim: error: not a regular file: {path}"


def test_efim_complete_refuses_a_nan_temperature(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    r = efim_cli("complete", str(tmp_path / "a.py"), "-l", "1", "-c", "1", "--temperature", "nan", "--no-daemon")
    assert r.returncode == 2 and b"'nan' is not a number" in r.stderr


# -- the state directory (items 10, 20) ----------------------------------------------------------------
@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a directory of another uid")
def test_state_dir_of_another_user_is_refused(tmp_path):
    st = tmp_path / "st"
    (st / "efim").mkdir(parents=True)
    os.chown(st / "efim", 65534, 65534)
    r = efim_cli("serve", "--socket", str(tmp_path / "s.sock"), env={"XDG_STATE_HOME": str(st)})
    assert r.returncode == 2 and b"belongs to another user" in r.stderr and len(r.stderr.splitlines()) == 1


# (The state directory's modes, the watcher's and the wire's attacks without a model are unit tests:
# tests/unit/test_paths.py, test_watcher.py, test_framing.py.)
def test_script_help():
    r = subprocess.run([sys.executable, "-m", "tests.attack", "--help"], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert r.returncode == 0 and "slow_reader" in r.stdout


def test_accept_loop_survives_running_out_of_file_descriptors(tmp_path, tiny_model):
    """Item 2: an error of one accept (here EMFILE, with the daemon's descriptor limit lowered) is
    logged and the loop goes on; once the clients are gone, the daemon serves again."""
    import resource

    d = Daemon(tmp_path, tiny_model).start()
    try:
        used = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
        resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (used + 12, used + 12))
        socks = []
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(d.sock))
            socks.append(s)
        time.sleep(2)
        assert d.proc.poll() is None
        for s in socks:
            s.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                assert A.small_complete(A.Target(d.sock, tmp=tmp_path)) < 20
                break
            except (A.Failed, OSError):
                assert time.monotonic() < deadline, "the daemon does not serve after the descriptors came back"
                time.sleep(0.5)
        assert d.proc.poll() is None
    finally:
        d.stop()
    assert b"Traceback" not in d.proc.stderr.read()


# -- the socket's deadlines: slow readers, dribbled and pipelined frames (issue 17) -----------------
def test_a_connection_that_stops_reading_never_blocks_send():
    from efim_local.daemon.framing import Connection

    a, b = socket.socketpair()
    conn = Connection(a, send_timeout=0.5)
    t0 = time.monotonic()
    for _ in range(200):
        conn.send(b"x" * 65536 + b"\n")  # 13 MB that nobody reads
    assert time.monotonic() - t0 < 0.5
    wait_until(lambda: not conn.alive, 10, "the connection to be dropped after its send deadline")
    b.close()


def test_a_dribbled_frame_ends_at_its_deadline():
    from efim_local.daemon.framing import read_lines

    a, b = socket.socketpair()
    stop = threading.Event()

    def dribble():
        while not stop.is_set():
            try:
                a.send(b"{")
            except OSError:
                return
            time.sleep(0.05)

    threading.Thread(target=dribble, daemon=True).start()
    t0 = time.monotonic()
    assert list(read_lines(b, idle_timeout=60, frame_timeout=0.5)) == []
    assert 0.4 < time.monotonic() - t0 < 2
    stop.set()
    a.close()
    b.close()


def test_the_deadline_is_per_frame_not_per_connection():
    """A client that pipelines frames without pause (a partial frame always in the buffer) is never
    dropped: each frame has its own deadline."""
    from efim_local.daemon.framing import read_lines

    a, b = socket.socketpair()
    stop = threading.Event()

    def stream():
        frame = b'{"jsonrpc": "2.0", "method": "status"}\n'
        try:
            while not stop.is_set():
                a.sendall(frame[:10])
                time.sleep(0.02)
                a.sendall(frame[10:] + frame[:5])  # the next frame starts before this one is read
                time.sleep(0.02)
                a.sendall(frame[5:])
        except OSError:
            pass

    threading.Thread(target=stream, daemon=True).start()
    got, t0 = 0, time.monotonic()
    for line in read_lines(b, idle_timeout=60, frame_timeout=0.3):
        got += 1
        if time.monotonic() - t0 > 1.5:
            break
    stop.set()
    a.close()
    b.close()
    assert time.monotonic() - t0 > 1.5 and got > 10  # five frame deadlines passed, still connected
