"""``sqlmq inbox``: take a far broker's messages (RabbitMQ, NATS JetStream, Redis Streams)
into a sqlmq queue exactly once, until SIGINT/SIGTERM (see :mod:`sqlmq.relay.inbox`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from datetime import timedelta

import click

from ..broker import Broker
from .common import Duration, PositiveInt, database


@click.command("inbox")
@click.argument("queue")
@click.option("--from", "source", required=True, metavar="URL",
              help="the far broker: amqp://user:password@host:5672/vhost, nats://host:4222, "
                   "redis://host:6379/0")
@click.option("--queue-name", help="RabbitMQ: the queue to consume")
@click.option("--stream", help="JetStream: the stream; Redis: the stream's key")
@click.option("--subject", help="JetStream: take only these subjects of the stream")
@click.option("--group", help="JetStream: the durable consumer; Redis: the consumer group "
                              "(default: sqlmq-QUEUE)")
@click.option("--consumer", help="Redis: this process's name in the group (default: "
                                 "host-pid)")
@click.option("--key-header", help="read each message's key from this header (a Redis field) "
                                   "instead of the far broker's message id")
@click.option("--name", help="the source's name in the inbox's ledger (default: where it "
                             "reads, e.g. rabbitmq:QUEUE_NAME)")
@click.option("--channel", help="publish into this sqlmq channel")
@click.option("--batch", type=PositiveInt(), default=500, show_default=True,
              help="messages per database transaction")
@click.option("--prefetch", type=PositiveInt(), default=None,
              help="messages the far broker may hand over unacknowledged (default: 2 x batch)")
@click.option("--retention", type=Duration("d"), default="7d", show_default=True,
              help="how long the ledger remembers a key: a far message delivered again later "
                   "than that is taken again")
@click.option("--claim-idle", type=Duration("s"), default="60s", show_default=True,
              help="Redis: claim entries pending this long with a consumer that died")
@click.option("--allow-keyless", is_flag=True,
              help="take messages without a key (at least once) instead of refusing them")
@database
async def inbox(broker: Broker, queue: str, source: str, queue_name: str | None,
                stream: str | None, subject: str | None, group: str | None,
                consumer: str | None, key_header: str | None, name: str | None,
                channel: str | None, batch: int, prefetch: int | None, retention: timedelta,
                claim_idle: timedelta, allow_keyless: bool) -> int:
    """Take the messages of a far broker into QUEUE exactly once: each batch is committed
    to the database with a ledger row per message before the far broker gets its
    acknowledgements, and a message it delivers again is found in the ledger and only
    acknowledged. Runs until SIGINT/SIGTERM, then finishes the batch in hand."""
    from ..relay.inbox import Inbox

    taker = Inbox(broker, queue, source=source, queue_name=queue_name, stream=stream,
                  subject=subject, group=group, consumer=consumer, key_header=key_header,
                  name=name, channel=channel, batch=batch, prefetch=prefetch,
                  retention=retention, claim_idle=claim_idle.total_seconds(),
                  require_key=not allow_keyless)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await taker.run(stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    c = taker.counts
    print(f"inbox into {queue}: {c.taken} taken, {c.duplicates} delivered again, "
          f"{c.refused} refused")
    return 0


__all__ = ["inbox"]
