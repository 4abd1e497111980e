"""What kiln.testing's calls share: one sweep or min_budget at a time, the threads a workload left
running, and the named error for a workload that escaped what a kit call set up."""

import contextlib
import threading
from typing import Any, Iterator

from . import _kiln


class KitEscapeError(AssertionError):
    """A workload escaped the fault plan or budget a kiln.testing call set up, so that call would
    have tested nothing:
    - sweep or min_budget called inside a sweep's or min_budget's workload (the inner call would
      replace the outer one's fault or executor), while another thread runs one, or inside a
      fail_allocation or inject block (it would replace the block's plan);
    - kiln.init called inside a fail_allocation or inject block (the new executor has no plan);
    - a fault block entered inside a kit call and never left (its plan replaced the call's).
    `call` names the kit call escaped ("sweep", "min_budget", "fail_allocation", "inject"),
    `escape` what escaped it ("sweep", "min_budget", "kiln.init", "unclosed block"). Pickles
    with both."""

    def __init__(self, message: str, call: str = "", escape: str = ""):
        super().__init__(message)
        self.call = call
        self.escape = escape

    def __reduce__(self) -> tuple[type["KitEscapeError"], tuple[str, str, str]]:
        return (type(self), (str(self), self.call, self.escape))


_lock = threading.Lock()
_running: list[tuple[str, int]] = []  # the kit call now running (at most one) and its thread


@contextlib.contextmanager
def kit_call(name: str) -> Iterator[None]:
    """The block of kit call `name`; raises KitEscapeError when another one is running, in this
    thread (nested in its workload) or another (the kit arms the current device's executor)."""
    with _lock:
        if _running:  # first: a running kit call's own fault block is open too
            outer, thread = _running[-1]
            where = ("inside the workload of" if thread == threading.get_ident()
                     else "while another thread runs")
            raise KitEscapeError(
                f"kiln.testing.{name} was called {where} kiln.testing.{outer}: the inner call "
                f"would replace the outer one's {_what_it_sets(outer)}, so the outer one would "
                f"test nothing; run them one after the other", outer, name)
        block = _kiln._innermost_fault_block()
        if block is not None:
            raise KitEscapeError(
                f"kiln.testing.{name} was called inside a kiln.testing.{block} block: its own "
                f"plan would replace the block's, so the block would test nothing; call it "
                f"outside the block", block, name)
        _running.append((name, threading.get_ident()))
    try:
        yield
    finally:
        with _lock:
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


def check_same_executor(call: str, generation: int, device: Any = None) -> None:
    """Raises KitEscapeError when kiln.init replaced the executor of `device` (the current
    device's by default) since `generation` was read (at the start of fault block `call`)."""
    if _kiln._executor_generation(device, open=False) != generation:
        raise KitEscapeError(escaped_by_init(call), call, "kiln.init")


def escaped_by_init(call: str) -> str:
    return (f"kiln.init was called inside a kiln.testing.{call} block: the executor the block "
            f"armed was replaced, so nothing after the call was failed; make the executor before "
            f"the block")


def left_open(call: str, unclosed: int) -> str:
    return (f"{unclosed} kiln.testing fault block(s) opened inside a kiln.testing.{call} were "
            f"never left (entered without their exit): their plans replaced its own, so what it "
            f"armed was not failed; kiln closed them at its end; leave every block you enter "
            f"(with ...:)")


def check_all_closed(call: str, unclosed: int) -> None:
    """Raises KitEscapeError when `unclosed` fault blocks inside kit call `call` were never left."""
    if unclosed:
        raise KitEscapeError(left_open(call, unclosed), call, "unclosed block")


KitEscapeError.__module__ = "kiln.testing"  # where users import it from
