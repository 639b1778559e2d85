"""A job's steps, and the one way they run.

Everything the engine thread does is a generator of small steps (``run.py``, ``background.py``): the
scheduler takes one step of a job at a time. A job that needs another job's steps (a warm that
prefills a plan, then grows it; growth that computes each stage in the best slot) does not nest it
(``yield from``): it yields that job's generator, which runs here, step by step, and gets the job's
result back (``tokens = yield self.staged_steps(...)``). So the jobs in progress are data, a list
(:attr:`Steps.jobs`: what runs now, outermost first), not frames on the engine thread's stack; only
the decoder's own steps are delegated to (``yield from``: the innermost, one ``llama_decode`` each),
and generators nest at most two deep (tests/unit/test_steps.py reads the source for it;
tests/engine/test_steps_nesting.py counts the frames at each decode of a real daemon's work).

A step's value is what the scheduler reads (``decode.PREFILL``, ``decode.SHOWN``, ...). An exception
a job raises goes to the job that yielded it, as ``yield from`` would hand it on; ``throw`` (the
scheduler's Cancelled) reaches the innermost job first, ``close`` closes them all, innermost first.
"""

from __future__ import annotations

from types import GeneratorType


class Steps:
    """Runs a job and the jobs it yields (the module's docstring); an iterator of their steps."""

    def __init__(self, job):
        self.stack = [job]  # the jobs in progress: each waits for the one after it

    @property
    def jobs(self) -> list[str]:
        """The jobs in progress, outermost first (their functions' names)."""
        return [g.gi_code.co_qualname for g in tuple(self.stack)]  # (a copy: status reads it from its thread)

    def __iter__(self):
        return self

    def __next__(self):
        return self._resume(None, None)

    def throw(self, exc: BaseException):
        """Raise ``exc`` in the innermost job (it goes outward as far as no job catches it); the next step."""
        return self._resume(None, exc)

    def close(self) -> None:
        """Close every job in progress, innermost first (all of them, though one fails to close: then
        the first failure is raised after)."""
        failed = None
        while self.stack:
            try:
                self.stack.pop().close()
            except BaseException as e:  # noqa: BLE001 - the jobs outside it still close
                failed = failed or e
        if failed is not None:
            raise failed

    def _resume(self, value, exc: BaseException | None):
        while self.stack:
            job = self.stack[-1]
            try:
                out = job.send(value) if exc is None else job.throw(exc)
            except StopIteration as done:  # its result goes to the job that yielded it
                self.stack.pop()
                value, exc = done.value, None
                continue
            except BaseException as e:  # noqa: BLE001 - handed to the job that yielded it (or the caller)
                self.stack.pop()
                if not self.stack:
                    raise
                value, exc = None, e
                continue
            if isinstance(out, GeneratorType):  # a job it runs first: step by step, here
                self.stack.append(out)
                value, exc = None, None  # (an exception the job caught is past)
                continue
            return out
        if exc is not None:
            raise exc
        raise StopIteration(value)


def drive(steps):
    """Run a job (a generator of steps, or :class:`Steps`) to its end; its result."""
    steps = steps if isinstance(steps, Steps) else Steps(steps)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
