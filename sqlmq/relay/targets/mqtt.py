"""MQTT 5 through aiomqtt: one connection for every send of a relay, each message published
at QoS 1, a send returning once the server's PUBACK came back with a success code.

The sqlmq id and publish time travel as MQTT 5 user properties ``sqlmq-id`` and
``sqlmq-published-at`` (with the message's own headers), the content type as the
``ContentType`` property. MQTT has no deduplication: QoS 1 is at least once, and a consumer
that must see a message once skips the ``sqlmq-id`` values it has seen. A server passes a
QoS 1 message to the subscribers it has (and to persistent sessions); one published to a
topic nobody subscribes to is confirmed all the same, and gone.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from ..envelope import Envelope
from ..target import Refused
from ..urls import BrokerURL

#: PUBACK reason codes that no retry can mend: the topic or the payload is not acceptable.
_NEVER = {0x90: "topic name invalid", 0x99: "payload format invalid"}
#: The most QoS 1 messages unconfirmed at once when the server names no Receive Maximum.
MAX_INFLIGHT = 1000


class _ConfirmingClient(aiomqtt.Client):
    """aiomqtt's client, keeping what it drops: the reason code of each PUBACK (a publish
    the server refused is no confirmation) and the server's limits from its CONNACK."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_packet_size: int | None = None

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any,
                    reason_code: ReasonCode, properties: Properties | None = None) -> None:
        self.max_packet_size = getattr(properties, "MaximumPacketSize", None)
        # paho does not keep to the server's Receive Maximum by itself, and its setter
        # refuses a change once connected: its attribute, then (20, paho's default, until
        # this CONNACK); the messages beyond it wait in paho's queue
        receive_maximum = getattr(properties, "ReceiveMaximum", None)
        self._client._max_inflight_messages = min(receive_maximum or MAX_INFLIGHT, MAX_INFLIGHT)
        super()._on_connect(client, userdata, flags, reason_code, properties)

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int,
                    reason_code: ReasonCode, properties: Properties) -> None:
        waiting = self._pending_publishes.get(mid)
        if isinstance(waiting, _Confirmation):
            waiting.reason = reason_code
        super()._on_publish(client, userdata, mid, reason_code, properties)

    async def publish_confirmed(self, topic: str, payload: bytes, properties: Properties,
                                within: float) -> ReasonCode | None:
        """Publish at QoS 1 and return the PUBACK's reason code (as aiomqtt's ``publish``,
        which drops it)."""
        info = self._client.publish(topic, payload, 1, False, properties)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise aiomqtt.MqttCodeError(info.rc, "Could not publish message")
        confirmation = _Confirmation()
        with self._pending_call(info.mid, confirmation, self._pending_publishes):
            if not info.is_published():
                await self._wait_for(confirmation.wait(), timeout=within)
        return confirmation.reason


class _Confirmation(asyncio.Event):
    reason: ReasonCode | None = None


class MQTTTarget:
    """Publishes to ``topic`` (the queue's name unless given) at QoS 1 over MQTT 5."""

    OPTIONS = ("topic",)

    def __init__(self, url: BrokerURL, *, topic: str | None = None,
                 confirm_timeout: float = 10.0) -> None:
        self.url = url
        self.name = f"MQTT at {url.safe}"
        self.topic = topic
        self.confirm_timeout = confirm_timeout
        self._client: _ConfirmingClient | None = None

    async def open(self) -> None:
        u = self.url
        client = _ConfirmingClient(
            u.host, u.port, username=u.username, password=u.password,
            identifier=f"sqlmq-relay-{uuid.uuid4().hex[:12]}",
            protocol=aiomqtt.ProtocolVersion.V5, timeout=self.confirm_timeout,
            tls_params=aiomqtt.TLSParameters() if u.tls else None)
        client.pending_calls_threshold = 1 << 30  # hundreds in flight is the relay's way
        await client.__aenter__()
        self._client = client

    def is_open(self) -> bool:
        client = self._client
        return client is not None and not client._disconnected.done()

    async def send(self, envelope: Envelope) -> bool:
        client = self._client
        assert client is not None
        topic = envelope.route("topic", self.topic) or envelope.queue
        if not topic or "+" in topic or "#" in topic or "\x00" in topic:
            raise Refused(f"{topic!r} is not an MQTT topic one can publish to")
        properties = Properties(PacketTypes.PUBLISH)
        properties.UserProperty = list(envelope.id_headers().items())
        if envelope.content_type is not None:
            properties.ContentType = envelope.content_type
        limit = client.max_packet_size
        if limit is not None:
            size = len(envelope.payload) + len(topic) + len(properties.pack()) + 16
            if size > limit:
                raise Refused(f"a packet of about {size} bytes, over the MQTT server's "
                              f"maximum packet size of {limit} bytes")
        try:
            reason = await client.publish_confirmed(topic, envelope.payload, properties,
                                                    self.confirm_timeout)
        except ValueError as exc:  # paho's checks: a payload over MQTT's 256 MB, a bad topic
            raise Refused(f"MQTT cannot carry it: {exc}") from None
        if reason is not None and reason.is_failure:
            code = reason.value
            if code in _NEVER:
                raise Refused(f"the MQTT server refused it: {_NEVER[code]} ({code:#04x})")
            raise aiomqtt.MqttCodeError(reason, "the MQTT server refused the message")
        return False

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.__aexit__(None, None, None)
            except Exception:  # already disconnected: nothing left to close
                pass


__all__ = ["MQTTTarget"]
