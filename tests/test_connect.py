"""Connecting: the URL parameters users of each driver expect, masked passwords, bounded
connect timeouts, and drivers as optional extras."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import make_url, text

from sqlmq import Broker, ConnectTimeout
from sqlmq.connect import safe_url
from sqlmq.engines.sql.connect import _abandoned

from .conftest import MYSQL_URL, PG_URL, run_cli, wait_until


def _with(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


# ---- PostgreSQL: libpq parameters on asyncpg and psycopg ------------------------------------

LIBPQ = "sslmode=disable&connect_timeout=5&options=-c%20statement_timeout%3D5000"


async def test_libpq_parameters_work_on_asyncpg_and_psycopg() -> None:
    broker = Broker(_with(PG_URL, LIBPQ + "&application_name=sqlmq-test"))
    try:
        async with broker.db.connect() as conn:
            assert (await conn.execute(text("SHOW statement_timeout"))).scalar() == "5s"
            assert (await conn.execute(text("SHOW application_name"))).scalar() == "sqlmq-test"
        with broker.sync_db.connect() as sync:
            assert sync.execute(text("SHOW statement_timeout")).scalar() == "5s"
    finally:
        await broker.close()


async def test_sslmode_prefer_connects_and_require_is_an_ssl_error_not_a_type_error() -> None:
    broker = Broker(_with(PG_URL, "sslmode=prefer"))
    try:
        async with broker.db.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await broker.close()
    broker = Broker(_with(PG_URL, "sslmode=require"))
    try:
        async with broker.db.connect() as conn:  # the local server may or may not have TLS
            ssl = (await conn.execute(text(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))).scalar()
            assert ssl is True
    except Exception as exc:
        assert not isinstance(exc, TypeError), exc
        assert "SSL" in str(exc), exc
    finally:
        await broker.close()


@pytest.mark.parametrize("bad", ["sslmode=sometimes", "connect_timeout=soon",
                                 "options=statement_timeout"])
async def test_bad_libpq_parameters_are_named(bad: str) -> None:
    broker = Broker(_with(PG_URL, bad))
    with pytest.raises(ValueError, match=bad.split("=")[0]):
        broker.db  # noqa: B018
    await broker.close()


async def test_mariadb_connect_timeout_is_accepted() -> None:
    broker = Broker(_with(MYSQL_URL, "connect_timeout=5"))
    try:
        async with broker.db.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
        with broker.sync_db.connect() as sync:
            assert sync.execute(text("SELECT 1")).scalar() == 1
    finally:
        await broker.close()


# ---- a server that accepts TCP and never answers --------------------------------------------

@pytest.fixture
def silent_port() -> Iterator[int]:
    """A local port that accepts connections and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


SILENT = {"postgresql": "postgresql://app:secret@127.0.0.1:{port}/app",
          "mariadb": "mariadb://app:secret@127.0.0.1:{port}/app"}


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
@pytest.mark.parametrize("side", ["async", "sync"])
@pytest.mark.parametrize("timeout_from", ["url", "default"])
async def test_a_server_that_never_answers_fails_within_the_connect_timeout(
    database: str, side: str, timeout_from: str, silent_port: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = SILENT[database].format(port=silent_port)
    if timeout_from == "url":
        url += "?connect_timeout=2"
    else:
        monkeypatch.setattr("sqlmq.engines.sql.connect.DEFAULT_CONNECT_TIMEOUT", 2)
    broker = Broker(url)
    started = time.monotonic()
    try:
        with pytest.raises(Exception) as caught:
            if side == "async":
                async with asyncio.timeout(30):  # the bug was: for ever (MariaDB), 60 s (asyncpg)
                    async with broker.db.connect():
                        pass
            else:
                await asyncio.wait_for(asyncio.to_thread(_sync_connect, broker), 30)
    finally:
        await broker.close()
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert elapsed < 15, f"connect took {elapsed:.0f} s"
    assert "timeout" in message.lower(), message
    assert "secret" not in message
    if not (database == "postgresql" and side == "sync"):  # psycopg: "connection timeout expired"
        assert isinstance(caught.value, ConnectTimeout)
        assert f"127.0.0.1:{silent_port}" in message and "within 2 s" in message


def _sync_connect(broker: Broker) -> None:
    with broker.sync_db.connect():
        pass


# ---- passwords are masked wherever a URL is shown -------------------------------------------

@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:p@ss@db.example/app", "postgresql://u:***@db.example/app"),
    ("postgresql://u:pw@db.example/app?password=pw2&sslmode=require",
     "postgresql://u:***@db.example/app?password=***&sslmode=require"),
    ("mysql://u@db.example/app?passwd=pw", "mysql://u@db.example/app?passwd=***"),
    ("postgresql://u:pw@db.example:port/app?password=pw2", "postgresql://***@db.example:port/app"
     "?password=***"),
])
def test_safe_url_masks_every_password(url: str, shown: str) -> None:
    assert safe_url(url) == shown


def test_an_unencoded_at_sign_in_the_password_is_part_of_the_password() -> None:
    broker = Broker("postgresql://u:p@ss@db.example:5433/app")
    url = broker.engine.url  # type: ignore[attr-defined]
    assert url.host == "db.example" and url.port == 5433
    assert url.password == "p@ss"
    assert broker.url == "postgresql://u:***@db.example:5433/app"


def test_the_cli_masks_passwords_in_errors(silent_port: int) -> None:
    url = f"postgresql://app:p@ss@127.0.0.1:{silent_port}/app?password=pw2&connect_timeout=1"
    result = run_cli("queues", "--url", url)
    assert result.returncode == 1
    assert "within 1 s" in result.stderr
    assert "p@ss" not in result.stderr and "ss@" not in result.stderr
    assert "pw2" not in result.stderr


# ---- drivers are extras ---------------------------------------------------------------------

BLOCKED = """
import sys
for name in ("asyncpg", "psycopg", "asyncmy", "pymysql"):
    sys.modules[name] = None  # as if sqlmq[postgresql] and sqlmq[mysql] were not installed
import sqlmq, sqlmq.cli
"""


def test_sqlite_works_without_the_postgresql_and_mysql_drivers(tmp_path: object) -> None:
    code = BLOCKED + f"""
import asyncio
async def main():
    broker = sqlmq.Broker("sqlite:///{tmp_path}/x.db")
    await broker.migrate()
    await broker.publish("q", {{"n": 1}})
    print(sum(s.pending for s in await broker.stats()))
    await broker.close()
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


@pytest.mark.parametrize(("url", "extra"), [("postgresql://u@h/db", "postgresql"),
                                            ("mariadb://u@h/db", "mysql"),
                                            ("mysql://u@h/db", "mysql")])
def test_a_missing_driver_names_the_extra_to_install(url: str, extra: str) -> None:
    code = BLOCKED + f"""
try:
    sqlmq.Broker({url!r})
except sqlmq.ConfigurationError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"pip install 'sqlmq[{extra}]'" in out.stdout


def test_the_package_is_typed() -> None:
    import sqlmq

    assert (__import__("pathlib").Path(sqlmq.__file__).parent / "py.typed").exists()


# ---- a connect cancelled part-way --------------------------------------------------------------

@pytest.mark.parametrize("url", [PG_URL, MYSQL_URL], ids=["postgresql", "mariadb"])
async def test_a_connect_cancelled_part_way_logs_nothing_and_leaves_no_connection(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled at every step of the handshake, a connect ends quietly: asyncpg cancelled while
    its socket opened left a future with an unread error, which asyncio logged as an error
    ("Future exception was never retrieved") when a subscriber stopped mid-reconnect."""
    name = f"sqlmq_cancel_{time.monotonic_ns()}"
    observer = Broker(url)
    if url == PG_URL:
        tagged = _with(url, f"application_name={name}")
    else:  # MariaDB has no application name: the connects log in as a user of their own
        parts = make_url(url)
        async with observer.db.begin() as conn:
            await conn.execute(text(f"CREATE USER '{name}'@'%'"))
            await conn.execute(text(f"GRANT ALL ON `{parts.database}`.* TO '{name}'@'%'"))
        tagged = parts.set(username=name, password=None).render_as_string(hide_password=False)
    broker = Broker(tagged)
    try:
        for step in range(60):
            attempt = asyncio.ensure_future(_open_and_close(broker))
            for _ in range(step):
                await asyncio.sleep(0)
            attempt.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await attempt
        # An unread future's error is logged when it is collected: once for all attempts
        # (a collection per attempt cost 30 s in a worker whose heap the suite had grown).
        gc.collect()
        # The abandoned attempts finish and close what they opened; the server then ends
        # those sessions (their count falls to 0 within moments, never without the fix).
        await wait_until(lambda: not _abandoned, message="the abandoned connects finished")
        await broker.close()
        gc.collect()
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        await wait_until(lambda: _no_sessions(observer, url, name),
                         message="no connection left open by cancelled connects")
    finally:
        await broker.close()
        if url != PG_URL:
            async with observer.db.begin() as conn:
                await conn.execute(text(f"DROP USER '{name}'@'%'"))
        await observer.close()


async def _open_and_close(broker: Broker) -> None:
    async with broker.db.connect() as conn:
        await conn.execute(text("SELECT 1"))


async def _no_sessions(observer: Broker, url: str, name: str) -> bool:
    async with observer.db.connect() as conn:
        if url == PG_URL:
            sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = :name"
        else:
            sql = "SELECT count(*) FROM information_schema.processlist WHERE user = :name"
        return (await conn.execute(text(sql), {"name": name})).scalar() == 0
