"""What the archive's text search reads of a message, and how words match it: the one
definition the four engines keep (each database with its own index; the in-memory engine
with :func:`matches`).

A message's searchable text is its header values (but ``content-type``, which every
message has) and then its error, the first :data:`TEXT_LIMIT` characters of them. Its
words are the runs of letters and digits in it, in lower case: ``TimeoutError: gateway
api.example.com/v2`` has ``timeouterror``, ``gateway``, ``api``, ``example``, ``com``,
``v2``. A search's words are read the same way, those shorter than :data:`MIN_WORD`
left out; a message matches when each of them begins one of its words (``time`` finds
``TimeoutError``, ``gateway`` finds ``gateways``, ``example`` finds ``api.example.com``).
A search that is a whole number is also a message id (:func:`read`).

Why words and their beginnings, not any substring: that is what each database's own text
index answers (PostgreSQL's ``tsvector`` GIN index, MariaDB's InnoDB ``FULLTEXT``,
SQLite's FTS5), with no extension to install; MariaDB's index keeps no word shorter than
three characters, hence :data:`MIN_WORD` everywhere, so a search finds the same messages
on every database.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .views import MessageView

#: Searched words shorter than this are left out (MariaDB's index keeps none shorter).
MIN_WORD = 3
#: A search looks for at most this many words.
MAX_WORDS = 16
#: How much of a message's header values and error is searchable, in characters.
TEXT_LIMIT = 10_000
#: The header whose value is not searched: every message has one, so it would find all.
UNSEARCHED_HEADER = "content-type"
#: The longest search, in characters.
MAX_TEXT = 1000
_MAX_ID = 2**63 - 1

_WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """The words of ``text`` as a search reads them: its runs of letters and digits, in
    lower case, without those shorter than :data:`MIN_WORD` or seen before."""
    found: list[str] = []
    for word in _WORD.findall(text.lower()):
        if len(word) >= MIN_WORD and word not in found:
            found.append(word)
    return found


def searchable_text(headers: object, error: str | None) -> str:
    """The part of a message a search reads (see the module). Headers a hand edit left
    no mapping have no values to search."""
    pairs = headers.items() if isinstance(headers, Mapping) else ()
    values = " ".join(str(v) for k, v in pairs if k != UNSEARCHED_HEADER)
    return f"{values} {error or ''}".strip()[:TEXT_LIMIT]


def matches(searched: Sequence[str], text: str) -> bool:
    """Whether each of the ``searched`` words begins a word of ``text``."""
    have = _WORD.findall(text.lower())
    return all(any(w.startswith(s) for w in have) for s in searched)


@dataclass(frozen=True, slots=True)
class Asked:
    """What a search's text asks for: a message by ``id`` (None: the text is no id),
    and the archived messages with its :func:`words` (none: only the id)."""

    id: int | None
    words: list[str]


def read(text: str) -> Asked:
    """What ``text`` asks for: a whole number (``#`` before it allowed) is a message id and,
    from three digits on, a word too (an order number in a header, say). Raises
    ``ValueError`` naming what is wrong: nothing to look for, too long, too many words."""
    text = text.strip()
    if not text:
        raise ValueError("nothing to look for: give a message id, or words of its error "
                         "or headers")
    if len(text) > MAX_TEXT:
        raise ValueError(f"a search is at most {MAX_TEXT} characters, got {len(text)}")
    number = re.fullmatch(r"#?\s*(\d{1,19})", text)
    msg_id = int(number.group(1)) if number else None
    if msg_id is not None and not 1 <= msg_id <= _MAX_ID:
        msg_id = None
    found = words(text)
    if len(found) > MAX_WORDS:
        raise ValueError(f"a search looks for at most {MAX_WORDS} words, got {len(found)}")
    if msg_id is None and not found:
        raise ValueError(f"{text[:40]!r} is no message id and has no word of {MIN_WORD} or "
                         "more letters or digits to look for")
    return Asked(msg_id, found)


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What :meth:`sqlmq.Insights.search` found for ``text``."""

    text: str
    #: The message id the text is (None: it is none).
    id: int | None
    #: The message with that id, live or archived (None: no such message, or no id).
    message: MessageView | None
    #: The words looked for in the archive (empty: none, the text is only an id).
    words: list[str]
    #: The archived messages that have them, newest (highest id) first.
    items: list[MessageView]
    #: The ``before`` of the next page (None: this was the last).
    next: int | None


__all__ = ["MAX_TEXT", "MAX_WORDS", "MIN_WORD", "TEXT_LIMIT", "UNSEARCHED_HEADER", "Asked",
           "SearchResult", "matches", "read", "searchable_text", "words"]
