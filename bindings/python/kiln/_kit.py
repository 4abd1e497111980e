"""What kiln.testing's calls share: one sweep or min_budget at a time, the threads a workload left
running, and the named error for a workload that escaped what a kit call set up."""

import contextlib
import threading
from typing import Iterator

from . import _kiln


class KitEscapeError(AssertionError):
    """A workload escaped the fault plan or budget a kiln.testing call set up, so that call would
    have tested nothing: sweep or min_budget called inside a sweep's or min_budget's workload
    (the inner call would replace the outer one's fault or executor), or kiln.init called inside
    a fail_allocation or inject block (the new executor has no plan). `call` names the kit call
    escaped ("sweep", "min_budget", "fail_allocation", "inject"), `escape` what escaped it
    ("sweep", "min_budget", "kiln.init")."""

    def __init__(self, message: str, call: str = "", escape: str = ""):
        super().__init__(message)
        self.call = call
        self.escape = escape


_running: list[str] = []  # the kit calls now running (at most one), guarded by the GIL


@contextlib.contextmanager
def kit_call(name: str) -> Iterator[None]:
    """The block of kit call `name`; raises KitEscapeError when another one is running (in any
    thread: the kit arms one global executor)."""
    if _running:
        outer = _running[-1]
        raise KitEscapeError(
            f"kiln.testing.{name} was called inside the workload of kiln.testing.{outer}: the "
            f"inner call would replace the outer one's {_what_it_sets(outer)}, so the outer one "
            f"would test nothing; run them one after the other, not one inside the other",
            outer, name)
    _running.append(name)
    try:
        yield
    finally:
        _running.pop()


def _what_it_sets(call: str) -> str:
    return "armed fault" if call == "sweep" else "budgeted executor (kiln.init)"


def threads_now() -> set[threading.Thread]:
    """The Python threads alive now."""
    return set(threading.enumerate())


def threads_left(before: set[threading.Thread]) -> list[str]:
    """Names of the threads alive now that were not in `before` (started by a workload and still
    running after it returned: their allocation requests would land in a later run)."""
    return sorted(t.name for t in threading.enumerate() if t not in before and t.is_alive())


def check_same_executor(call: str, generation: int) -> None:
    """Raises KitEscapeError when kiln.init replaced the executor since `generation` was read (at
    the start of fault block `call`)."""
    if _kiln._executor_generation() != generation:
        raise KitEscapeError(escaped_by_init(call), call, "kiln.init")


def escaped_by_init(call: str) -> str:
    return (f"kiln.init was called inside a kiln.testing.{call} block: the executor the block "
            f"armed was replaced, so nothing after the call was failed; make the executor before "
            f"the block")


KitEscapeError.__module__ = "kiln.testing"  # where users import it from
