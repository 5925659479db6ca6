"""A limited acquire on a caller's engine at REPEATABLE READ (PostgreSQL, MariaDB).

Under READ COMMITTED the acquire reads its candidate channels in the transaction that then
locks them and counts their running deliveries again; at REPEATABLE READ that recount
would read the snapshot taken before the locks, so the read stays in a transaction of its
own (``ChannelStatements._reads_fresh_under_locks``)."""

from __future__ import annotations

import pytest

from sqlmq import Broker
from sqlmq.connect import parse_url
from sqlmq.engines import create_async

from .test_channels import four_channels_of_two


@pytest.mark.parametrize("db_kind", ["postgresql", "mariadb"])
async def test_brokers_on_a_callers_repeatable_read_engine_keep_a_channels_concurrency(
        broker: Broker, db_url: str, prefix: str) -> None:
    engines = [create_async(parse_url(db_url)).execution_options(
        isolation_level="REPEATABLE READ") for _ in range(2)]
    brokers = [Broker(e, table_prefix=prefix) for e in engines]
    try:
        await four_channels_of_two([broker, *brokers])
        for b in brokers:
            assert b.engine._fresh_reads is False  # type: ignore[attr-defined]
        assert broker.engine._fresh_reads is True  # type: ignore[attr-defined]
    finally:
        for e in engines:
            await e.dispose()
