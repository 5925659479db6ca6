"""What the relay asks of a far broker (:class:`Target`), the refusal that no retry can
mend (:class:`Refused`), and the choice of a target by its URL's scheme.

A target keeps one connection (and channel) for every message of its relay: sends run
concurrently on it, so their confirmations are awaited together. The relay's
:class:`~sqlmq.relay.link.Link` opens it, notices when it broke, and opens it again.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import ConfigurationError, SqlmqError
from .urls import BrokerURL, parse_broker_url

if TYPE_CHECKING:
    from .envelope import Envelope

#: Each kind of far broker and the module (under :mod:`sqlmq.relay.targets`) and class that
#: send to it, imported only when a relay to it is made.
TARGETS = {
    "rabbitmq": ("rabbitmq", "RabbitMQTarget"),
    "nats": ("jetstream", "JetStreamTarget"),
    "redis": ("redis_streams", "RedisStreamTarget"),
    "mqtt": ("mqtt", "MQTTTarget"),
    "kafka": ("kafka", "KafkaTarget"),
}

#: The pip package each kind's client comes in (all of them: ``pip install 'sqlmq[relay]'``).
CLIENTS = {"rabbitmq": "aio-pika", "nats": "nats-py", "redis": "redis", "mqtt": "aiomqtt",
           "kafka": "faststream[kafka]"}


class Refused(SqlmqError):
    """The far broker cannot take this message, now or ever (too large for it, a subject or
    topic it cannot carry): the relay dead-letters it (archived FAILED with this reason, to
    be requeued once the far side is changed) rather than retry it for ever."""


@runtime_checkable
class Target(Protocol):
    """A far broker a relay sends to. ``send`` returns only once the far broker confirmed
    the message; any exception but :class:`Refused` is a failed attempt."""

    #: What it is and where, for the log (the URL's password masked).
    name: str

    async def open(self) -> None:
        """Connect (and open the channel sends share); raise if the far broker is not there."""

    def is_open(self) -> bool:
        """Whether sends can go on the connection as it is (False once it broke)."""

    async def send(self, envelope: Envelope) -> bool:
        """Send and wait for the confirmation; True if the far broker says it had this
        message already (its deduplication dropped it)."""

    async def close(self) -> None:
        """Close the connection, if any; never raises."""


def target_for(to: str | Target, options: dict[str, Any], confirm_timeout: float) -> Target:
    """The target ``to`` names: a URL (its scheme picks the client; ``options`` and the
    URL's query say where messages go), or a :class:`Target` made by the caller."""
    if not isinstance(to, str):
        if not isinstance(to, Target):
            raise ConfigurationError(
                f"to= must be a broker URL or a relay target, got {type(to).__name__}")
        given = sorted(k for k, v in options.items() if v is not None)
        if given:
            raise ConfigurationError(f"{', '.join(given)}: give these to the target object "
                                     "itself, not to the relay")
        return to
    url = parse_broker_url(to)
    module_name, class_name = TARGETS[url.kind]
    try:
        module = import_module(f".targets.{module_name}", __package__)
    except ImportError as exc:
        raise ConfigurationError(
            f"a relay to {url.scheme}:// needs {CLIENTS[url.kind]} ({exc}): pip install "
            f"'sqlmq[relay]'") from None
    cls = getattr(module, class_name)
    return cls(url, **_options_for(url, cls, options), confirm_timeout=confirm_timeout)  # type: ignore[no-any-return]


def _options_for(url: BrokerURL, cls: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The destination options for ``cls``: those given, else those of the URL's query.
    An option meant for another kind of broker is an error naming the ones this one takes."""
    takes: tuple[str, ...] = cls.OPTIONS
    wrong = sorted(k for k, v in options.items() if v is not None and k not in takes)
    if wrong:
        raise ConfigurationError(
            f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not an option of a "
            f"relay to {url.scheme}:// (it takes {', '.join(takes)})")
    unknown = sorted(set(url.options) - set(takes))
    if unknown:
        raise ConfigurationError(
            f"broker URL {url.safe!r}: unknown option {', '.join(unknown)} in its query (a "
            f"relay to {url.scheme}:// takes {', '.join(takes)})")
    chosen = {k: url.options[k] for k in takes if k in url.options}
    chosen.update({k: v for k, v in options.items() if v is not None})
    return chosen


__all__ = ["CLIENTS", "TARGETS", "Refused", "Target", "target_for"]
