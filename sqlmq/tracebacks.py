"""A handler's traceback as its author should read it: from their own code on.

A failed handler's traceback begins with the runtime's frames (the worker loop, the lease
deadline, the middleware chain, the adapter that calls the handler), which say nothing about
the failure and push its cause down the log and out of the archive's bounded error text.
:func:`handler_traceback` drops them, but only where the frame after them is code sqlmq
called as the user's (a handler or a middleware's ``handle``): an error raised by sqlmq
itself, or by a library sqlmq called (decoding a body, say), keeps every frame, as they are
where it happened.
"""

from __future__ import annotations

import asyncio.threads
import concurrent.futures.thread
import os
from collections.abc import Callable
from types import CodeType, TracebackType
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: The demo's handler lives in the package but stands for a user's: its frames are kept.
_DEMO = os.path.join(_PACKAGE, "demo.py")
#: The hand-off of a synchronous handler to a thread (``asyncio.to_thread``): the runtime's
#: too, between the adapter and the handler.
_HANDOFF = frozenset(os.path.abspath(m.__file__ or "")
                     for m in (asyncio.threads, concurrent.futures.thread))

#: The functions whose next frame is the user's code: what :func:`calls_user_code` marks,
#: and the thread pool's work item, which runs a synchronous handler.
_CALLERS: set[CodeType] = set()
_work_item = getattr(getattr(concurrent.futures.thread, "_WorkItem", None), "run", None)
if _work_item is not None:
    _CALLERS.add(_work_item.__code__)


def calls_user_code(func: _F) -> _F:
    """Mark ``func`` as one of sqlmq's calls into the user's code: a traceback that leaves
    sqlmq's frames through it is the user's from the next frame on."""
    _CALLERS.add(func.__code__)
    return func


def _runtime(filename: str) -> bool:
    return (filename.startswith(_PACKAGE) and filename != _DEMO) or filename in _HANDOFF


def handler_traceback(exc: BaseException) -> TracebackType | None:
    """``exc``'s traceback from the first frame of the user's code on: the leading frames of
    sqlmq's runtime dropped when the last of them called the user's code. Otherwise (the
    error is sqlmq's own, or has no such frames) the whole traceback."""
    tb = exc.__traceback__
    last = None
    while tb is not None and _runtime(os.path.abspath(tb.tb_frame.f_code.co_filename)):
        last, tb = tb, tb.tb_next
    if tb is None or last is None or last.tb_frame.f_code not in _CALLERS:
        return exc.__traceback__
    return tb


__all__ = ["calls_user_code", "handler_traceback"]
