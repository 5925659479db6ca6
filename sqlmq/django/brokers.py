"""The process's broker, made from the ``SQLMQ`` setting on first use.

A web process only publishes and reads results, so its broker starts no subscriber; the
worker (``manage.py sqlmq_worker``) makes a broker of its own, on its own event loop.
"""

from __future__ import annotations

import threading

from ..broker import Broker
from .config import config, database_url
from .portal import portal

_lock = threading.Lock()
_broker: Broker | None = None


def broker() -> Broker:
    """The broker the ``SQLMQ`` setting describes (one per process)."""
    global _broker
    with _lock:
        if _broker is None:
            _broker = new_broker()
        return _broker


def new_broker() -> Broker:
    """A broker the ``SQLMQ`` setting describes, on the Django database's URL by default."""
    c = config()
    return Broker(c.url if c.url is not None else database_url(c.database),
                  table_prefix=c.table_prefix)


def reset() -> None:
    """Forget the process's broker (the settings changed), releasing its connections."""
    global _broker
    with _lock:
        old, _broker = _broker, None
    if old is not None:
        portal.call(old.close)


__all__ = ["broker", "new_broker", "reset"]
