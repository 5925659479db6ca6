"""The inbox from a Redis stream (redis-py asyncio): a consumer group read with XREADGROUP
and acknowledged with XACK, made (from the stream's start) if it does not exist. An entry's
key is its id, its body the field ``body`` and its other fields the headers; an entry
without a ``body`` field becomes a JSON object of all its fields.

An entry read but not acknowledged stays pending with the consumer that read it. This
consumer first reads its own pending entries again (a restart under the same name), then
claims, every ``claim_idle / 2`` seconds, those idle with other consumers for
``claim_idle`` seconds or more (XAUTOCLAIM): the entries of a consumer that died.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import from_url

from ...errors import ConfigurationError
from ..source import FarMessage, SourceOptions, SourceUnavailable, text_headers
from ..urls import BrokerURL
from . import describe

log = logging.getLogger("sqlmq")

#: The field holding an entry's body.
BODY_FIELD = "body"


class RedisStreamSource:
    """Consumes stream ``options.stream`` as ``options.consumer`` of group
    ``options.group``."""

    def __init__(self, url: BrokerURL, options: SourceOptions) -> None:
        if not options.stream:
            raise ConfigurationError(f"the inbox from Redis ({url.safe}) needs the stream to "
                                    "consume: stream= (sqlmq inbox --stream)")
        self.url = url
        self.options = options
        self.stream = options.stream
        self.group = options.group or "sqlmq-inbox"
        self.consumer = options.consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.shown = (f"Redis stream {self.stream!r} (group {self.group!r}, consumer "
                      f"{self.consumer!r}) at {url.safe}")
        self._client: Any = None
        self._own = "0"  # where re-reading this consumer's own pending entries is; None: done
        self._claim_from: str | None = "0-0"  # where the claim pass is; None: between passes
        self._next_claim = 0.0

    async def open(self) -> str:
        self._client = from_url(self.url.url, socket_connect_timeout=
                                      self.options.connect_timeout)
        try:
            await self._client.ping()
            await self._client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis_errors.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                await self.close()
                raise SourceUnavailable(f"Redis at {self.url.safe} refused the consumer "
                                        f"group {self.group!r}: {exc}") from None
        except (OSError, redis_errors.RedisError) as exc:
            await self.close()
            raise SourceUnavailable(f"cannot connect to Redis at {self.url.safe}: "
                                    f"{describe(exc)}") from None
        self._own, self._claim_from, self._next_claim = "0", "0-0", 0.0
        return f"redis:{self.url.path or '0'}/{self.stream}/{self.group}"

    async def fetch(self, limit: int, wait: float) -> list[FarMessage]:
        if self._own is not None:
            entries = await self._read(self._own, limit, None)
            if entries:
                self._own = entries[-1][0]
                return await self._far(entries)
            self._own = None
        claimed = await self._claim(limit)
        if claimed:
            return claimed
        return await self._far(await self._read(">", limit, max(1, int(wait * 1000))))

    async def _read(self, after: str, limit: int, block_ms: int | None) -> list[Any]:
        got = await self._client.xreadgroup(self.group, self.consumer, {self.stream: after},
                                            count=limit, block=block_ms)
        if not got:
            return []
        if isinstance(got, dict):  # RESP3
            return list(next(iter(got.values()))[0])
        return list(got[0][1])

    async def _claim(self, limit: int) -> list[FarMessage]:
        """The next entries idle with other consumers, while a claim pass runs."""
        now = time.monotonic()
        if self._claim_from is None:
            if now < self._next_claim:
                return []
            self._claim_from = "0-0"
        idle_ms = int(self.options.claim_idle * 1000)
        cursor, entries, *_ = await self._client.xautoclaim(
            self.stream, self.group, self.consumer, idle_ms, start_id=self._claim_from,
            count=limit)
        cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
        if cursor in ("0-0", "0"):
            self._claim_from = None
            self._next_claim = now + max(0.5, self.options.claim_idle / 2)
        else:
            self._claim_from = cursor
        if entries:
            log.info("inbox from %s: claimed %d pending entries idle for %gs or more",
                     self.shown, len(entries), self.options.claim_idle)
        return await self._far(entries)

    async def _far(self, entries: list[Any]) -> list[FarMessage]:
        out, gone = [], []
        for entry_id, fields in entries:
            entry_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            if not fields:  # deleted from the stream while pending: nothing to take
                gone.append(entry_id)
                continue
            body = fields.get(BODY_FIELD.encode(), fields.get(BODY_FIELD))
            headers = text_headers({k: v for k, v in fields.items()
                                    if k not in (BODY_FIELD, BODY_FIELD.encode())})
            if body is None:
                body = json.dumps(headers, ensure_ascii=False).encode()
                headers = {"content-type": "application/json"}
            if isinstance(body, str):
                body = body.encode()
            header = self.options.key_header
            key = entry_id if header is None else text_headers(
                {"k": fields.get(header.encode(), fields.get(header))}).get("k")
            out.append(FarMessage(key=key or None, body=body, headers=headers,
                                  handle=entry_id))
        if gone:
            await self._client.xack(self.stream, self.group, *gone)
        return out

    async def ack(self, messages: Sequence[FarMessage]) -> None:
        if messages:
            await self._client.xack(self.stream, self.group, *[m.handle for m in messages])

    async def refuse(self, message: FarMessage, reason: str) -> None:
        # Redis has no dead letters: acknowledged, the entry stays in the stream to be read
        await self._client.xack(self.stream, self.group, message.handle)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception:  # already broken: nothing to release
                pass


__all__ = ["BODY_FIELD", "RedisStreamSource"]
