"""``sqlmq dlq`` (dead letters: list, show, requeue, purge, watch) and ``sqlmq purge``
(archive retention). Long operations move rows in batches of one transaction each, with a
progress bar, and an interrupt leaves whole batches done (see :func:`.common.in_batches`)."""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime, timedelta

import click

from ..backoff import Backoff
from ..broker import Broker
from ..dead_letters import DeadLetterNotice
from ..errors import SqlmqError
from ..lifecycle import State
from ..records import QueueStats
from ..views import ARCHIVED_STATES, DEAD_STATES, ArchiveQuery, MessageView
from .common import (
    Duration,
    PositiveInt,
    UsageError,
    database,
    in_batches,
    json_option,
    one_line,
    print_json,
)
from .messages import print_message

#: ``--state`` of the dlq commands: which dead letters.
_DEAD = {"failed": (State.FAILED.value,), "cancelled": (State.CANCELLED.value,),
         "all": DEAD_STATES}


def _state_option(fn):  # type: ignore[no-untyped-def]
    return click.option("--state", type=click.Choice(sorted(_DEAD)), default="failed",
                        show_default=True, help="FAILED, CANCELLED or both")(fn)


@click.group("dlq")
def dlq() -> None:
    """Dead letters: messages archived FAILED (or CANCELLED, with --state)."""


@dlq.command("list")
@click.option("--queue")
@click.option("--error", "error_contains", metavar="TEXT", help="errors containing TEXT")
@click.option("--limit", type=PositiveInt(), default=50, show_default=True)
@_state_option
@json_option
@database
async def dlq_list(broker: Broker, queue: str | None, error_contains: str | None, limit: int,
                   state: str, as_json: bool) -> int:
    """The newest dead letters, one per line (errors escaped onto it; --json in full)."""
    await broker.check_schema()
    page = await broker.insights().archive(ArchiveQuery(
        queue=queue, states=_DEAD[state], error_contains=error_contains, limit=limit))
    if as_json:
        print_json([{"id": v.id, "queue": v.queue, "state": v.state,
                     "deliveries": v.deliveries, "attempts": v.attempts,
                     "archived_at": v.archived_at and v.archived_at.isoformat(),
                     "error": v.error} for v in page.items])
        return 0
    for v in page.items:
        print(_line(v))
    print(f"{len(page.items)} dead letter(s) shown", file=sys.stderr)
    return 0


def _line(v: MessageView) -> str:
    assert v.archived_at is not None
    return (f"{v.id}\t{v.queue}\tdeliveries={v.deliveries}\tattempts={v.attempts}\t"
            f"{v.archived_at.isoformat(timespec='seconds')}\t{one_line(v.error or '')[:120]}")


@dlq.command("show")
@click.argument("msg_id", metavar="ID", type=int)
@json_option
@database
async def dlq_show(broker: Broker, msg_id: int, as_json: bool) -> int:
    """One dead letter: payload, headers, error and delivery history."""
    await broker.check_schema()
    view = await broker.insights().message(msg_id)
    if view is None:
        raise SqlmqError(f"no dead letter with id {msg_id}")
    if view.state not in DEAD_STATES:
        raise SqlmqError(f"message {msg_id} is {view.state}, not a dead letter (see sqlmq "
                         f"show {msg_id})")
    print_message(view, as_json)
    return 0


@dlq.command("requeue")
@click.option("--queue")
@click.option("--id", "ids", type=int, multiple=True, help="this dead letter (repeatable)")
@_state_option
@database
async def dlq_requeue(broker: Broker, queue: str | None, ids: tuple[int, ...],
                      state: str) -> int:
    """Back to their queue as fresh messages (id, payload, headers and history kept), in
    batches."""
    if not queue and not ids:
        raise UsageError("dlq requeue needs --queue or --id (refusing to requeue everything)")
    await broker.check_schema()
    states = _DEAD[state]
    if ids:
        found = {v.id for v in [await broker.insights().message(i) for i in ids]
                 if v is not None and v.state in states and (not queue or v.queue == queue)}
        missing = sorted(set(ids) - found)
        if missing:
            where = f" in queue {queue!r}" if queue else ""
            raise SqlmqError(f"no dead letter with id {', '.join(map(str, missing))}{where}; "
                             "nothing requeued (see sqlmq dlq list)")
    stats = await broker.stats()
    total = await in_batches(
        "requeued", sum(_count(stats, queue, s) for s in states),
        lambda progress: broker.requeue(ids=list(ids) or None, queue=queue, states=states,
                                        progress=progress))
    print(f"requeued {total} message(s)")
    return 0


@dlq.command("purge")
@click.option("--queue")
@click.option("--older-than", type=Duration("d"), default=None, metavar="DURATION",
              help="archived longer ago than this (7d, 12h; a bare number is days)")
@click.option("--all", "everything", is_flag=True, help="every dead letter of every queue")
@click.option("--yes", is_flag=True, help="confirm --all")
@_state_option
@database
async def dlq_purge(broker: Broker, queue: str | None, older_than: timedelta | None,
                    everything: bool, yes: bool, state: str) -> int:
    """Delete dead letters: needs --queue and/or --older-than, or --all --yes."""
    filtered = queue is not None or older_than is not None
    if everything and filtered:
        raise UsageError("dlq purge: --all means every dead letter; drop --queue/--older-than")
    if not filtered and not everything:
        raise UsageError("dlq purge needs --queue and/or --older-than DAYS, or --all --yes to "
                         "delete every dead letter of every queue")
    if everything and not yes:
        raise UsageError("dlq purge --all deletes every dead letter of every queue: add --yes "
                         "to confirm")
    await broker.check_schema()
    n = await _purge(broker, queue, _DEAD[state], older_than)
    print(f"purged {n} {'failed' if state == 'failed' else 'dead'} message(s)")
    return 0


#: How far before the newest dead letter printed ``dlq watch`` looks again.
_WATCH_MARGIN = timedelta(minutes=1)


@dlq.command("watch")
@click.option("--queue")
@click.option("--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="seconds between looks at the archive")
@click.option("--since", type=Duration("s"), default=None, metavar="DURATION",
              help="also print those archived this long before the start (15m, 2h, 1d)")
@json_option
@database
async def dlq_watch(broker: Broker, queue: str | None, interval: float,
                    since: timedelta | None, as_json: bool) -> int:
    """Print each dead letter (FAILED or CANCELLED) archived after the start, as it is
    archived, until Ctrl-C (with --since, those of that long before the start first).

    On PostgreSQL it follows the dead-letter NOTIFY, printing each at once, and still looks
    at the archive every --interval seconds and after every reconnect (a notification sent
    while its connection was down is lost). Elsewhere it looks at the archive every
    --interval seconds."""
    await broker.check_schema()
    start = await broker.engine.now()
    watch = _Watch(broker, queue, as_json, start if since is None else start - since)
    await watch.skip_archived(everything=since is None)
    # A notice of a dead letter, or None: the listening connection (re)connected.
    events: asyncio.Queue[DeadLetterNotice | None] = asyncio.Queue()
    source = broker.engine.dead_letter_source(events.put_nowait,
                                              lambda: events.put_nowait(None))
    how = (f"polling every {interval:g}s" if source is None else
           f"following NOTIFY on channel {source.channel} (and scanning every {interval:g}s)")
    print(f"watching {broker.url} for dead letters, {how} (Ctrl-C stops)", file=sys.stderr)
    loop = asyncio.get_running_loop()
    backoff = Backoff("dlq watch: reading the archive", base=0.5, cap=30.0)
    getter: asyncio.Future[DeadLetterNotice | None] | None = None
    if source is not None:
        source.start()
    try:
        scan_at = loop.time()  # the first look at once
        connects = reconnected = 0
        while True:
            notice: DeadLetterNotice | None = None
            wait = scan_at - loop.time()
            if wait > 0:
                # one get() kept across timeouts, so that no event is lost to a cancel
                getter = getter or asyncio.ensure_future(events.get())
                await asyncio.wait([getter], timeout=wait)
                if not getter.done():
                    continue
                notice, getter = getter.result(), None
                if notice is None:  # (re)connected: look at the archive now
                    reconnected += 1
            try:
                if notice is not None:
                    await watch.notified(notice)
                    continue
                await watch.scan()
            except Exception as exc:
                # The archive is out of reach for now (a restart, a failover): said once,
                # and looked at again until it answers; that look finds what was missed.
                await backoff.failed(exc)
                scan_at = loop.time()
                continue
            backoff.succeeded()
            scan_at = loop.time() + interval
            while reconnected and source is not None:
                reconnected -= 1
                connects += 1
                print(f"listening on channel {source.channel}" + (
                    " again; looked at the archive for what was missed" if connects > 1
                    else ""), file=sys.stderr)
                sys.stderr.flush()
    finally:
        if getter is not None:
            getter.cancel()
        if source is not None:
            await source.stop()


class _Watch:
    """What ``dlq watch`` printed, and how it prints: each dead letter once, whether a
    notification or a look at the archive found it first."""

    def __init__(self, broker: Broker, queue: str | None, as_json: bool,
                 since: datetime) -> None:
        self.broker = broker
        self.queue = queue
        self.as_json = as_json
        self.since = since  # the newest archive time printed (or the start)
        # Printed or skipped, by (id, archive time): a requeued message that dies again is a
        # new dead letter. Forgotten past the margin.
        self.seen: dict[tuple[int, datetime | None], datetime] = {}

    async def skip_archived(self, everything: bool) -> None:
        """Before the first look: the dead letters the archive holds already (all of them,
        or those archived before ``since``) count as seen, so the margin never prints one
        archived before the start, and one committed from now on, whatever its time, is
        printed, as it is not among them."""
        for v in await self._unseen():
            assert v.archived_at is not None
            if everything or v.archived_at < self.since:
                self.seen[v.id, v.archived_at] = v.archived_at

    async def scan(self) -> None:
        for v in reversed(await self._unseen()):
            self._print(v)
        self.seen = {k: at for k, at in self.seen.items() if at >= self.since - _WATCH_MARGIN}

    async def _unseen(self) -> list[MessageView]:
        # A row archived by a transaction that began before ``since`` and committed after
        # it carries an earlier time: the margin catches those committed within a minute.
        # The rows since then are read newest first, page after page.
        insights = self.broker.insights()
        fresh: list[MessageView] = []
        page = await insights.archive(ArchiveQuery(
            queue=self.queue, states=DEAD_STATES, archived_from=self.since - _WATCH_MARGIN,
            limit=1000))
        while True:
            fresh += [v for v in page.items if (v.id, v.archived_at) not in self.seen]
            if page.next is None:
                return fresh
            page = await insights.archive(page.next)

    async def notified(self, notice: DeadLetterNotice) -> None:
        """A dead letter's notification: printed as a look at the archive would print it;
        one the archive does not hold (a subscriber that keeps no dead letters, or requeued
        or purged since) from the notification alone."""
        if self.queue is not None and notice.queue != self.queue:
            return
        view = await self.broker.insights().message(notice.id)
        if view is not None and view.state in DEAD_STATES and view.archived_at is not None:
            if (view.id, view.archived_at) not in self.seen:  # a scan may have printed it
                self._print(view)
            return
        if (notice.id, None) in self.seen:
            return
        self.seen[notice.id, None] = self.since
        if self.as_json:
            print_json({"id": notice.id, "queue": notice.queue, "state": notice.state,
                        "archived_at": None, "in_archive": False})
        else:
            print(f"{notice.state}\t{notice.id}\t{notice.queue}\t(not in the archive)")
        sys.stdout.flush()

    def _print(self, v: MessageView) -> None:
        assert v.archived_at is not None
        self.seen[v.id, v.archived_at] = v.archived_at
        self.since = max(self.since, v.archived_at)
        if self.as_json:
            print_json(v.to_json())
        else:
            print(f"{v.state}\t{_line(v)}")
        sys.stdout.flush()


@click.command("purge")
@click.option("--older-than", type=Duration("d"), required=True, metavar="DURATION",
              help="archived longer ago than this: 90m, 12h, 7d, 2w")
@click.option("--queue")
@click.option("--state", type=click.Choice(["all", *(s.lower() for s in ARCHIVED_STATES)]),
              default="all", show_default=True)
@database
async def purge(broker: Broker, older_than: timedelta, queue: str | None, state: str) -> int:
    """Delete archived messages older than a duration, in batches (retention by hand)."""
    await broker.check_schema()
    states = ARCHIVED_STATES if state == "all" else (state.upper(),)
    n = await _purge(broker, queue, states, older_than)
    print(f"purged {n} archived message(s)")
    return 0


async def _purge(broker: Broker, queue: str | None, states: tuple[str, ...],
                 older_than: timedelta | None) -> int:
    stats = await broker.stats()
    return await in_batches(
        "purged", sum(_count(stats, queue, s) for s in states),
        lambda progress: broker.purge(older_than=older_than, queue=queue, states=states,
                                      progress=progress))


def _count(stats: list[QueueStats], queue: str | None, state: str) -> int:
    """How many archived messages of ``state`` (in ``queue``): the progress bar's total."""
    return sum(getattr(s, state.lower()) for s in stats
               if queue is None or s.queue == queue)


__all__ = ["dlq", "purge"]
