"""Property tests of the publish API and the codecs, on every database and the in-memory
engine.

For any body, headers and queue name: either publishing raises a clear sqlmq error and
writes nothing, or the stored message round-trips exactly (queue, payload bytes, headers,
decoded body). Queue names are exact: no case folding, no ignored trailing spaces.
SQLite takes the bulk of the examples; the server databases and the in-memory engine a
smaller share.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from sqlmq import Broker, SqlmqError, decode, encode
from sqlmq.codec import CONTENT_TYPE

from .conftest import memory_rows, on_every_engine, on_memory

pytestmark = on_every_engine

EXAMPLES = {"memory": 60, "sqlite": 300, "postgresql": 60, "mariadb": 60}

# Any code point, lone surrogates and NUL included: what a caller can put in a Python str.
wild = st.text(st.characters(blacklist_categories=()), max_size=40)
tricky = ["", " ", "q", "Q", "q ", "\x00", "q\ud800", "\udfff", "é", "e\u0301", "😀" * 128]
names = st.one_of(wild, st.text(max_size=140), st.sampled_from(tricky))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | wild,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(wild, inner, max_size=4),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=3000), wild, json_values,
    st.sets(st.integers(), max_size=3), st.floats(),  # not JSON: sets, NaN, infinities
)
header_maps = st.one_of(
    st.none(),
    st.dictionaries(wild, wild, max_size=4),
    st.dictionaries(st.sampled_from(tricky), st.sampled_from(tricky), max_size=2),
    st.dictionaries(st.text(max_size=5), st.integers(), min_size=1, max_size=2),  # not str
)


def settings_for(db_kind: str) -> settings:
    return settings(max_examples=EXAMPLES[db_kind], deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def count(broker: Broker, **where: Any) -> int:
    if on_memory(broker):
        return len(memory_rows(broker, **where))
    m = broker.schema.message
    stmt = select(func.count()).select_from(m).where(*(m.c[k] == v for k, v in where.items()))
    with broker.sync_db.connect() as conn:
        return conn.execute(stmt).scalar_one()


def stored(broker: Broker, msg_id: int) -> Any:
    if on_memory(broker):
        (row,) = memory_rows(broker, id=msg_id)
        return SimpleNamespace(**row)
    m = broker.schema.message
    with broker.sync_db.connect() as conn:
        return conn.execute(select(m).where(m.c.id == msg_id)).one()


def test_publish_round_trips_exactly_or_refuses_clearly_and_writes_nothing(
    broker: Broker, db_kind: str
) -> None:
    @settings_for(db_kind)
    @given(queue=names, body=bodies, headers=header_maps)
    def check(queue: Any, body: Any, headers: Any) -> None:
        before = count(broker)
        try:
            msg_id = broker.publish_sync(queue, body, headers=headers)
        except SqlmqError:
            assert count(broker) == before
            return
        row = stored(broker, msg_id)
        payload, content_type = encode(body)
        assert row.queue == queue
        assert bytes(row.payload) == payload
        assert row.headers == {CONTENT_TYPE: content_type, **(headers or {})}
        if CONTENT_TYPE not in (headers or {}):
            assert _same(decode(bytes(row.payload), row.headers[CONTENT_TYPE]), body)

    check()


def test_queue_names_match_exactly(broker: Broker, db_kind: str) -> None:
    @settings_for(db_kind)
    @given(first=names, second=names)
    def check(first: str, second: str) -> None:
        marker = uuid.uuid4().bytes
        try:
            broker.publish_sync(first, marker)
        except SqlmqError:
            return
        try:
            broker.publish_sync(second, b"other")
        except SqlmqError:
            return
        assert count(broker, queue=first, payload=marker) == 1
        if first != second:  # no case folding, no ignored trailing spaces
            assert count(broker, queue=second, payload=marker) == 0

    check()


def _same(decoded: Any, body: Any) -> bool:
    return decoded == body and type(decoded) is type(body)


@pytest.mark.parametrize("body", [float("nan"), {"x": float("inf")}, {1, 2}, object()])
def test_bodies_json_cannot_carry_are_refused_before_anything_is_written(
    broker: Broker, body: Any
) -> None:
    with pytest.raises(SqlmqError, match="cannot encode"):
        broker.publish_sync("q", body)
    assert count(broker) == 0
