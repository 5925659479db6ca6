"""The engine as an object: the contract's methods, schema calls, close."""

from __future__ import annotations

from sqlmq.engines.contract import Engine
from sqlmq.schema import SCHEMA_VERSION

from .conftest import Env, ids


async def test_engine_implements_the_contract(env: Env) -> None:
    assert isinstance(env.engine, Engine)
    assert isinstance(env.engine.hands_over, bool)
    assert env.engine.schema.prefix


async def test_migrate_again_keeps_the_messages_and_the_schema_checks(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    assert await env.engine.migrate() == SCHEMA_VERSION
    await env.engine.check_schema("test-url")
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [msg_id]


async def test_close_is_idempotent_and_the_engine_serves_again(env: Env) -> None:
    (msg_id,) = await env.publish("q")
    await env.engine.close()
    await env.engine.close()
    assert (await env.stats()).pending == 1
    assert ids(await env.engine.acquire(["q"], 10, 30)) == [msg_id]
