"""A job's steps (engine/steps.py): jobs a job yields run step by step beside it, not nested in it,
with ``yield from``'s results and exceptions; and in the engine's source, ``yield from`` delegates to
the decoder's own steps only, so generators nest at most two deep (issue 40: at most three)."""

import ast
from pathlib import Path

import pytest

import efim_local.engine
from efim_local.engine.steps import Steps, drive

ENGINE = Path(efim_local.engine.__file__).resolve().parent
DECODER_STEPS = {"prefill_steps", "generate_steps"}


def leaf(log, name, n, result):
    for i in range(n):
        log.append(f"{name}{i}")
        yield f"{name}{i}"
    return result


def test_a_job_gets_back_what_the_job_it_yields_returns():
    log = []

    def outer():
        a = yield leaf(log, "a", 2, 10)
        b = yield leaf(log, "b", 1, 20)
        yield "outer"
        return a + b

    steps = Steps(outer())
    assert next(steps) == "a0" and steps.jobs == [
        "test_a_job_gets_back_what_the_job_it_yields_returns.<locals>.outer", "leaf"]
    assert list(steps) == ["a1", "b0", "outer"]
    assert drive(outer()) == 30 and steps.stack == []


def test_an_exception_goes_to_the_job_that_yielded_the_one_that_raised():
    def failing():
        yield "f"
        raise KeyError("inner")

    def catching():
        try:
            yield failing()
        except KeyError as e:
            return f"caught {e.args[0]}"

    assert drive(catching()) == "caught inner"

    def passing():
        yield failing()

    with pytest.raises(KeyError):
        drive(passing())


def test_throw_reaches_the_innermost_job_first_and_close_closes_them_all_innermost_first():
    seen = []

    def inner():
        try:
            yield "i"
            yield "i2"
        except ValueError:
            seen.append("inner caught")
            yield "after"
        finally:
            seen.append("inner closed")

    def outer():
        try:
            yield inner()
            yield "o"
        finally:
            seen.append("outer closed")

    steps = Steps(outer())
    assert next(steps) == "i"
    assert steps.throw(ValueError()) == "after"
    steps.close()
    assert seen == ["inner caught", "inner closed", "outer closed"] and steps.stack == []

    steps = Steps(outer())
    next(steps)
    with pytest.raises(KeyError):  # nobody catches it: it reaches the caller, every job closed on the way
        steps.throw(KeyError())
    assert steps.stack == []


def test_a_job_that_caught_an_exception_goes_on_with_another_job():
    """As with ``yield from``: what the job caught is past; the job it yields next runs."""
    log = []

    def child():
        log.append("child ran")
        yield "c"
        return 7

    def failing():
        yield "f"
        raise KeyError()

    def job():
        try:
            yield "a"
        except ValueError:
            log.append("caught thrown")
        first = yield child()
        try:
            yield failing()
        except KeyError:
            log.append("caught raised")
        return first + (yield child())

    steps = Steps(job())
    assert next(steps) == "a"
    assert steps.throw(ValueError()) == "c" and next(steps) == "f" and next(steps) == "c"
    with pytest.raises(StopIteration) as done:
        next(steps)
    assert done.value.value == 14 and log == ["caught thrown", "child ran", "caught raised", "child ran"]


def test_every_job_closes_though_one_fails_to():
    closed = []

    def inner():
        try:
            yield "i"
        finally:
            raise OSError("inner's finally")

    def outer():
        try:
            yield inner()
        finally:
            closed.append("outer")

    steps = Steps(outer())
    next(steps)
    with pytest.raises(OSError):
        steps.close()
    assert closed == ["outer"] and steps.stack == []


def yield_froms(path: Path) -> list[str]:
    """``file:line`` of each ``yield from`` of ``path`` that delegates to anything but the decoder's steps."""
    out = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.YieldFrom):
            call = node.value
            f = call.func if isinstance(call, ast.Call) else None
            ok = (isinstance(f, ast.Attribute) and f.attr in DECODER_STEPS and isinstance(f.value, ast.Attribute)
                  and f.value.attr == "decoder")
            if not ok:
                out.append(f"{path.name}:{node.lineno}")
    return out


def test_the_engine_delegates_only_to_the_decoders_steps():
    """Every other job a job runs is yielded to its Steps (engine/steps.py); the decoder's steps do
    not delegate at all: a job's frame, the decoder's, nothing deeper."""
    files = sorted(ENGINE.rglob("*.py"))
    found = [hit for path in files for hit in yield_froms(path)]
    assert not found, f"nested jobs (yield the job to Steps instead): {found}"
    decode = ENGINE / "decode.py"
    assert not [n for n in ast.walk(ast.parse(decode.read_text("utf-8"))) if isinstance(n, ast.YieldFrom)]


def test_the_check_finds_a_nested_job(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("def a(self):\n    x = yield from self.decoder.prefill_steps(1)\n    yield from self.grow_steps()\n"
                   "    yield from other.decoder.generate_steps()\n")
    assert yield_froms(src) == ["mod.py:3"]
