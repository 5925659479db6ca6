"""The URLs of far brokers (RabbitMQ, NATS, Redis, MQTT, Kafka), parsed once, checked, and
shown with their password masked. Shared by what sends to a far broker and what reads from
one, so a wrong URL is the same clear error on either side, before any connection is tried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ..errors import ConfigurationError

#: Each scheme and the kind of broker it names (the ``s`` forms and ``tls`` use TLS).
KINDS: dict[str, str] = {
    "amqp": "rabbitmq", "amqps": "rabbitmq",
    "nats": "nats", "tls": "nats",
    "redis": "redis", "rediss": "redis",
    "mqtt": "mqtt", "mqtts": "mqtt",
    "kafka": "kafka",
}
TLS_SCHEMES = frozenset({"amqps", "tls", "rediss", "mqtts"})

#: The port each kind listens on unless the URL says otherwise (TLS: see ``TLS_PORTS``).
DEFAULT_PORTS = {"rabbitmq": 5672, "nats": 4222, "redis": 6379, "mqtt": 1883, "kafka": 9092}
TLS_PORTS = {"rabbitmq": 5671, "nats": 4222, "redis": 6379, "mqtt": 8883, "kafka": 9093}


@dataclass(frozen=True)
class BrokerURL:
    """A far broker's URL: its kind, its hosts, who connects, and the query's options.

    ``hosts`` holds every ``host:port`` of a comma-separated list (Kafka's bootstrap servers,
    a NATS cluster), each with its port filled in from the kind's default."""

    url: str
    scheme: str
    kind: str
    hosts: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    #: The path without its leading slash, unquoted: RabbitMQ's virtual host, Redis's
    #: database number ("" when the URL has none).
    path: str = ""
    options: dict[str, str] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.scheme in TLS_SCHEMES

    @property
    def host(self) -> str:
        return self.hosts[0][0]

    @property
    def port(self) -> int:
        return self.hosts[0][1]

    @property
    def safe(self) -> str:
        """The URL with its password masked: the one form logs and errors show."""
        return mask_password(self.url)

    def __str__(self) -> str:
        return self.safe

    def __repr__(self) -> str:
        return f"BrokerURL({self.safe!r})"


def parse_broker_url(url: str) -> BrokerURL:
    """Parse ``url`` or raise :class:`~sqlmq.errors.ConfigurationError` naming what is wrong
    with it (its password masked): an unknown scheme, no host, a port that is no number."""
    if not isinstance(url, str):
        raise ConfigurationError(f"a broker URL must be a str, got {type(url).__name__}")
    shown = mask_password(url)
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise ConfigurationError(
            f"{shown!r} is not a broker URL: write scheme://host[:port], the scheme one of "
            f"{known_schemes()}")
    scheme = scheme.lower()
    kind = KINDS.get(scheme)
    if kind is None:
        raise ConfigurationError(
            f"unknown broker URL scheme {scheme!r} in {shown!r}: use one of {known_schemes()}")
    parts = urlsplit(url)
    hostlist = parts.netloc.rpartition("@")[2]
    default_port = (TLS_PORTS if scheme in TLS_SCHEMES else DEFAULT_PORTS)[kind]
    hosts = tuple(_host_port(item, default_port, shown) for item in hostlist.split(","))
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    return BrokerURL(url=url, scheme=scheme, kind=kind, hosts=hosts,
                     username=unquote(parts.username) if parts.username else None,
                     password=unquote(parts.password) if parts.password is not None else None,
                     path=unquote(parts.path[1:]) if parts.path else "", options=options)


def _host_port(item: str, default_port: int, shown: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # an IPv6 address: [::1]:5672
        host, _, rest = item[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ConfigurationError(f"broker URL {shown!r} has no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigurationError(
            f"broker URL {shown!r}: port {port_text!r} of host {host!r} is not a number "
            "between 1 and 65535")
    return host, int(port_text)


def mask_password(url: str) -> str:
    """``url`` with the password of its user info, if any, replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hosts}{slash}{tail}"


def known_schemes() -> str:
    return ", ".join(f"{s}://" for s in KINDS)


def quote_path(path: str) -> str:
    """A path segment as a URL writes it (RabbitMQ's default virtual host ``/`` is ``%2F``)."""
    return quote(path, safe="")


__all__ = ["DEFAULT_PORTS", "KINDS", "BrokerURL", "known_schemes", "mask_password",
           "parse_broker_url", "quote_path"]
