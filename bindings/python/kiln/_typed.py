"""kiln's pure-Python entry points speak kiln's errors too: a call whose arguments match no
signature (too many or too few, an unknown keyword) raises kiln.InvalidTypeError, as the native
functions' last overload does, rather than Python's plain TypeError."""

import functools
import inspect
from typing import Any, Callable, TypeVar

from ._errors import InvalidTypeError

_F = TypeVar("_F", bound=Callable[..., Any])


def typed_arguments(fn: _F) -> _F:
    """`fn`, raising InvalidTypeError (naming fn's signature) when its arguments do not bind.
    A TypeError raised inside fn goes on as it is; the wrapper costs one try block per call."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            # Binding failed when the traceback stops at this frame: fn's own frame never ran.
            if e.__traceback__ is None or e.__traceback__.tb_next is not None:
                raise
            raise InvalidTypeError(f"{fn.__name__}{inspect.signature(fn)} does not take these "
                                   f"arguments: {e}") from None

    return call  # type: ignore[return-value]
