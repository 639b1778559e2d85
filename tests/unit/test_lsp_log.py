"""`efim lsp`'s log: pygls logs a traceback for a message whose params do not fit their type (it is
answered InvalidParams); the server's filter makes it one line that says where and why, and leaves
other errors' tracebacks (a bug) as they are."""

import logging
import traceback

from lsprotocol import types as t
from pygls.protocol import default_converter

from efim_local.lsp.server import _ExpectedErrors

PYGLS = logging.getLogger("pygls.protocol.json_rpc")


def logged(params, target) -> str:
    """What pygls' deserializer logs for ``params`` (as it does: from its except block), filtered."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    handler.addFilter(_ExpectedErrors())
    PYGLS.addHandler(handler)
    try:
        default_converter().structure(params, target)
    except Exception:  # noqa: BLE001 - what pygls catches
        PYGLS.error("Unable to deserialize message\n%s", traceback.format_exc())
    finally:
        PYGLS.removeHandler(handler)
    assert len(records) == 1
    return records[0].getMessage()


def test_params_that_do_not_fit_their_type_are_logged_in_one_line_that_says_where():
    msg = logged({"textDocument": {"uri": "file:///a.py"}, "position": {"line": "x", "character": 0}},
                 t.DocumentHighlightParams)
    assert "\n" not in msg and "$.position.line" in msg and msg.startswith("Unable to deserialize message: "), msg


def test_any_other_error_keeps_its_traceback():
    msg = logged("not a number", int)  # a ValueError: pygls answers InternalError (a bug of ours or its)
    assert "Traceback" in msg and "\n" in msg
