"""``NewMessages``, the batch a publish hands its engine: columns, seen as a sequence of
``NewMessage`` by the paths that want one message at a time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sqlmq.new_messages import joined
from sqlmq.publishing import prepare
from sqlmq.records import NewMessage, NewMessages

AT = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_batch_reads_as_its_messages() -> None:
    batch = NewMessages("q", [b"a", b"b", b"c"], [{"k": "1"}, {}, {}], 0.0, AT, 7)
    assert len(batch) == 3
    assert batch[0] == NewMessage("q", b"a", {"k": "1"}, 0.0, AT, 7)
    assert batch[-1].payload == b"c"
    assert [m.payload for m in batch] == [b"a", b"b", b"c"]
    tail = batch[1:]
    assert isinstance(tail, NewMessages)
    assert (tail.payloads, tail.queue, tail.at, tail.priority) == ([b"b", b"c"], "q", AT, 7)
    assert NewMessages.of(batch) == batch


def test_one_publish_shares_its_queue_schedule_and_priority() -> None:
    with pytest.raises(ValueError, match="shares its queue"):
        NewMessages.of([NewMessage("q", b"a", {}), NewMessage("r", b"b", {})])
    with pytest.raises(ValueError, match="shares its queue"):
        NewMessages.of([NewMessage("q", b"a", {}, 1.0), NewMessage("q", b"b", {}, 2.0)])
    with pytest.raises(ValueError, match="shares its queue"):
        NewMessages.of([NewMessage("q", b"a", {}, priority=1), NewMessage("q", b"b", {})])
    with pytest.raises(ValueError, match="at least one"):
        NewMessages.of([])
    with pytest.raises(ValueError, match="2 payloads and 1 headers"):
        NewMessages("q", [b"a", b"b"], [{}])


def test_prepare_shares_one_headers_dict_per_content_type() -> None:
    batch = prepare("q", [b"x", "y", b"z", {"j": 1}], headers={"h": "v"}, delay=None, at=None,
                    max_payload_bytes=1000, priority=3)
    assert (batch.queue, batch.delay, batch.at, batch.priority) == ("q", 0.0, None, 3)
    assert batch.payloads == [b"x", b"y", b"z", b'{"j":1}']
    first, text, third, data = batch.headers
    assert first is third and first is not text and data is not first
    assert first == {"h": "v", "content-type": "application/octet-stream"}


def test_joined_makes_one_batch_of_those_that_share_queue_schedule_and_priority() -> None:
    a = NewMessages("out", [b"1"], [{}])
    b = NewMessages("out", [b"2", b"3"], [{"h": "x"}, {}], dedup_keys=[None, "k3"])
    other_queue = NewMessages("else", [b"4"], [{}])
    later = NewMessages("out", [b"5"], [{}], delay=5.0)
    c = NewMessages("out", [b"6"], [{}])
    out, elsewhere, delayed = joined([a, b, other_queue, later, c])
    assert (out.queue, out.payloads, out.dedup_keys) == (
        "out", [b"1", b"2", b"3", b"6"], [None, None, "k3", None])
    assert out.headers == [{}, {"h": "x"}, {}, {}]
    assert (elsewhere.payloads, delayed.payloads, delayed.delay) == ([b"4"], [b"5"], 5.0)
    assert a.payloads == [b"1"] and a.dedup_keys is None  # the batches given are not changed
    assert joined([a, c])[0].dedup_keys is None
    assert joined([]) == []
