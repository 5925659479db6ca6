"""Wake-ups: a subscriber that has backed off to long polls still sees a new message at once.

In one process the publish wakes its own subscribers (every database); across processes
and connections PostgreSQL's NOTIFY does it, and on SQLite the file's commit counter.
Each test first lets the subscriber idle long enough that its next poll is seconds away
(``max_fetch_interval=30``: the wait doubles from 5 ms), so a message that arrives well
before that poll can only have been woken: the polls fall at about 5, 15, 35, ... 1,275,
2,555 and then 5,115 ms after the start (later on a slow machine, never sooner), so a
message published after ``IDLE`` and handled within ``SOON`` of it was woken.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from sqlmq import Broker, Message
from sqlmq.engines.postgresql import statements as postgresql_sql
from sqlmq.engines.postgresql.notify import Listener

from .conftest import wait_until
from .procs import ROOT

IDLE = 2.6  # by now the subscriber's next poll is at 5.1 s or later
SOON = 2.0  # before that poll, with half a second for a slow start


def _subscribe(broker: Broker, handled: list[int]) -> None:
    @broker.subscriber("wake", max_fetch_interval=30.0)
    async def handle(msg: Message) -> None:
        handled.append(msg.id)


async def test_publish_wakes_an_idle_subscriber_in_the_same_process(broker: Broker) -> None:
    handled: list[int] = []
    _subscribe(broker, handled)
    await broker.start()
    await asyncio.sleep(IDLE)

    msg_id = await broker.publish("wake", "hello")

    await wait_until(lambda: handled == [msg_id], timeout=SOON, message="the woken delivery")


async def test_publish_sync_on_another_thread_wakes_an_idle_subscriber(broker: Broker) -> None:
    handled: list[int] = []
    _subscribe(broker, handled)
    await broker.start()
    await asyncio.sleep(IDLE)

    msg_id = await asyncio.to_thread(broker.publish_sync, "wake", "hello")

    await wait_until(lambda: handled == [msg_id], timeout=SOON, message="the woken delivery")


@pytest.mark.parametrize("use_session", [False, True], ids=["connection", "session"])
async def test_outbox_publish_wakes_an_idle_subscriber_in_the_same_process_at_commit(
    broker: Broker, use_session: bool
) -> None:
    handled: list[int] = []
    _subscribe(broker, handled)
    await broker.start()
    await asyncio.sleep(IDLE)

    if use_session:
        async with AsyncSession(broker.db) as session, session.begin():
            msg_id = await broker.publish("wake", "hello", connection=session)
            await asyncio.sleep(0.3)  # a wake-up now would find nothing yet
    else:
        async with broker.db.begin() as conn:
            msg_id = await broker.publish("wake", "hello", connection=conn)
            await asyncio.sleep(0.3)

    await wait_until(lambda: handled == [msg_id], timeout=SOON, message="the woken delivery")


async def test_rolled_back_outbox_publish_delivers_nothing_and_connection_goes_on(
    broker: Broker,
) -> None:
    handled: list[int] = []
    _subscribe(broker, handled)
    await broker.start()
    async with broker.db.connect() as conn:
        await broker.publish("wake", "never", connection=conn)
        await conn.rollback()
        await conn.execute(text("SELECT 1"))
        await conn.commit()  # a later commit on the same connection must not wake for it
    msg_id = await broker.publish("wake", "real")
    await wait_until(lambda: handled == [msg_id], timeout=SOON, message="the real delivery")


async def _start_listening(broker: Broker, handled: list[int]) -> Listener:
    """Subscribe, start, and wait until the broker's LISTEN connection is up (start()
    waits for it, but only so long: a loaded machine may take longer)."""
    _subscribe(broker, handled)
    await broker.start()
    listener = broker.listener
    assert listener is not None
    await wait_until(listener.connected.is_set, message="the LISTEN connection")
    return listener


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_start_returns_once_its_listener_hears_notifications(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish committed on another connection right after start() returns wakes the
    subscriber by its NOTIFY (a CI run saw one handled by the first poll instead: start()
    had returned before the LISTEN, and the notification went to no one). The listener's
    connection is made slow here, as a loaded machine made it."""
    listen_once = Listener._listen_once

    async def slow(self: Listener, backoff: object) -> None:
        await asyncio.sleep(0.5)
        await listen_once(self, backoff)  # type: ignore[arg-type]

    monkeypatch.setattr(Listener, "_listen_once", slow)
    _subscribe(broker, [])
    await broker.start()
    listener = broker.listener
    assert listener is not None and listener.connected.is_set()
    async with broker.db.connect() as conn:
        raw = await conn.get_raw_connection()
        listening = await raw.driver_connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE 'LISTEN%'",
            listener.backend_pid)
    assert listening == 1


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_notify_wakes_a_subscriber_for_a_publish_on_another_connection(
    broker: Broker, db_url: str, prefix: str
) -> None:
    handled: list[int] = []
    await _start_listening(broker, handled)
    await asyncio.sleep(IDLE)

    publisher = Broker(db_url, table_prefix=prefix)
    try:
        async with publisher.db.begin() as conn:  # the caller's own transaction
            msg_id = await publisher.publish("wake", "hello", connection=conn)
        await wait_until(lambda: handled == [msg_id], timeout=SOON,
                         message="the delivery woken by NOTIFY")
    finally:
        await publisher.close()


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_notify_listener_reconnects_after_its_connection_is_terminated(
    broker: Broker, db_url: str, prefix: str
) -> None:
    handled: list[int] = []
    listener = await _start_listening(broker, handled)
    first_pid = listener.backend_pid
    await asyncio.sleep(IDLE)

    async with broker.db.connect() as conn:  # ends only our own listener's backend
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first_pid})
    await wait_until(lambda: listener.connects == 2 and listener.connected.is_set(),
                     message="the listener to reconnect")
    assert listener.backend_pid != first_pid

    publisher = Broker(db_url, table_prefix=prefix)
    try:
        msg_id = await publisher.publish("wake", "after the reconnect")
        await wait_until(lambda: handled == [msg_id], timeout=SOON,
                         message="the delivery woken through the new connection")
    finally:
        await publisher.close()


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_rolled_back_publish_sends_no_wake_up(broker: Broker) -> None:
    woken: list[str] = []
    handled: list[int] = []
    listener = await _start_listening(broker, handled)
    listener.on_queue = woken.append

    with pytest.raises(RuntimeError):
        async with broker.db.begin() as conn:
            await broker.publish("wake", "never", connection=conn)
            raise RuntimeError("roll back")
    await broker.publish("marker", "committed after the rollback")

    # Notifications arrive in commit order: once the marker's is here, a NOTIFY of the
    # rolled-back publish would have arrived before it.
    await wait_until(lambda: "marker" in woken, message="the committed publish's NOTIFY")
    assert woken == ["marker"]
    assert handled == []


async def _publish_overlapping(broker: Broker, db_url: str, prefix: str,
                               handled: list[int]) -> tuple[Broker, int]:
    """With ``broker`` subscribed, listening and idle, publish from another broker while,
    as far as its engine knows, another publish of it is sending its NOTIFY (claimed, never
    sent): the publish goes without and is owed a NOTIFY after its commit
    (sqlmq.engines.postgresql.wakes). Returns the publisher, to close, and the message's id."""
    await _start_listening(broker, handled)
    await asyncio.sleep(IDLE)
    publisher = Broker(db_url, table_prefix=prefix)
    wakes = publisher.engine.wakes  # type: ignore[attr-defined]
    assert wakes.claim()
    try:
        return publisher, await publisher.publish("wake", "overlapping")
    except BaseException:
        await publisher.close()
        raise
    finally:
        wakes.release()


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_a_publish_overlapping_a_notifying_one_is_woken_after_its_commit(
    broker: Broker, db_url: str, prefix: str
) -> None:
    """The idle subscriber in another broker can only have been woken by the NOTIFY sent
    after the overlapping publish's commit."""
    handled: list[int] = []
    publisher, msg_id = await _publish_overlapping(broker, db_url, prefix, handled)
    try:
        await wait_until(lambda: handled == [msg_id], timeout=SOON,
                         message="the delivery woken after the commit")
        assert publisher.engine.wakes.sent == 1  # type: ignore[attr-defined]
    finally:
        await publisher.close()


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_overlapping_publishes_notify_one_at_a_time_and_all_are_woken(
    broker: Broker, db_url: str, prefix: str
) -> None:
    """Fifty publishes at once: never more than one of them sends a NOTIFY in its own
    statement at a time (notifying commits queue for one lock), and every message reaches
    a subscriber in another broker."""
    handled: list[int] = []
    await _start_listening(broker, handled)

    publisher = Broker(db_url, table_prefix=prefix)
    engine = publisher.engine
    fetch = engine._fetch  # type: ignore[attr-defined]
    notifying, most = [0], [0]

    async def counted(statement: str, *args: object, **kwargs: object) -> object:
        inline = "INSERT" in statement and "pg_notify" in statement
        notifying[0] += inline
        most[0] = max(most[0], notifying[0])
        try:
            return await fetch(statement, *args, **kwargs)
        finally:
            notifying[0] -= inline

    engine._fetch = counted  # type: ignore[attr-defined]
    try:
        ids = await asyncio.gather(*(publisher.publish("wake", str(i)) for i in range(50)))
        await wait_until(lambda: sorted(handled) == sorted(ids), message="all 50 deliveries")
        assert most[0] == 1
        assert engine.wakes.sent >= 1  # type: ignore[attr-defined]
    finally:
        await publisher.close()


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_a_failed_wake_up_is_logged_and_the_next_one_is_sent(
    broker: Broker, db_url: str, prefix: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The NOTIFY sent after overlapping publishes fails once (the server refuses it): a
    warning names the queue, the message is still there (a poll finds it), the connection
    it failed on is dropped, and the next one goes out and says so."""
    handled: list[int] = []
    _subscribe(broker, handled)
    publisher = Broker(db_url, table_prefix=prefix)
    wakes = publisher.engine.wakes  # type: ignore[attr-defined]
    monkeypatch.setattr(postgresql_sql, "WAKE",
                        postgresql_sql.WAKE + " WHERE CAST(q AS INTEGER) > 0")
    try:
        assert wakes.claim()
        first = await publisher.publish("wake", "its NOTIFY fails")
        await wait_until(lambda: "the NOTIFY waking subscribers of 'wake' failed" in caplog.text,
                         message="the warning")
        assert "invalid input syntax" in caplog.text
        monkeypatch.undo()
        second = await publisher.publish("wake", "its NOTIFY goes out")
        await wait_until(lambda: wakes.sent == 1, message="the next NOTIFY")
        assert "works again, after 1 failed" in caplog.text
        await broker.start()  # its first acquire finds both
        await wait_until(lambda: sorted(handled) == [first, second], message="both deliveries")
    finally:
        wakes.release()
        await publisher.close()


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_wake_ups_go_out_while_publishes_keep_every_connection_busy(
    broker: Broker,
) -> None:
    """Sixty-four tasks publishing without pause keep all the connections the engine may
    hold in use: the NOTIFY after them takes its turn among them, not after the publishing
    stops (when callers beyond the kept connections waited on the pool, none went out in
    4 s: a kept connection went from one publish straight to the next)."""
    wakes = broker.engine.wakes  # type: ignore[attr-defined]
    stop = asyncio.Event()

    async def publishing() -> None:
        while not stop.is_set():
            await broker.publish("wake", "busy")

    tasks = [asyncio.create_task(publishing()) for _ in range(64)]
    try:
        await wait_until(lambda: wakes.sent >= 3, message="NOTIFYs while publishing")
        assert not any(t.done() for t in tasks)
    finally:
        stop.set()
        await asyncio.gather(*tasks)


@pytest.mark.parametrize("db_kind", ["postgresql"])
async def test_closing_sends_the_wake_ups_still_owed(
    broker: Broker, db_url: str, prefix: str
) -> None:
    handled: list[int] = []
    publisher, msg_id = await _publish_overlapping(broker, db_url, prefix, handled)
    await publisher.close()  # at once: the NOTIFY is still owed

    assert publisher.engine.wakes.sent == 1  # type: ignore[attr-defined]
    await wait_until(lambda: handled == [msg_id], timeout=SOON,
                     message="the delivery woken by the NOTIFY sent while closing")


_PUBLISH_ON_CUE = """
import asyncio, sys
from sqlmq import Broker

async def main():
    broker = Broker(sys.argv[1], table_prefix=sys.argv[2])
    await broker.stats()  # connected, and the file open, before the cue
    print("ready", flush=True)
    sys.stdin.readline()
    print(await broker.publish("wake", "from another process"), flush=True)
    await broker.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_commit_in_another_process_wakes_an_idle_sqlite_subscriber(
    broker: Broker, db_url: str, prefix: str
) -> None:
    publisher = subprocess.Popen(
        [sys.executable, "-c", _PUBLISH_ON_CUE, db_url, prefix], cwd=ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert publisher.stdin is not None and publisher.stdout is not None
        assert await asyncio.to_thread(publisher.stdout.readline) == "ready\n"
        handled: list[int] = []
        _subscribe(broker, handled)
        await broker.start()
        await asyncio.sleep(IDLE)  # the next poll is at 5.1 s or later

        publisher.stdin.write("go\n")
        publisher.stdin.flush()
        msg_id = int(await asyncio.to_thread(publisher.stdout.readline))

        await wait_until(lambda: handled == [msg_id], timeout=SOON,
                         message="the delivery woken by the commit counter")
    finally:
        publisher.kill()
        publisher.wait()


@pytest.mark.parametrize("db_kind", ["sqlite"])
async def test_idle_sqlite_subscriber_watching_commits_still_backs_off(broker: Broker) -> None:
    """Reading the commit counter must not turn into an acquire every few milliseconds:
    the subscriber's own acquires and the broker's other loops change nothing it reacts to."""
    acquires = 0
    acquire = broker.engine.acquire

    async def counted(*args: object, **kwargs: object) -> object:
        nonlocal acquires
        acquires += 1
        return await acquire(*args, **kwargs)  # type: ignore[arg-type]

    broker.engine.acquire = counted  # type: ignore[method-assign]

    @broker.subscriber("quiet", max_fetch_interval=1.0)
    async def handle(msg: Message) -> None:
        pass

    await broker.start()
    await asyncio.sleep(4.0)
    # Backing off from 5 ms: 5, 10, 20, ... 640 ms, then once a second: about 11 in 4 s.
    assert acquires <= 16, acquires
