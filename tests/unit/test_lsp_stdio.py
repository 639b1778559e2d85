"""efim lsp's stdin reader (issue 27 item 11): a bad frame costs only itself, never the server or
the messages after it."""

import io
import json

import pytest

from efim_local.lsp import stdio
from efim_local.lsp.stdio import Bad, Frames


def body(rid) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "shutdown"}).encode()


def frame(rid, eol=b"\r\n") -> bytes:
    b = body(rid)
    return b"Content-Length: %d" % len(b) + eol + eol + b


def read_all(data: bytes, chunk: int = 1 << 16) -> list:
    f = Frames(io.BufferedReader(io.BytesIO(data), 7), chunk)
    out = []
    while (m := f.next()) is not None:
        if isinstance(m, bytes):
            try:
                json.loads(m)
            except ValueError:  # what the server's loop does with a body that is not JSON
                f.give_back(m)
                m = Bad("not JSON", m)
        out.append(m if isinstance(m, Bad) else json.loads(m)["id"])
    return out


@pytest.mark.parametrize("chunk", [1, 5, 1 << 16])
def test_good_frames_in_any_chunking_and_lf_only_headers(chunk):
    data = frame(1) + frame(2, b"\n") + b"\r\n" + frame(3) + b"content-length:%d\r\nContent-Type: x\r\n\r\n" % len(
        body(4)) + body(4)
    assert read_all(data, chunk) == [1, 2, 3, 4]


@pytest.mark.parametrize("length", [b"99999999999999999999999", b"50000000000", b"-5", b"abc", b"1e3",
                                    b"\xff\xfe"])
def test_a_refused_content_length_costs_only_its_frame(length):
    got = read_all(b"Content-Length: " + length + b"\r\n\r\n" + body(1) + frame(2))
    assert isinstance(got[0], Bad) and got[1:] == [2]


def test_a_frame_without_content_length_is_refused_and_the_next_is_read():
    got = read_all(b"Content-Type: application/json\r\n\r\n" + body("x") + frame(2) + frame(3))
    assert isinstance(got[0], Bad) and b'"id": "x"' in got[0].data and got[1:] == [2, 3]


def test_a_short_or_long_content_length_loses_no_other_message():
    b = body("short")
    got = read_all(b"Content-Length: %d\r\n\r\n" % (len(b) - 10) + b + frame(2) + frame(3))
    assert [g for g in got if not isinstance(g, Bad)] == [2, 3]
    long = b"Content-Length: %d\r\n\r\n" % (len(b) + 30) + b + frame(2) + frame(3)
    got = read_all(long)
    assert isinstance(got[0], Bad) and [g for g in got if not isinstance(g, Bad)] == [2, 3]


def test_junk_and_an_endless_header_line():
    got = read_all(b"garbage\r\n\r\n" + frame(1) + b"x" * (stdio.MAX_HEADER + 10) + frame(2))
    assert [g for g in got if not isinstance(g, Bad)] == [1, 2]


def test_the_end_of_input_in_a_body_or_headers():
    assert read_all(frame(1)[:-3]) == []
    assert read_all(b"Content-Len") == []
