"""``sqlmq relay``: forward a queue's messages to RabbitMQ, NATS JetStream, Redis, MQTT or
Kafka, each archived only once the far broker confirmed it (see docs/relay.md)."""

from __future__ import annotations

import click

from ..broker import Broker
from .common import PositiveInt, database


@click.command("relay")
@click.argument("queue")
@click.option("--to", "to", required=True, metavar="URL",
              help="the far broker: amqp://, nats://, redis://, mqtt:// or kafka://")
@click.option("--exchange", default=None, help="RabbitMQ: the exchange (default: \"\")")
@click.option("--routing-key", default=None,
              help="RabbitMQ: the routing key (default: the queue's name)")
@click.option("--subject", default=None, help="NATS: the subject (default: the queue's name)")
@click.option("--stream", default=None, help="Redis: the stream (default: the queue's name)")
@click.option("--topic", default=None,
              help="MQTT, Kafka: the topic (default: the queue's name)")
@click.option("--id-prefix", default="", show_default=True,
              help="put before each message's id where it travels (relays of several "
                   "databases into one stream)")
@click.option("--workers", type=PositiveInt(), default=None,
              help="sends in flight at once (default: 256)")
@click.option("--lease", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="seconds a message is held before another process may take it")
@database
async def relay(broker: Broker, queue: str, to: str, exchange: str | None,
                routing_key: str | None, subject: str | None, stream: str | None,
                topic: str | None, id_prefix: str, workers: int | None, lease: float) -> int:
    """Forward the messages of QUEUE to the far broker at --to until SIGINT/SIGTERM; each
    is archived once that broker confirmed it, and waits in the database while it is down."""
    from ..relay import Relay
    from ..relay.relay import DEFAULT_WORKERS

    Relay(broker, queue, to=to, exchange=exchange, routing_key=routing_key, subject=subject,
          stream=stream, topic=topic, id_prefix=id_prefix,
          workers=workers or DEFAULT_WORKERS, lease=lease)
    await broker.run()  # logs start, signal, drain and stop; the relay its outages
    return 0


__all__ = ["relay"]
