"""The web dashboard: ``sqlmq dashboard --url URL`` (see docs/dashboard.md).

Server-rendered pages over ``broker.insights()`` and the Broker's operations API: the
queues at a glance, one queue in detail with its charts, the archive browser, a message,
the live workers and the paused queues, and the repairs an operator makes (requeue, delete,
purge, pause, resume, cancel), each confirmed. It needs the ``dashboard`` extra
(``pip install 'sqlmq[dashboard]'``: Starlette, uvicorn, Jinja2); importing this package
does not, so ``create_app`` is loaded on first use::

    from sqlmq.dashboard import create_app

    app = create_app(broker, token="…", read_only=True)   # any ASGI server, or Mount it
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app

#: What ``sqlmq dashboard`` needs beyond sqlmq's own dependencies.
REQUIRES = ("starlette", "uvicorn", "jinja2")


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["REQUIRES", "create_app"]
