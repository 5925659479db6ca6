"""What a broker offers operators beside publishing and consuming: topics' consumer groups,
channel settings, cancellation and statistics, all read from and written to the database (a mixin of
:class:`sqlmq.broker.Broker`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .channels import ChannelInfo, ChannelSettings, check_channel
from .dead_letters import DeadLetter, DeadLetterHook, DeadLetters
from .errors import ConfigurationError, UnknownGroup
from .insights import Insights
from .records import Cancellation, QueueStats
from .subscriber import check_queue
from .topics import TopicGroup

if TYPE_CHECKING:
    from .engines.contract import Engine
    from .results.watch import ResultWatch
    from .runtime import SubscriberRuntime


class Administration:
    """Groups, cancellation and statistics of a :class:`~sqlmq.broker.Broker`."""

    if TYPE_CHECKING:
        _engine: Engine
        _runtimes: list[SubscriberRuntime]
        _dead_letters: DeadLetters
        _results: ResultWatch

    # ---- topics --------------------------------------------------------------------------

    async def join_group(self, topic: str, group: str) -> TopicGroup:
        """Make the consumer ``group`` of ``topic`` (a pattern) if it does not exist: from
        now on every publish to a matching topic leaves a copy in its queue. Subscribers
        made with ``topic=`` and ``group=`` join theirs when the broker starts."""
        return await self._engine.join_group(topic, group)

    async def delete_group(self, topic: str, group: str) -> int:
        """Delete the consumer ``group`` of ``topic`` and the copies waiting or running in
        its queue (returns how many; the archive keeps its history). Unknown groups are an
        :class:`UnknownGroup` error naming the groups that exist."""
        removed = await self._engine.delete_group(topic, group)
        if removed is None:
            known = ", ".join(f"{g.group!r} of {g.pattern!r}"
                              for g in await self._engine.topic_groups()) or "none"
            raise UnknownGroup(f"no consumer group {group!r} of topic {topic!r} (groups: "
                               f"{known})")
        return removed

    async def groups(self) -> list[TopicGroup]:
        """Every consumer group of every topic, from the database."""
        return await self._engine.topic_groups()

    # ---- channels (see sqlmq.channels) --------------------------------------------------

    async def set_channel(self, name: str, *, max_concurrency: int | None = None,
                          rate: float | None = None, ordered: bool = False,
                          max_size: int | None = None, queue: str | None = None) -> None:
        """Give channel ``name`` its own limits, for every process and host at once (None:
        no limit of that kind). ``queue``: the queue whose default it would take without
        them, if the channel does not exist yet (its first publish's queue otherwise)."""
        settings = ChannelSettings(max_concurrency, rate, ordered, max_size)
        await self._engine.set_channel(check_channel(name),
                                       None if queue is None else check_queue(queue), settings)

    async def reset_channel(self, name: str) -> None:
        """Take channel ``name``'s own limits away: it takes its queue's default again."""
        if not await self._engine.set_channel(check_channel(name), None, None):
            raise ConfigurationError(f"no channel named {name!r}")

    async def set_channel_default(self, queue: str, *, max_concurrency: int | None = None,
                                  rate: float | None = None, ordered: bool = False,
                                  max_size: int | None = None) -> None:
        """The limits of ``queue``'s channels that have none of their own."""
        await self._engine.set_channel_default(
            check_queue(queue), ChannelSettings(max_concurrency, rate, ordered, max_size))

    async def reset_channel_default(self, queue: str) -> None:
        await self._engine.set_channel_default(check_queue(queue), None)

    async def channels(self) -> list[ChannelInfo]:
        """Every channel: its settings, its effective limits, what waits and runs in it."""
        return await self._engine.channels()

    async def channel_defaults(self) -> dict[str, ChannelSettings]:
        return await self._engine.channel_defaults()

    # ---- cancellation --------------------------------------------------------------------

    async def cancel(self, msg_id: int) -> Cancellation:
        """Cancel message ``msg_id``. Waiting (pending, retrying, delayed or deferred): it is
        archived CANCELLED and never delivered. Running: it is flagged; its handler sees
        ``msg.cancel_requested`` (at once in this process, within a third of its lease in
        others) and may stop early, and its result is archived CANCELLED unless it
        succeeds. Ended already, or no such message: the answer says so and nothing
        changes. The :class:`~sqlmq.records.Cancellation` returned tells which."""
        found = await self._engine.cancel(int(msg_id))
        if found.outcome == "requested":
            for runtime in self._runtimes:  # a delivery this process holds sees it now
                runtime.cancel_requested(found.id)
        elif found.outcome == "cancelled":  # archived CANCELLED now: a dead letter
            self._results.ended([found.id])  # a caller here may wait for it
            view = await self._engine.message_view(found.id)
            if view is not None:
                self._dead_letters.report(DeadLetter(view.id, view.queue, view.state,
                                                     view.error, view.deliveries, view.headers))
        return found

    # ---- dead letters (see sqlmq.dead_letters) ---------------------------------------------

    def on_dead_letter(self, hook: DeadLetterHook) -> DeadLetterHook:
        """Call ``hook`` (a function or a coroutine function, as a decorator) with a
        :class:`~sqlmq.dead_letters.DeadLetter` for every message this process archives
        FAILED or CANCELLED, after the database accepted it. Every dead letter is also
        logged as one WARNING line, hooks or not."""
        self._dead_letters.hooks.append(hook)
        return hook

    # ---- insights ------------------------------------------------------------------------

    async def stats(self) -> list[QueueStats]:
        return await self._engine.stats()

    def insights(self) -> Insights:
        """The read-only views the CLI, the dashboard and the metrics share: queue
        overviews with rates and latency, one queue in detail, a message by id, the
        archive searched and paginated (see :mod:`sqlmq.insights`)."""
        return Insights(self._engine)


__all__ = ["Administration"]
