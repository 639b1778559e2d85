"""The error tree: every class's JSON-RPC code and CLI exit code, the wire round trip, internal()."""

import inspect

import pytest

from efim_local import errors as E

# The contract, written out: (JSON-RPC code, CLI exit code). Exit code 2 is a usage error only.
EXPECTED = {
    E.EfimError: (E.INTERNAL_ERROR, 1),
    E.UsageError: (E.INVALID_PARAMS, 2),
    E.InvalidParams: (E.INVALID_PARAMS, 2),
    E.DocumentError: (E.INVALID_PARAMS, 2),
    E.PlanError: (E.INVALID_PARAMS, 2),
    E.ConfigError: (E.INVALID_PARAMS, 2),
    E.TemplateError: (E.INVALID_PARAMS, 2),
    E.ParseError: (E.PARSE_ERROR, 1),
    E.InvalidRequest: (E.INVALID_REQUEST, 1),
    E.MethodNotFound: (E.METHOD_NOT_FOUND, 1),
    E.RequestTooLarge: (E.REQUEST_TOO_LARGE, 1),
    E.Busy: (E.BUSY, 1),
    E.Cancelled: (E.CANCELLED, 1),
    E.Interrupted: (E.CANCELLED, 1),  # background work's, never sent: it reads as Cancelled on the wire
    E.BackendError: (E.MODEL_ERROR, 1),
    E.ModelError: (E.MODEL_ERROR, 2),  # a model path that cannot be loaded is the user's input
    E.DownloadError: (E.INTERNAL_ERROR, 1),  # efim models pull: the network or the hub said no
    E.NoKvSlot: (E.MODEL_ERROR, 1),
    E.DecodeError: (E.MODEL_ERROR, 1),
    E.StoreError: (E.INTERNAL_ERROR, 1),
    E.StateFileError: (E.INTERNAL_ERROR, 1),
    E.DaemonError: (E.INTERNAL_ERROR, 1),
    E.DaemonUnavailable: (E.INTERNAL_ERROR, 1),
    E.AlreadyRunning: (E.INTERNAL_ERROR, 1),
    E.Unsupported: (E.INTERNAL_ERROR, 1),
    E.InternalError: (E.INTERNAL_ERROR, 1),
}
# The class each wire code comes back as (client side).
WIRE = {E.PARSE_ERROR: E.ParseError, E.INVALID_REQUEST: E.InvalidRequest, E.METHOD_NOT_FOUND: E.MethodNotFound,
        E.INVALID_PARAMS: E.InvalidParams, E.INTERNAL_ERROR: E.InternalError, E.BUSY: E.Busy,
        E.MODEL_ERROR: E.BackendError, E.REQUEST_TOO_LARGE: E.RequestTooLarge, E.CANCELLED: E.Cancelled}
# ModelError shares MODEL_ERROR with runtime failures, so over the wire it reads as a BackendError
# (exit 1). A daemon loads its model at start, so no request can fail with it.
LOSES_EXIT_CODE = {E.ModelError}


def make(cls, message="it broke", data=None):
    """An instance of any class of the tree (two take a reason first)."""
    if cls in (E.StateFileError, E.Unsupported):
        e = cls("some_reason", message)
        e.data = data
        return e
    return cls(message, data)


def test_the_table_covers_the_whole_tree():
    classes = {c for _, c in inspect.getmembers(E, inspect.isclass) if issubclass(c, E.EfimError)}
    assert classes == set(EXPECTED)
    # llama/ re-exports the same classes: one tree, no second definition.
    from efim_local import llama

    assert (llama.BackendError, llama.ModelError, llama.DecodeError, llama.NoKvSlot, llama.Interrupted) == \
        (E.BackendError, E.ModelError, E.DecodeError, E.NoKvSlot, E.Interrupted)


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_code_and_exit_code(cls):
    e = make(cls)
    assert (e.code, e.exit_code) == EXPECTED[cls]
    assert isinstance(e, E.EfimError) and str(e) == e.message == "it broke"
    # Exit code 2 is exactly the usage errors (and an unloadable model file).
    assert (e.exit_code == 2) == (isinstance(e, E.UsageError) or cls is E.ModelError)


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_from_wire_round_trip(cls):
    e = make(cls, "line 3 is past the end", {"id": 7, "detail": ["x"]})
    wire = e.to_json()
    assert wire == {"code": e.code, "message": "line 3 is past the end", "data": {"id": 7, "detail": ["x"]}}
    back = E.from_wire(wire)
    assert type(back) is WIRE[e.code]
    assert (back.code, back.message, back.data) == (e.code, e.message, e.data)
    if cls not in LOSES_EXIT_CODE:
        assert back.exit_code == e.exit_code


def test_to_json_leaves_out_missing_data():
    assert E.Busy("queue full").to_json() == {"code": E.BUSY, "message": "queue full"}
    assert E.Cancelled().message == "cancelled"


@pytest.mark.parametrize("wire,code,message", [
    ({"code": -32099, "message": "future error"}, -32099, "future error"),  # a code this client does not know
    ({"code": E.BUSY}, E.BUSY, "malformed error from the daemon"),
    ({"code": "busy", "message": "x"}, E.INTERNAL_ERROR, "x"),
    ({"message": 5}, E.INTERNAL_ERROR, "malformed error from the daemon"),
    ({}, E.INTERNAL_ERROR, "malformed error from the daemon"),
    ("not an object", E.INTERNAL_ERROR, "malformed error from the daemon"),
    (None, E.INTERNAL_ERROR, "malformed error from the daemon"),
])
def test_from_wire_of_unknown_or_malformed_errors(wire, code, message):
    e = E.from_wire(wire)
    assert isinstance(e, E.EfimError) and e.code == code and e.message == message and e.exit_code == 1


def test_internal_wraps_foreign_exceptions_once():
    own = E.PlanError("unknown layout")
    assert E.internal(own) is own
    e = E.internal(ValueError("bad value"))
    assert type(e) is E.InternalError and e.code == E.INTERNAL_ERROR and e.exit_code == 1
    assert e.message == "internal error: ValueError: bad value"
    assert E.internal(RuntimeError()).message == "internal error: RuntimeError"
    assert E.internal(KeyError("k")).message == "internal error: KeyError: 'k'"


def test_internal_is_one_line():
    assert "\n" not in E.internal(ValueError("line one\nline two")).message


def test_reasons_and_other_hierarchies():
    e = E.StateFileError("corrupt", "checksum mismatch")
    assert e.reason == "corrupt" and str(e) == "checksum mismatch" and isinstance(e, E.StoreError)
    assert E.Unsupported("kv_type", "q8_0 keys").reason == "kv_type"
    # Callers that handle connection failures catch the daemon's too.
    assert isinstance(E.DaemonUnavailable("no daemon"), ConnectionError)
    assert issubclass(E.AlreadyRunning, E.DaemonError) and issubclass(E.NoKvSlot, E.BackendError)
