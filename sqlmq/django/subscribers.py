"""Handlers for ``manage.py sqlmq_worker``, declared where a Django project keeps its code.

A module cannot decorate with the worker's broker, made only when the worker starts, so
:func:`subscriber` records the handler and its options, and the worker registers them on its
broker once it has imported every installed app's ``subscribers`` module (as the admin
discovers ``admin.py``) and the modules ``SQLMQ["SUBSCRIBERS"]`` lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from ..broker import Broker
from .config import config


@dataclass(frozen=True)
class Declared:
    """A handler and the options its ``@subscriber`` was given."""

    queues: Any
    options: dict[str, Any]
    handler: Callable[..., Any]


_declared: list[Declared] = []


def subscriber(queues: str | list[str] | None = None,
               **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a handler for ``manage.py sqlmq_worker``: the arguments are
    :meth:`Broker.subscriber <sqlmq.Broker.subscriber>`'s."""

    def declare(handler: Callable[..., Any]) -> Callable[..., Any]:
        _declared.append(Declared(queues, options, handler))
        return handler

    return declare


def discover() -> None:
    """Import each installed app's ``subscribers`` module and ``SQLMQ["SUBSCRIBERS"]``."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("subscribers")
    for module in config().subscribers:
        import_module(module)


def register(broker: Broker) -> int:
    """Register the declared handlers on ``broker``; how many there were."""
    for d in _declared:
        broker.subscriber(d.queues, **d.options)(d.handler)
    return len(_declared)


__all__ = ["discover", "register", "subscriber"]
