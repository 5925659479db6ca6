"""NATS JetStream through nats-py: one connection for every send of a relay, each message
published with ``js.publish``, which returns once the stream stored it (its PubAck).

The sqlmq id is the ``Nats-Msg-Id`` header: JetStream drops a message whose id it has seen
within the stream's duplicate window (two minutes by default), so a message sent again
after a crash of the relay is stored once. The id is also in ``sqlmq-id``, the publish time
in ``sqlmq-published-at``. Sends use ``publish_async``: their PubAcks are awaited
together through one reply subscription. nats-py trims the whitespace around header values and turns
their newlines into spaces.
"""

from __future__ import annotations

import asyncio
from collections import deque

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck

from ..envelope import Envelope
from ..target import Refused
from ..urls import BrokerURL

#: Seconds between two looks for PubAcks later than the relay's ``confirm_timeout``.
SWEEP_EVERY = 0.25
#: JetStream's error code for a message over its stream's ``max_msg_size``.
MESSAGE_TOO_LARGE = 10054
#: What each header adds to a message's size on the wire besides its name and value
#: (": " and CRLF), and what the headers block adds once ("NATS/1.0" and two CRLFs).
_PER_HEADER, _HEADERS_BLOCK = 4, 12


class NoStream(Exception):
    """No stream answered for the subject: a failed attempt (one may be made later)."""


class JetStreamTarget:
    """Publishes to ``subject`` (the queue's name unless given), which a stream must
    capture: with no stream on it, a send is a failed attempt (the message waits)."""

    OPTIONS = ("subject",)

    def __init__(self, url: BrokerURL, *, subject: str | None = None,
                 confirm_timeout: float = 10.0) -> None:
        self.url = url
        self.name = f"NATS JetStream at {url.safe}"
        self.subject = subject
        self.confirm_timeout = confirm_timeout
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        #: Each PubAck awaited, with the moment it is given up for: one task fails the late
        #: ones, where a timer per send (``asyncio.wait_for``) cost a fifth of a send's CPU.
        self._deadlines: deque[tuple[float, asyncio.Future[PubAck]]] = deque()
        self._sweeper: asyncio.Task[None] | None = None

    async def open(self) -> None:
        u = self.url
        scheme = "tls" if u.tls else "nats"
        # No reconnection of nats-py's own: the relay's link opens a new connection, spaced
        # and logged once per outage; and no callbacks that log each failed attempt.
        self._nc = await nats.connect(
            servers=[f"{scheme}://{host}:{port}" for host, port in u.hosts],
            user=u.username, password=u.password, allow_reconnect=False,
            connect_timeout=max(1, round(self.confirm_timeout)),
            error_cb=_quiet, disconnected_cb=_nothing, closed_cb=_nothing)
        self._js = self._nc.jetstream(timeout=self.confirm_timeout)

    def is_open(self) -> bool:
        nc = self._nc
        return nc is not None and nc.is_connected

    async def send(self, envelope: Envelope) -> bool:
        assert self._nc is not None and self._js is not None
        subject = envelope.route("subject", self.subject) or envelope.queue
        headers = envelope.id_headers()
        headers["Nats-Msg-Id"] = envelope.key
        size = len(envelope.payload) + _HEADERS_BLOCK + sum(
            len(k) + len(v) + _PER_HEADER for k, v in headers.items())
        limit = self._nc.max_payload
        if size > limit:  # the server would close the connection over it
            raise Refused(f"{size} bytes with its headers, over the NATS server's max_payload "
                          f"of {limit} bytes")
        try:
            pending = await self._js.publish_async(subject, envelope.payload, headers=headers)
            self._deadlines.append((asyncio.get_running_loop().time() + self.confirm_timeout,
                                    pending))
            if self._sweeper is None or self._sweeper.done():
                self._sweeper = asyncio.create_task(self._time_out())
            ack = await pending
        except (nats.errors.BadSubjectError, nats.errors.BadHeaderError) as exc:
            raise Refused(f"NATS cannot carry it: {type(exc).__name__} ({exc}); subject "
                          f"{subject!r}") from None
        except nats.js.errors.APIError as exc:
            if exc.err_code == MESSAGE_TOO_LARGE:
                raise Refused(f"{len(envelope.payload)} bytes: {exc.description}") from None
            raise
        except nats.js.errors.NoStreamResponseError:
            raise NoStream(f"no JetStream stream captures subject {subject!r}") from None
        return bool(ack.duplicate)

    async def _time_out(self) -> None:
        """Fail the sends whose PubAck is later than ``confirm_timeout`` (a failed attempt:
        the message goes again, and JetStream drops it if the first one was stored)."""
        loop = asyncio.get_running_loop()
        while self._deadlines:
            now = loop.time()
            while self._deadlines and self._deadlines[0][0] <= now:
                _, pending = self._deadlines.popleft()
                if not pending.done():
                    pending.set_exception(nats.errors.TimeoutError())
            while self._deadlines and self._deadlines[0][1].done():
                self._deadlines.popleft()
            await asyncio.sleep(SWEEP_EVERY)

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                await nc.close()
            except Exception:  # already broken: nothing left to close
                pass


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: the relay's outage log says what matters, once."""


async def _nothing() -> None:
    pass


__all__ = ["JetStreamTarget", "NoStream"]
