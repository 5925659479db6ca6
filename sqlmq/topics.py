"""Topics and consumer groups: what a topic publish fans out to.

A **consumer group** is a queue bound to a topic *pattern*: ``group_queue("orders.*",
"billing")`` is the queue ``billing@orders.*``. Groups are rows in ``{prefix}topic_group``,
so a publisher in any process sees every group, whether or not it has met it. A topic
publish reads the groups whose pattern matches the topic and writes one copy per group into
its queue (fanout on write), in one transaction: all copies or none. From there a copy is
an ordinary message of its group's queue: consumers of one group share its copies (each
group sees every message once), and retries, dead letters, leases, fencing, expiry and
deduplication keys hold per copy.

Why fanout on write rather than a cursor per group over one shared row: the acquire, the
settle and every guarantee stay as they are (a copy is a row, and a row is what sqlmq
fences, retries and archives), a slow or failing group never holds back the others or the
cleanup of a shared row, and deleting a group is deleting its queue's rows. It costs a row
per group per message at publish; ``bench/fanout.py`` measures it.

Topics are words separated by dots (``orders.created``). A pattern may use ``*`` for
exactly one word and ``#`` for any number of words, zero included (``orders.#`` matches
``orders`` and ``orders.eu.created``), as in AMQP's topic exchanges.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .codec import TOPIC_HEADER
from .errors import ConfigurationError
from .subscriber import check_name, check_queue

#: Wildcards of a pattern: one word, and any number of words.
ONE_WORD, ANY_WORDS = "*", "#"
#: Separates a group's name from its pattern in the name of the group's queue.
GROUP_SEPARATOR = "@"


@dataclass(frozen=True, slots=True)
class TopicGroup:
    """A consumer group: its ``pattern``, its name and its queue; ``created_at`` on the
    database clock (messages published after it reach the group)."""

    pattern: str
    group: str
    queue: str
    created_at: datetime


def _words(what: str, name: Any) -> list[str]:
    words = check_name(name, what).split(".")
    if any(not w for w in words):
        raise ConfigurationError(
            f"{what} {name!r} has an empty word: words are separated by single dots")
    return words


def check_topic(topic: Any) -> str:
    """A topic to publish to: words separated by dots, no wildcards."""
    for word in _words("topic", topic):
        if word in (ONE_WORD, ANY_WORDS):
            raise ConfigurationError(
                f"topic {topic!r} has a wildcard ({word!r}): publish to a topic, "
                f"subscribe to a pattern")
    return topic  # type: ignore[no-any-return]


def check_pattern(pattern: Any) -> str:
    """A pattern a group subscribes to: words, ``*`` (one word) or ``#`` (any words)."""
    for word in _words("topic pattern", pattern):
        if word not in (ONE_WORD, ANY_WORDS) and (ONE_WORD in word or ANY_WORDS in word):
            raise ConfigurationError(
                f"topic pattern {pattern!r}: a wildcard must be a whole word "
                f"({word!r}); use '*' for one word or '#' for any number")
    return pattern  # type: ignore[no-any-return]


def group_queue(pattern: str, group: str) -> str:
    """The queue holding ``group``'s copies of the topics ``pattern`` matches, checked."""
    check_pattern(pattern)
    check_name(group, "group name")
    if GROUP_SEPARATOR in group:
        raise ConfigurationError(
            f"group name {group!r} must not contain {GROUP_SEPARATOR!r} (its queue is "
            f"named group{GROUP_SEPARATOR}pattern)")
    queue = f"{group}{GROUP_SEPARATOR}{pattern}"
    try:
        return check_queue(queue)
    except ConfigurationError as exc:
        raise ConfigurationError(f"group {group!r} of {pattern!r}: its queue {exc}") from None


def subscription(queues: Any, topic: Any, group: Any,
                 ) -> tuple[tuple[Any, ...], tuple[tuple[str, str], ...]]:
    """What ``Broker.subscriber(queues, topic=, group=)`` consumes: its queues (the given
    ones, checked later, then each group's), and the ``(pattern, group)`` groups it joins.
    ``topic`` is a pattern or several."""
    if topic is None:
        if group is not None:
            raise ConfigurationError("group= names the consumer group of a topic: pass topic=")
        groups: tuple[tuple[str, str], ...] = ()
    else:
        if group is None:
            raise ConfigurationError(
                f"a subscriber of topic {topic!r} needs group=: consumers of one group share "
                f"its messages, and each group gets every message")
        patterns = [topic] if isinstance(topic, str) else list(topic)
        if not patterns:
            raise ConfigurationError("topic= needs at least one pattern")
        groups = tuple((pattern, group) for pattern in patterns)
    given: tuple[Any, ...] = ()
    if queues is not None:  # a lone non-str (7) must reach check_queue's clear error
        single = isinstance(queues, str) or not isinstance(queues, Iterable)
        given = (queues,) if single else tuple(queues)
    return given + tuple(group_queue(p, g) for p, g in groups), groups


def matches(pattern: str, topic: str) -> bool:
    """Whether ``topic`` is one of the topics ``pattern`` names."""
    return _match(pattern.split("."), topic.split("."))


def _match(pattern: list[str], topic: list[str]) -> bool:
    # ends[j]: whether the pattern so far matches the first j words of the topic
    ends = [True] + [False] * len(topic)
    for word in pattern:
        if word == ANY_WORDS:
            for j in range(1, len(ends)):
                ends[j] = ends[j] or ends[j - 1]
        else:
            for j in range(len(ends) - 1, 0, -1):
                ends[j] = ends[j - 1] and (word == ONE_WORD or word == topic[j - 1])
            ends[0] = False
    return ends[-1]


def queues_for(topic: str, groups: list[tuple[str, str]]) -> list[str]:
    """The queues of the ``(pattern, queue)`` groups that receive ``topic``, sorted (so
    concurrent publishers lock them in one order)."""
    return sorted({queue for pattern, queue in groups if matches(pattern, topic)})


__all__ = ["TOPIC_HEADER", "TopicGroup", "check_pattern", "check_topic", "group_queue",
           "matches", "queues_for", "subscription"]
