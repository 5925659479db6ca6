"""Security basics: what users send travels as bound parameters, never as SQL text; table
prefixes (the only identifiers users choose) are validated; passwords in database URLs never
show in logs, errors, reprs or CLI output."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, make_url

from sqlmq import Broker, ConfigurationError, Message, Retry, SchemaError, build_schema

from .conftest import run_cli, url_for, wait_until

MARK = "sqlmqmark7f3a"
# The marker inside text that would change the statement if it were ever spliced into SQL.
HOSTILE = f"{MARK}'); DROP TABLE x; -- \" ` \\"
SECRET = "S3cr3t-pw-9d1e"


class Statements:
    """Every statement and its parameters, as the driver received them."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.params: list[str] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        self.texts.append(statement)
        self.params.append(repr(parameters))

    def watch(self, engine: Any) -> None:
        event.listen(engine, "before_cursor_execute", self)


async def test_queue_names_headers_and_payloads_never_reach_sql_text(
    broker: Broker, db_url: str, prefix: str
) -> None:
    seen = Statements()
    b = Broker(broker.db, table_prefix=prefix, recovery_interval=0.1)
    seen.watch(b.db.sync_engine)
    seen.watch(b.sync_db)
    nacked: set[int] = set()

    @b.subscriber(HOSTILE, retry=Retry.constant(0), lease=1.0, flush_interval=0.01,
                  max_fetch_interval=0.05)
    async def handle(msg: Message) -> None:
        assert msg.body in (HOSTILE, HOSTILE.encode(), {HOSTILE: [HOSTILE]})
        await msg.extend(5)
        if msg.id not in nacked:
            nacked.add(msg.id)
            raise ValueError(HOSTILE)  # a retry, its error and history carry the marker
        if msg.headers.get(HOSTILE) == "reject":
            await msg.reject(HOSTILE)

    headers = {HOSTILE: HOSTILE}
    await b.publish(HOSTILE, HOSTILE, headers=headers)
    await b.publish_batch(HOSTILE, [{HOSTILE: [HOSTILE]}] * 3, headers={HOSTILE: "reject"})
    b.publish_sync(HOSTILE, HOSTILE.encode(), headers=headers)
    await b.publish(HOSTILE, HOSTILE, delay=3600)  # stays behind for recovery below
    await b.start()
    await wait_until(lambda: len(nacked) == 5, message="every ready message handled once")
    await wait_until(lambda: b.runtimes[0].counters.completed + b.runtimes[0].counters.failed
                     == 5, message="settled")
    await b.stop()
    await b.stats()
    assert await b.engine.requeue_archived(queue=HOSTILE, state="FAILED") == 3
    assert await b.engine.purge_archived(queue=HOSTILE) == 2
    await b.engine.recover_expired(10)
    await b.close()

    statements = "\n".join(seen.texts)
    assert MARK not in statements
    assert "DROP TABLE" not in statements
    assert any(MARK in p for p in seen.params)  # it did travel, as parameters


@pytest.mark.parametrize(
    "bad", ["x; drop table y", "X_", "1abc_", "a-b_", "a b_", "", "a" * 31, "ab'_", "é_",
            "sqlmq_\n", None]
)
def test_table_prefix_that_is_not_a_plain_identifier_is_refused(db_url: str, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="table prefix"):
        Broker(db_url, table_prefix=bad)
    with pytest.raises(ConfigurationError, match="table prefix"):
        build_schema(bad)


# ---- passwords ---------------------------------------------------------------------------


def with_password(url: str, password: str = SECRET) -> str:
    return make_url(url).set(password=password).render_as_string(hide_password=False)


@pytest.fixture(params=["postgresql", "mariadb"])
def secret_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return with_password(url_for(request.param, tmp_path))


def exception_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    out = []
    for r in caplog.records:
        out.append(r.getMessage())
        if r.exc_info:
            out.append("".join(traceback.format_exception(*r.exc_info)))
    return "\n".join(out)


async def test_password_in_url_never_shows_in_logs_errors_or_repr(
    secret_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []

    # A URL that parses but reaches no server: connection errors.
    dead = make_url(secret_url).set(port=1).render_as_string(hide_password=False)
    b = Broker(dead, table_prefix=prefix)
    shown += [repr(b), b.url, str(b.db.url)]
    with pytest.raises(Exception) as failed:
        await b.publish("q", "x")
    shown.append(exception_text(failed.value))
    b.subscriber("q")(lambda m: None)
    with pytest.raises(Exception) as failed:
        await b.start()
    shown.append(exception_text(failed.value))
    await b.close()

    # A URL that reaches the server: the trust-auth PostgreSQL ignores the password, and
    # MariaDB refuses it (root has none); either way the error must not repeat it.
    b = Broker(secret_url, table_prefix=prefix)
    b.subscriber("q")(lambda m: None)
    with pytest.raises(Exception) as failed:
        await b.start()  # no tables yet: SchemaError, which names the URL
    shown.append(exception_text(failed.value))
    if isinstance(failed.value, SchemaError):
        assert "***" in str(failed.value)
    await b.close()

    shown.append(log_text(caplog))
    assert all(SECRET not in text for text in shown)


@pytest.mark.parametrize("command", [["queues"], ["migrate"], ["dlq", "list"]])
def test_password_in_url_never_shows_in_cli_output(secret_url: str, command: list[str]) -> None:
    dead = make_url(secret_url).set(port=1).render_as_string(hide_password=False)
    # migrate only against no server: against a live one it would create tables
    for url in [dead] if command == ["migrate"] else [secret_url, dead]:
        done = run_cli(*command, "--url", url, "--prefix", "nosuchprefix_")
        output = done.stdout + done.stderr
        assert SECRET not in output, output
        assert output.strip()  # it did say something (an error or a result)
