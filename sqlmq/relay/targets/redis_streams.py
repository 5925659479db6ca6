"""Redis Streams through redis-py's asyncio client: every message is an XADD to its stream,
and a send returns once Redis answered with the entry's id. The sends waiting at any moment
go together in one pipeline (one round trip), so many messages in flight cost few.

An entry's fields: ``body`` (the payload's bytes), ``headers`` (the message's headers as a
JSON object, its content type among them), ``sqlmq-id`` and ``sqlmq-published-at``. Redis
has no deduplication of its own: a consumer that must see a message once skips the
``sqlmq-id`` values it has seen (a message is sent again only after a crash or a lost reply).
Redis confirms once the entry is in its memory; how durable that is is its persistence
settings' business (``appendonly``/``appendfsync``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..envelope import ID_HEADER, PUBLISHED_AT_HEADER, Envelope
from ..urls import BrokerURL

#: The most XADDs one pipeline carries; the rest wait for the next.
MAX_PIPELINE = 1000


class RedisStreamTarget:
    """Appends to ``stream`` (the queue's name unless given). An error of Redis's (a key
    of another type, out of memory) is a failed attempt: the message waits."""

    OPTIONS = ("stream",)

    def __init__(self, url: BrokerURL, *, stream: str | None = None,
                 confirm_timeout: float = 10.0) -> None:
        self.url = url
        self.name = f"Redis at {url.safe}"
        self.stream = stream
        self.confirm_timeout = confirm_timeout
        self._redis: redis.asyncio.Redis | None = None
        self._broken = False
        self._waiting: list[tuple[Envelope, asyncio.Future[bool]]] = []
        self._pipelines: asyncio.Task[None] | None = None

    async def open(self) -> None:
        u = self.url
        db = u.path.strip("/") or "0"
        if not db.isdigit():
            raise ValueError(f"the path of a redis:// URL is a database number, not {db!r}")
        # No retries of redis-py's own: a failed send is a failed attempt of the relay's.
        self._redis = redis.asyncio.Redis(
            host=u.host, port=u.port, db=int(db), username=u.username, password=u.password,
            ssl=u.tls, socket_timeout=self.confirm_timeout,
            socket_connect_timeout=self.confirm_timeout, retry=Retry(NoBackoff(), 0))
        self._broken = False
        await self._redis.ping()

    def is_open(self) -> bool:
        return self._redis is not None and not self._broken

    async def send(self, envelope: Envelope) -> bool:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((envelope, done))
        if self._pipelines is None or self._pipelines.done():
            self._pipelines = asyncio.create_task(self._send_waiting())
        return await done

    async def _send_waiting(self) -> None:
        """Send what waits in pipelines, one at a time, until nothing waits: the sends made
        during one pipeline's round trip go in the next."""
        while self._waiting and self._redis is not None and not self._broken:
            batch, self._waiting = self._waiting[:MAX_PIPELINE], self._waiting[MAX_PIPELINE:]
            pipe = self._redis.pipeline(transaction=False)
            for envelope, _ in batch:
                pipe.xadd(envelope.route("stream", self.stream) or envelope.queue,
                          _fields(envelope))
            try:
                results: list[Any] = await pipe.execute(raise_on_error=False)
            except Exception as exc:  # the connection broke: every send of it failed
                self._broken = True
                _fail(batch, exc)
                break
            except BaseException:
                _fail(batch, ConnectionError(f"{self.name}: the pipeline was cancelled"))
                raise
            for (_, done), result in zip(batch, results, strict=True):
                if done.done():  # its handler was cancelled meanwhile
                    continue
                if isinstance(result, Exception):
                    done.set_exception(result)
                else:
                    done.set_result(False)
        if self._waiting and (self._redis is None or self._broken):
            waiting, self._waiting = self._waiting, []
            _fail(waiting, ConnectionError(f"{self.name}: the connection broke or was closed"))

    async def close(self) -> None:
        client, self._redis = self._redis, None
        if client is not None:
            try:
                await client.aclose()
            except Exception:  # already broken: nothing left to close
                pass


def _fields(envelope: Envelope) -> dict[str, Any]:
    return {"body": envelope.payload, "headers": json.dumps(envelope.headers),
            ID_HEADER: envelope.key, PUBLISHED_AT_HEADER: envelope.published_iso}


def _fail(sends: list[tuple[Envelope, asyncio.Future[bool]]], exc: Exception) -> None:
    """Fail each send with an exception of its own (one object raised in many tasks at once
    would collect all their tracebacks)."""
    for _, done in sends:
        if not done.done():
            done.set_exception(ConnectionError(f"{type(exc).__name__}: {exc}"))


__all__ = ["RedisStreamTarget"]
