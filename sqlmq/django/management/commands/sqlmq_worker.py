"""``manage.py sqlmq_worker``: run the project's sqlmq subscribers and its tasks until
SIGTERM or SIGINT, then stop gracefully (running handlers finish, fetched messages go
back)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...brokers import new_broker
from ...subscribers import discover, register


class Command(BaseCommand):
    help = ("Run the sqlmq subscribers of the installed apps' subscribers modules and "
            "SQLMQ['SUBSCRIBERS'], and the tasks of the sqlmq task backends, until SIGTERM.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", action="append", dest="queues", metavar="NAME",
                            help="run only these task queues (repeatable; default: each "
                                 "backend's QUEUES)")
        parser.add_argument("--backend", action="append", dest="backends", metavar="ALIAS",
                            help="run the tasks of these TASKS backends only (repeatable; "
                                 "default: every sqlmq backend)")
        parser.add_argument("--no-subscribers", action="store_true",
                            help="run tasks only, not the @subscriber handlers")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verbosity"] > 0:
            _log_to_stderr(logging.DEBUG if options["verbosity"] > 2 else logging.INFO)
        broker = new_broker()
        count = 0
        if not options["no_subscribers"]:
            discover()
            count += register(broker)
        try:
            count += _register_tasks(broker, options["backends"], options["queues"])
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        if not count:
            raise CommandError("nothing to run: no @sqlmq.django.subscriber handler in the "
                               "installed apps' subscribers modules or SQLMQ['SUBSCRIBERS'], "
                               "and no sqlmq.django.TaskBackend in TASKS")
        asyncio.run(broker.run())


def _register_tasks(broker: Any, aliases: list[str] | None, queues: list[str] | None) -> int:
    """Subscribe ``broker`` to the task queues of the sqlmq task backends."""
    try:
        from ...tasks.backend import sqlmq_backends
    except ImportError:  # no Tasks framework installed: subscribers only
        if aliases or queues:
            raise ImproperlyConfigured("--backend and --queue run tasks, and neither Django "
                                       "6's django.tasks nor django-tasks is installed") from None
        return 0
    from ...tasks.running import run_task

    count = 0
    for backend in sqlmq_backends(aliases):
        names = sorted(backend.queues)
        if queues:
            unknown = sorted(set(queues) - backend.queues)
            if unknown:
                raise ImproperlyConfigured(
                    f"task backend {backend.alias!r} has no queue {', '.join(unknown)}: its "
                    f"QUEUES are {', '.join(names) or 'not listed'}")
            names = sorted(queues)
        if not names:
            raise ImproperlyConfigured(
                f"task backend {backend.alias!r} lists no QUEUES (any name is accepted), so "
                "the worker cannot tell which to run: list them, or pass --queue")
        broker.subscriber([backend.queue(n) for n in names], **backend.subscription())(run_task)
        count += 1
    return count


def _log_to_stderr(level: int) -> None:
    """sqlmq's log lines (start, drain, stop, failures) on stderr, unless LOGGING already
    sends them somewhere."""
    log = logging.getLogger("sqlmq")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(level)
