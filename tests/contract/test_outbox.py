"""Publishing in the caller's transaction (the outbox): the messages appear when it
commits and never if it rolls back, on a Connection or a Session, sync or async."""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqlmq.records import NewMessages

from .conftest import Env, ids, msg


async def test_outbox_publish_appears_when_the_transaction_commits(env: Env) -> None:
    async with env.outbox_db.begin() as conn:
        published = await env.engine.publish(
            NewMessages.of([msg(payload=b"a"), msg(payload=b"b")]), conn)
        assert len(published) == 2 and published == sorted(published)
        assert (await env.stats()).pending == 0
    assert (await env.stats()).pending == 2
    assert ids(await env.engine.acquire(["q"], 10, 30)) == published


async def test_outbox_publish_vanishes_when_the_transaction_rolls_back(env: Env) -> None:
    async with env.outbox_db.connect() as conn:
        await conn.begin()
        await env.engine.publish(NewMessages.of([msg()]), conn)
        await conn.rollback()
    (kept,) = await env.publish("q")
    assert (await env.stats()).pending == 1
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [kept]


async def test_outbox_publish_on_a_session_follows_its_commit(env: Env) -> None:
    async with AsyncSession(env.outbox_db) as session:
        (committed,) = await env.engine.publish(NewMessages.of([msg()]), session)
        await session.commit()
    async with AsyncSession(env.outbox_db) as session:
        await env.engine.publish(NewMessages.of([msg()]), session)
        await session.rollback()
    async with AsyncSession(env.outbox_db) as session:
        await env.engine.publish(NewMessages.of([msg()]), session)  # closed without a commit
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [committed]


async def test_outbox_publish_sync_follows_the_connection_and_session(env: Env) -> None:
    db = env.outbox_sync_db

    def publish_all() -> list[int]:
        with db.begin() as conn:
            (on_connection,) = env.engine.publish_sync(NewMessages.of([msg(payload=b"c")]), conn)
        with db.connect() as conn:
            conn.begin()
            env.engine.publish_sync(NewMessages.of([msg(payload=b"rolled back")]), conn)
            conn.rollback()
        with Session(db) as session:
            (on_session,) = env.engine.publish_sync(NewMessages.of([msg(payload=b"s")]), session)
            session.commit()
        with Session(db) as session:
            env.engine.publish_sync(NewMessages.of([msg(payload=b"rolled back")]), session)
            session.rollback()
        return [on_connection, on_session]

    committed = await asyncio.to_thread(publish_all)
    taken = await env.engine.acquire(["q"], 10, 30)
    assert ids(taken) == committed
    assert [d.payload for d in taken] == [b"c", b"s"]
