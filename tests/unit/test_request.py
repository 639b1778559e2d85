"""CompletionRequest = Position + Options: the one request schema, its JSON-RPC validation, its round
trip, and the config and LSP settings that take their bounds from it."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from efim_local.request import LAYOUTS, CompletionRequest, Options, Position
from efim_local.errors import InvalidParams

OPTIONS = {name: (default, meta) for name, default, meta in CompletionRequest.options()}


def from_params(params):
    return CompletionRequest.from_params(params, "text", 2, "a.py")


def test_defaults_and_given_values():
    r = from_params({})
    assert r == CompletionRequest("text", 2, path="a.py")
    assert all(getattr(r.how, name) == default for name, (default, _) in OPTIONS.items())
    r = from_params({"max_tokens": 4096, "temperature": 5, "top_k": 0, "top_p": 0.5, "seed": 2 ** 32 - 1,
                     "layout": "fim", "stop_at_newline": True, "max_lines": 1, "heal": False, "sparse": True})
    h = r.how
    assert (h.max_tokens, h.temperature, h.top_k, h.top_p, h.seed, h.layout) == (4096, 5.0, 0, 0.5, 2 ** 32 - 1, "fim")
    assert type(h.temperature) is float and h.stop_at_newline is True and h.max_lines == 1 and h.sparse is True
    # null is "not given"; unknown keys are the caller's business (path, text, offset, stream, ...).
    assert from_params({"max_tokens": None, "layout": None, "stream": True, "x": [1]}) == from_params({})


@pytest.mark.parametrize("name,value,message", [
    ("max_tokens", "5", "must be an integer"),
    ("max_tokens", 5.0, "must be an integer"),
    ("max_tokens", True, "must be an integer"),  # JSON true is not 1
    ("max_tokens", -1, "must be in [0, 4096]"),
    ("max_tokens", 4097, "must be in [0, 4096]"),
    ("max_tokens", 10 ** 30, "must be in [0, 4096]"),
    ("temperature", "0.5", "must be a finite number"),
    ("temperature", False, "must be a finite number"),
    ("temperature", math.nan, "must be a finite number"),
    ("temperature", math.inf, "must be a finite number"),
    ("temperature", -math.inf, "must be a finite number"),
    ("temperature", -0.1, "must be in [0, 5]"),
    ("temperature", 5.5, "must be in [0, 5]"),
    ("top_p", 1.01, "must be in [0, 1]"),
    ("top_k", 1001, "must be in [0, 1000]"),
    ("seed", -1, "must be in"),
    ("seed", 2 ** 32, "must be in"),
    ("max_lines", 0, "must be in [1, 1000]"),
    ("layout", "xyz", "must be one of 'efim', 'fim'"),
    ("layout", "EFIM", "must be one of"),
    ("layout", 1, "must be str"),
    ("stop_at_newline", 1, "must be bool"),
    ("stop_at_newline", "true", "must be bool"),
    ("heal", [], "must be bool"),
    ("sparse", 0, "must be bool"),
])
def test_bad_params_are_one_line_invalid_params(name, value, message):
    with pytest.raises(InvalidParams) as info:
        from_params({name: value})
    e = info.value
    assert e.message.startswith(f"invalid params: {name!r} ") and message in e.message and "\n" not in e.message
    assert (e.code, e.exit_code) == (-32602, 2)


def test_every_option_is_validated():
    """No option takes any value unchecked (a wrong type is refused for each of them)."""
    for name, (default, meta) in OPTIONS.items():
        wrong = "x" if meta["kind"] is not str else 1
        with pytest.raises(InvalidParams, match=repr(name)):
            from_params({name: wrong})
        assert meta["help"], name


def test_nan_float_options_are_refused():
    floats = [name for name, (_, meta) in OPTIONS.items() if meta["kind"] is float]
    assert {"temperature", "top_p"} <= set(floats)
    for name in floats:
        with pytest.raises(InvalidParams, match="finite"):
            from_params({name: math.nan})


def value(meta):
    """Valid values of an option, from its metadata."""
    kind, lo, hi, choices = meta["kind"], meta["lo"], meta["hi"], meta["choices"]
    if choices:
        return st.sampled_from(choices)
    if kind is bool:
        return st.booleans()
    if kind is int:
        return st.integers(int(lo) if lo is not None else -(2 ** 40), int(hi) if hi is not None else 2 ** 40)
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


REQUESTS = st.builds(
    CompletionRequest, text=st.text(max_size=20), cursor=st.integers(0, 20), path=st.text(min_size=1, max_size=10),
    **{name: st.one_of(st.none(), value(meta)) if default is None else value(meta)
       for name, (default, meta) in OPTIONS.items()})


@given(REQUESTS)
def test_to_params_round_trip(req):
    params = req.to_params()
    # Only what differs from the defaults travels, and it survives JSON.
    assert all(params[name] != OPTIONS[name][0] for name in params)
    wire = json.loads(json.dumps(params))
    assert CompletionRequest.from_params(wire, req.text, req.cursor, req.path) == req


def test_layouts_are_the_planners():
    from efim_local.prompt import planner

    assert LAYOUTS == planner.LAYOUTS == OPTIONS["layout"][1]["choices"]


def test_the_cli_offers_every_cli_option():
    """`efim complete` gets its request options from the same definition."""
    from efim_local.cli.complete import complete

    flags = {opt for p in complete.params for opt in p.opts}
    for name, (_, meta) in OPTIONS.items():
        assert ("--" + name.replace("_", "-") in flags) == meta["cli"], name


def test_config_bounds_are_the_requests():
    """The config's defaults for request options are checked by the request's own definition."""
    from efim_local import config
    from efim_local.errors import ConfigError

    for name in config.REQUEST_DEFAULTS:
        assert config.RULES[name] is OPTIONS[name][1]
    with pytest.raises(ConfigError, match="must be in \\[0, 4096\\]"):
        config.Config(max_tokens=4097)
    with pytest.raises(ConfigError, match="must be one of 'efim', 'fim'"):
        config.Config(layout="spm")


def test_lsp_settings_take_the_requests_bounds():
    from efim_local.lsp.server import Settings

    s = Settings()
    s.update({"maxTokens": 4097, "maxLines": 1001})
    assert (s.max_tokens, s.max_lines) == (None, None)
    s.update({"maxTokens": 4096, "maxLines": 0})
    assert (s.max_tokens, s.max_lines) == (4096, 0)


def test_a_request_is_where_and_how():
    r = CompletionRequest("abc", 1, path="a.py", max_tokens=3)
    assert r == CompletionRequest.of(Position("abc", 1, "a.py"), Options(max_tokens=3))
    assert (r.text, r.cursor, r.path, r.how.max_tokens) == ("abc", 1, "a.py", 3)
