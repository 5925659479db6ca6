"""Bad input is refused with an error that names the problem, and nothing is written.

Publishing cases run on every database and the in-memory engine and check the message
table afterwards; URL and handler-signature cases never reach a database and run once.
"""

from __future__ import annotations

import importlib.util
import re
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import inspect

from sqlmq import (
    Broker,
    ConfigurationError,
    EncodeError,
    HandlerSignatureError,
    Message,
    PayloadTooLarge,
    PublishError,
    SchemaError,
)

from .conftest import drop_tables, on_every_engine, rows, sibling

SECRET = "s3cret"


def full_text(exc: BaseException) -> str:
    """Everything a user could see of an error: message, chained causes, traceback."""
    return "".join(traceback.format_exception(exc))


async def refused(
    broker: Broker, call: Callable[[], Any], error: type[Exception], fragment: str
) -> None:
    """``call`` (sync or async) raises ``error`` mentioning ``fragment``; nothing written."""
    with pytest.raises(error) as info:
        result = call()
        if hasattr(result, "__await__"):
            await result
    assert fragment in str(info.value), str(info.value)
    assert await rows(broker) == []


# ---- URLs and drivers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("oracle://scott:s3cret@db/orcl", "unsupported database 'oracle'"),
        ("not a url", "cannot parse database URL"),
        ("postgresql://u:s3cret@host:notaport/db", "cannot parse database URL"),
        ("sqlite://", "sqlite needs a file path"),
        ("sqlite:///:memory:", "sqlite needs a file path"),
    ],
)
def test_bad_url_is_refused_naming_the_problem_without_the_password(
    url: str, fragment: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        Broker(url)
    assert fragment in str(info.value)
    assert SECRET not in full_text(info.value)


def test_a_broker_target_that_is_neither_url_nor_engine_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="needs a database URL or a SQLAlchemy engine"):
        Broker(42)  # type: ignore[arg-type]


def test_password_is_masked_in_the_brokers_url_and_repr() -> None:
    broker = Broker(f"postgresql://u:{SECRET}@127.0.0.1:1/x")
    assert SECRET not in broker.url
    assert SECRET not in repr(broker)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:{SECRET}@127.0.0.1:1/x",  # nothing listens
        f"mariadb://u:{SECRET}@127.0.0.1:1/x",
        f"mariadb://root:{SECRET}@127.0.0.1:3306/test",  # wrong password
        f"postgresql://postgres:{SECRET}@127.0.0.1:5432/test",  # trusted: the schema is missing
    ],
    ids=["postgresql-refused", "mariadb-refused", "mariadb-denied", "postgresql-no-schema"],
)
async def test_start_failure_never_shows_the_password(url: str) -> None:
    broker = Broker(url, table_prefix="nosuchprefix_")
    try:
        with pytest.raises(Exception) as info:
            await broker.start()
    finally:
        await broker.close()
    assert SECRET not in full_text(info.value)


def hide_module(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == module else real(name, *args, **kwargs)

    monkeypatch.setattr("sqlmq.connect.importlib.util.find_spec", find_spec)


ASYNC_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg", "mariadb": "asyncmy"}
# The install command of each: PostgreSQL's and MySQL's drivers come with sqlmq's extras.
INSTALL = {"sqlite": "pip install aiosqlite", "postgresql": "pip install 'sqlmq[postgresql]'",
           "mariadb": "pip install 'sqlmq[mysql]'"}
SYNC_DRIVERS = {"sqlite": ("sqlite3", "pysqlite"), "postgresql": ("psycopg", "psycopg"),
                "mariadb": ("pymysql", "pymysql")}


def test_missing_async_driver_is_named_with_its_install_command(
    db_kind: str, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = ASYNC_DRIVERS[db_kind]
    hide_module(monkeypatch, driver)
    with pytest.raises(ConfigurationError, match=re.escape(
            f"driver '{driver}' is not installed: {INSTALL[db_kind]}")):
        Broker(db_url)


async def test_missing_sync_driver_is_named_and_nothing_is_published(
    broker: Broker, db_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, driver = SYNC_DRIVERS[db_kind]
    hide_module(monkeypatch, module)
    await refused(broker, lambda: broker.publish_sync("q", "x"), ConfigurationError,
                  f"driver '{driver}' is not installed")


async def test_missing_schema_refuses_to_start_and_says_to_migrate(
    db_url: str, prefix: str
) -> None:
    broker = Broker(db_url, table_prefix=prefix)

    @broker.subscriber("q")
    async def handle(msg: Message) -> None: ...

    try:
        with pytest.raises(SchemaError) as info:
            await broker.start()
        assert broker.runtimes == []
        async with broker.db.connect() as conn:
            tables = await conn.run_sync(lambda c: inspect(c).get_table_names())
    finally:
        await broker.close()
        drop_tables(db_url, prefix)
    text = str(info.value)
    assert "sqlmq migrate" in text
    assert f"--prefix {prefix}" in text
    assert not [t for t in tables if t.startswith(prefix)]  # start did not create them


# ---- publishing ----------------------------------------------------------------------------


@on_every_engine
async def test_bad_queue_names_are_refused(broker: Broker) -> None:
    for queue, fragment in [
        ("", "must not be empty"),
        ("q" * 129, "129 characters long; the limit is 128"),
        (7, "must be a str, got int"),
        (None, "must be a str, got NoneType"),
    ]:
        await refused(broker, lambda q=queue: broker.publish(q, "x"), PublishError, fragment)
        await refused(broker, lambda q=queue: broker.publish_sync(q, "x"), PublishError,
                      fragment)
        with pytest.raises(ConfigurationError, match=fragment if queue is not None else
                           r"needs at least one queue \(or topic= and group=\)"):
            broker.subscriber(queue)  # type: ignore[arg-type]  (None: no queue given)


@on_every_engine
async def test_longest_queue_name_is_accepted(broker: Broker) -> None:
    queue = "q" * 128
    msg_id = await broker.publish(queue, "x")
    assert [r["queue"] for r in await rows(broker, id=msg_id)] == [queue]


@on_every_engine
async def test_bodies_the_codec_cannot_encode_are_refused(broker: Broker) -> None:
    for body, fragment in [
        (object(), "cannot encode a body of type object"),
        (float("nan"), "cannot encode a body of type float"),
        ({"x": float("inf")}, "cannot encode a body of type dict"),
        ({1, 2}, "cannot encode a body of type set"),
    ]:
        await refused(broker, lambda b=body: broker.publish("q", b), EncodeError, fragment)
    # one bad body in a batch: none of the batch is written
    await refused(broker, lambda: broker.publish_batch("q", ["a", "b", object(), "d"]),
                  EncodeError, "type object")


@on_every_engine
async def test_headers_must_map_strings_to_strings(broker: Broker) -> None:
    for headers, fragment in [
        ({"n": 1}, "header 'n' must be a string, got int"),
        ({1: "x"}, "header names must be non-empty strings, got 1"),
        ({"": "x"}, "header names must be non-empty strings"),
        (["a"], "headers must be a mapping of str to str, got list"),
        ({"k": "a\x00b"}, "contains a NUL character"),
    ]:
        await refused(broker, lambda h=headers: broker.publish("q", "x", headers=h),
                      PublishError, fragment)


@on_every_engine
async def test_bad_schedules_are_refused(broker: Broker) -> None:
    soon = datetime.now(UTC) + timedelta(seconds=5)
    for kwargs, fragment in [
        ({"delay": -1}, "delay must not be negative"),
        ({"delay": timedelta(seconds=-1)}, "delay must not be negative"),
        ({"delay": float("nan")}, "delay must be a finite number"),
        ({"delay": 1e13}, "is over the limit"),  # SQLite stored a NULL schedule: never due
        ({"delay": "5"}, "delay must be seconds or a timedelta, got str"),
        ({"delay": 1, "at": soon}, "pass either delay or at, not both"),
        ({"at": soon.replace(tzinfo=None)}, "at must be a timezone-aware datetime"),
        ({"at": "2030-01-01T00:00:00+00:00"}, "at must be a timezone-aware datetime"),
    ]:
        await refused(broker, lambda k=kwargs: broker.publish("q", "x", **k), PublishError,
                      fragment)


@on_every_engine
async def test_bad_priorities_are_refused(broker: Broker) -> None:
    for priority, fragment in [
        (True, "priority must be an int, got bool"),
        (1.5, "priority must be an int, got float"),
        ("5", "priority must be an int, got str"),
        (None, "priority must be an int, got NoneType"),
        (32768, "priority must be from -32768 to 32767, got 32768"),
        (-32769, "priority must be from -32768 to 32767, got -32769"),
        (2**63, "priority must be from -32768 to 32767"),
    ]:
        await refused(broker, lambda p=priority: broker.publish("q", "x", priority=p),
                      PublishError, fragment)
        await refused(broker, lambda p=priority: broker.publish_batch("q", ["x"], priority=p),
                      PublishError, fragment)
        await refused(broker, lambda p=priority: broker.publish_sync("q", "x", priority=p),
                      PublishError, fragment)
        await refused(broker,
                      lambda p=priority: broker.publish_batch_sync("q", ["x"], priority=p),
                      PublishError, fragment)
    low = await broker.publish("q", "x", priority=-32768)
    high = await broker.publish("q", "x", priority=32767)
    assert [(r["id"], r["priority"]) for r in await rows(broker)] == [(low, -32768),
                                                                       (high, 32767)]


@on_every_engine
async def test_payload_over_max_payload_bytes_is_refused(
    broker: Broker, db_url: str, prefix: str
) -> None:
    small = sibling(broker, db_url, prefix, max_payload_bytes=100)
    try:
        await refused(broker, lambda: small.publish("q", b"x" * 101), PayloadTooLarge,
                      "payload of 101 bytes for queue 'q' exceeds the broker's "
                      "max_payload_bytes (100)")
        await refused(broker, lambda: small.publish_batch("q", [b"ok", b"x" * 101]),
                      PayloadTooLarge, "101 bytes")
        msg_id = await small.publish("q", b"x" * 100)  # the limit itself is allowed
    finally:
        await small.close()
    assert [r["id"] for r in await rows(broker)] == [msg_id]


# ---- handler signatures --------------------------------------------------------------------


class Unsupported:
    pass


async def two_required(a: Message, b: Message) -> None: ...
async def no_params() -> None: ...
async def keyword_only(*, msg: Message) -> None: ...
async def keyword_only_extra(msg: Message, *, extra: int) -> None: ...
async def custom_class(x: Unsupported) -> None: ...
async def optional_custom(x: Unsupported | None) -> None: ...


@pytest.mark.parametrize(
    ("handler", "fragment"),
    [
        (two_required, "must take exactly one positional argument"),
        (no_params, "takes no positional argument"),
        (keyword_only, "must take exactly one positional argument"),
        (keyword_only_extra, "must take exactly one positional argument"),
        (custom_class, "asks for a <class"),
        (optional_custom, "asks for a "),
        ("not callable", "is not callable"),
    ],
    ids=["two-required", "no-params", "keyword-only", "keyword-only-extra", "custom-class",
         "optional-custom-class", "not-callable"],
)
def test_handler_sqlmq_cannot_call_is_refused_at_decoration(
    handler: Any, fragment: str, tmp_path: Any
) -> None:
    broker = Broker(f"sqlite:///{tmp_path}/unused.db")
    with pytest.raises(HandlerSignatureError, match=fragment.replace("(", r"\(")):
        broker.subscriber("q")(handler)
    assert broker.subscribers == []


def test_bad_subscriber_options_are_refused_at_decoration(tmp_path: Any) -> None:
    broker = Broker(f"sqlite:///{tmp_path}/unused.db")
    for options, fragment in [
        ({"workers": 0}, "workers must be at least 1"),
        ({"lease": 0}, "lease must be positive"),
        ({"max_deliveries": 0}, "max_deliveries must be at least 1"),
        ({"min_fetch_interval": 2, "max_fetch_interval": 1}, "min_fetch_interval"),
        ({"retry": 5}, "retry must be a Retry or a callable"),
        ({"ack_policy": "SOMETIMES"}, "SOMETIMES"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            broker.subscriber("q", **options)
    with pytest.raises(ConfigurationError, match="at least one queue"):
        broker.subscriber([])
    assert broker.subscribers == []
