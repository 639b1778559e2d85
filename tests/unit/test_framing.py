"""The daemon's wire: JSON-RPC frames parsed and written, param() checks, lines read from a socket."""

import json
import socket
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from efim_local import errors as E
from efim_local.daemon import framing
from efim_local.daemon.framing import Message, param, parse


# -- parse: good frames --------------------------------------------------------------------------
@pytest.mark.parametrize("frame,want", [
    (b'{"jsonrpc": "2.0", "id": 1, "method": "status"}', Message("status", {}, 1, False)),
    (b'{"jsonrpc": "2.0", "id": "a-1", "method": "complete", "params": {"path": "x"}}',
     Message("complete", {"path": "x"}, "a-1", False)),
    (b'{"jsonrpc": "2.0", "id": 0, "method": "status", "params": {}}', Message("status", {}, 0, False)),
    (b'{"jsonrpc": "2.0", "id": -9007199254740991, "method": "m"}', Message("m", {}, -(2 ** 53 - 1), False)),
    (b'{"jsonrpc": "2.0", "method": "didClose", "params": {"path": "x"}}', Message("didClose", {"path": "x"})),
    ('{"jsonrpc": "2.0", "id": "ü", "method": "méthode"}'.encode(), Message("méthode", {}, "ü", False)),
    (b'  {"jsonrpc": "2.0", "id": 2, "method": "status", "extra": true}\r', Message("status", {}, 2, False)),
])
def test_parse_good_frames(frame, want):
    assert parse(frame) == want


def test_a_notification_is_a_frame_without_id():
    msg = parse(b'{"jsonrpc": "2.0", "method": "didOpen", "params": {"path": "a", "text": ""}}')
    assert msg.is_notification and msg.id is None
    assert not parse(b'{"jsonrpc": "2.0", "id": 3, "method": "didOpen"}').is_notification


# -- parse: bad frames, and the id the error reply goes to ---------------------------------------
@pytest.mark.parametrize("frame,cls,rid", [
    (b"", E.ParseError, None),
    (b"{not json", E.ParseError, None),
    (b"\xff\xfe", E.ParseError, None),  # not UTF-8
    (b"[" * 100_000, E.ParseError, None),  # too deep to parse
    (b'{"jsonrpc": "2.0", "id": 1, "method": "status"} {}', E.ParseError, None),  # two objects
    (b"[1, 2]", E.InvalidRequest, None),
    (b'"status"', E.InvalidRequest, None),
    (b'{"jsonrpc": "2.0", "id": true, "method": "status"}', E.InvalidRequest, None),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "status"}', E.InvalidRequest, None),
    (b'{"jsonrpc": "2.0", "id": [1], "method": "status"}', E.InvalidRequest, None),
    (b'{"jsonrpc": "2.0", "id": null, "method": "status"}', E.InvalidRequest, None),
    (b'{"jsonrpc": "2.0", "id": 9007199254740992, "method": "status"}', E.InvalidRequest, None),  # 2**53
    (b'{"jsonrpc": "2.0", "id": "' + b"x" * 257 + b'", "method": "status"}', E.InvalidRequest, None),
    (b'{"jsonrpc": "1.0", "id": 7, "method": "status"}', E.InvalidRequest, 7),
    (b'{"id": "q", "method": "status"}', E.InvalidRequest, "q"),
    (b'{"jsonrpc": 2.0, "id": 7, "method": "status"}', E.InvalidRequest, 7),
    (b'{"jsonrpc": "2.0", "id": 8}', E.InvalidRequest, 8),
    (b'{"jsonrpc": "2.0", "id": 8, "method": ""}', E.InvalidRequest, 8),
    (b'{"jsonrpc": "2.0", "id": "m", "method": 5}', E.InvalidRequest, "m"),
    (b'{"jsonrpc": "2.0", "id": 9, "method": "complete", "params": [1]}', E.InvalidParams, 9),
    (b'{"jsonrpc": "2.0", "id": 9, "method": "complete", "params": "x"}', E.InvalidParams, 9),
    (b'{"jsonrpc": "2.0", "method": "complete", "params": null}', E.InvalidParams, None),
])
def test_parse_bad_frames(frame, cls, rid):
    with pytest.raises(E.EfimError) as info:
        parse(frame)
    e = info.value
    assert type(e) is cls and e.request_id == rid
    # The id addresses the reply; it is not part of the error object on the wire.
    assert set(e.to_json()) == {"code", "message"} and "\n" not in e.message
    assert json.loads(framing.error(e.request_id, e)) == {"jsonrpc": "2.0", "id": rid, "error": e.to_json()}


@given(st.binary(max_size=64))
def test_parse_never_fails_with_anything_but_an_efim_error(data):
    try:
        msg = parse(data)
    except E.EfimError as e:
        assert e.code in (E.PARSE_ERROR, E.INVALID_REQUEST, E.INVALID_PARAMS)
    else:
        assert isinstance(msg.method, str) and isinstance(msg.params, dict)


# -- writing frames ------------------------------------------------------------------------------
@pytest.mark.parametrize("frame,obj", [
    (framing.reply(3, {"text": "a\nb", "ü": 1}), {"jsonrpc": "2.0", "id": 3, "result": {"text": "a\nb", "ü": 1}}),
    (framing.reply("x", None), {"jsonrpc": "2.0", "id": "x", "result": None}),
    (framing.error(None, E.Busy("queue full")),
     {"jsonrpc": "2.0", "id": None, "error": {"code": E.BUSY, "message": "queue full"}}),
    (framing.notification("progress", {"text": "日本"}), {"jsonrpc": "2.0", "method": "progress", "params": {"text": "日本"}}),
    (framing.request(4, "status"), {"jsonrpc": "2.0", "id": 4, "method": "status", "params": {}}),
])
def test_frames_are_one_utf8_json_line(frame, obj):
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    assert json.loads(frame.decode("utf-8")) == obj
    # Not \u-escaped: each character beyond ASCII is in the frame as its UTF-8 bytes.
    wide = {ch for ch in json.dumps(obj, ensure_ascii=False) if ord(ch) > 127}
    assert b"\\u" not in frame and all(ch.encode() in frame for ch in wide)


def strict(frame: bytes):
    """JSON as a browser's JSON.parse reads it: NaN and Infinity are not numbers there."""
    return json.loads(frame, parse_constant=lambda name: pytest.fail(f"{name} in {frame!r}"))


def test_a_number_that_is_not_finite_goes_out_as_null():
    """Issue 38: a NaN from a server's timings made a reply that JSON.parse refuses."""
    nan, inf = float("nan"), float("inf")
    out = strict(framing.reply(1, {"ms": nan, "t": [inf, 1.5, {"x": -inf}], "n": 3, "s": "NaN"}))
    assert out["result"] == {"ms": None, "t": [None, 1.5, {"x": None}], "n": 3, "s": "NaN"}
    assert strict(framing.notification("p", {"a": (nan, "é\ud800")}))["params"] == {"a": [None, "é\ud800"]}


def test_a_written_request_parses_back():
    assert parse(framing.request("r1", "complete", {"path": "a.py", "offset": 3})) == \
        Message("complete", {"path": "a.py", "offset": 3}, "r1", False)


# -- param() ----------------------------------------------------------------------------------------
def test_param_fetches_and_checks():
    p = {"n": 5, "s": "x", "none": None, "flag": True, "f": 1.5}
    assert param(p, "n", int, lo=0, hi=5) == 5
    assert param(p, "s", str) == "x"
    assert param(p, "missing", int, 7) == 7 and param(p, "none", int, 7) == 7  # null is "not given"
    assert param(p, "missing", str, None) is None
    assert param(p, "flag", bool) is True


@pytest.mark.parametrize("key,kind,kw,message", [
    ("missing", int, {}, "'missing' is required"),
    ("none", int, {}, "'none' is required"),
    ("flag", int, {}, "'flag' must be int"),  # a bool is not an int here
    ("f", int, {}, "'f' must be int"),
    ("s", int, {}, "'s' must be int"),
    ("n", str, {}, "'n' must be str"),
    ("n", int, {"lo": 6}, "'n' must be in [6, None]"),
    ("n", int, {"hi": 4}, "'n' must be in [None, 4]"),
])
def test_param_errors_are_one_line_invalid_params(key, kind, kw, message):
    p = {"n": 5, "s": "x", "none": None, "flag": True, "f": 1.5}
    with pytest.raises(E.InvalidParams) as info:
        param(p, key, kind, **kw)
    assert info.value.message == f"invalid params: {message}" and info.value.code == E.INVALID_PARAMS


# -- lines from a socket --------------------------------------------------------------------------
def lines_of(chunks: list[bytes], monkeypatch=None, max_frame=None) -> list:
    if max_frame is not None:
        monkeypatch.setattr(framing, "MAX_FRAME", max_frame)
    a, b = socket.socketpair()

    def write():
        with a:
            for c in chunks:
                a.sendall(c)

    t = threading.Thread(target=write)
    t.start()
    try:
        b.settimeout(10)
        return list(framing.read_lines(b))
    finally:
        t.join()
        b.close()


def test_read_lines_splits_frames_and_skips_blank_lines():
    got = lines_of([b'{"a": 1}\n\n  \r\n{"b"', b': 2}\n{"c": 3}\n', b"incomplete at EOF"])
    assert got == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}']


def test_an_oversized_line_yields_oversized_once_and_the_next_line_is_read(monkeypatch):
    # Over the limit inside one read, and across reads (a line longer than one recv()).
    big = framing.Oversized
    assert lines_of([b"x" * 40 + b"\nok\n"], monkeypatch, max_frame=16) == [big(b"x" * 40), b"ok"]
    assert lines_of([b"y" * 200_000, b"y" * 1000 + b"\nok\n"], monkeypatch, max_frame=16) == [
        big(b"y" * framing.HEAD), b"ok"]
    assert lines_of([b"z" * 16 + b"\n"], monkeypatch, max_frame=16) == [b"z" * 16]  # the limit itself is fine


@pytest.mark.parametrize("head,rid", [
    (b'{"jsonrpc":"2.0","id":7,"method":"didChange","params":{"x":"' + b"a" * 900, 7),
    (b'  { "jsonrpc" : "2.0" , "id" : "abc\\"d", "params": {', 'abc"d'),
    (b'{"method":"m","jsonrpc":"2.0","id":-3', None),  # cut inside the id: unreadable
    (b'{"method":"m","jsonrpc":"2.0","id":-3,', -3),
    (b'{"params":{"id":5},"id":6', None),  # params first: nested values end the search
    (b'{"id":true,"method":"m"', None),  # not a valid id
    (b'[{"id":1}', None),
    (b'{"jsonrpc":"2.0","id":1.5,', None),
    (b"\xff\xfe", None),
])
def test_leading_id_of_an_oversized_frame(head, rid):
    assert framing.leading_id(head) == rid


# -- a socket's attacks: busy replies (issue 17; the timed ones, slow readers and dribbled frames, are
# tests/e2e/test_daemon_attack.py) -----------------------------------------------------------------
def test_busy_reply_is_read_not_reset(tmp_path):
    """Past the connection limit a client reads the busy error; one that closed at once costs nothing."""
    from efim_local.daemon.server import refuse

    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(tmp_path / "s"))
    srv.listen(4)
    gone = socket.socket(socket.AF_UNIX)
    gone.connect(str(tmp_path / "s"))
    gone.close()
    refuse(srv.accept()[0], b'{"busy": 1}\n')  # no BrokenPipeError escapes
    c = socket.socket(socket.AF_UNIX)
    c.connect(str(tmp_path / "s"))
    c.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "status"}\n')
    refuse(srv.accept()[0], b'{"busy": 1}\n')
    assert c.recv(100) == b'{"busy": 1}\n'
    c.close()
    srv.close()


