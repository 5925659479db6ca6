"""The prefetch buffer: FIFO, and idle workers woken one loop turn at a time rather than one
per buffered delivery (runtime/buffer.py)."""

from __future__ import annotations

import asyncio

import pytest

from sqlmq.runtime.buffer import WorkBuffer


async def test_it_is_a_fifo_whose_get_waits_for_a_put() -> None:
    buf: WorkBuffer[int] = WorkBuffer()
    assert buf.empty() and buf.qsize() == 0
    with pytest.raises(asyncio.QueueEmpty):
        buf.get_nowait()
    getter = asyncio.create_task(buf.get())
    await asyncio.sleep(0)
    assert not getter.done()
    for i in range(3):
        buf.put_nowait(i)
    assert await asyncio.wait_for(getter, 5) == 0
    assert [buf.get_nowait(), await buf.get()] == [1, 2] and buf.empty()


async def test_a_cancelled_waiter_leaves_no_trace_and_a_woken_one_passes_its_wake_on() -> None:
    buf: WorkBuffer[str] = WorkBuffer()
    first = asyncio.create_task(buf.get())
    second = asyncio.create_task(buf.get())
    await asyncio.sleep(0)
    first.cancel()  # cancelled while waiting: no longer counted as a waiter
    await asyncio.gather(first, return_exceptions=True)
    buf.put_nowait("a")
    assert await asyncio.wait_for(second, 5) == "a"

    third = asyncio.create_task(buf.get())
    fourth = asyncio.create_task(buf.get())
    await asyncio.sleep(0)
    buf.put_nowait("b")  # the wake-up goes to the third ...
    third.cancel()  # ... which is cancelled before it runs: the fourth gets the item
    await asyncio.gather(third, return_exceptions=True)
    assert await asyncio.wait_for(fourth, 5) == "b"


async def test_an_idle_worker_takes_a_put_on_the_next_turn() -> None:
    """As with asyncio.Queue: not a turn later. A publish handing a delivery to an idle
    subscriber looks at the buffer to decide (``takes_direct``); a delivery left there a
    turn longer made the next publishes insert instead, and one SQLite process at
    2,000 msg/s tipped into the slower insert-then-acquire route for the rest of the run."""
    buf: WorkBuffer[int] = WorkBuffer()
    getter = asyncio.create_task(buf.get())
    await asyncio.sleep(0)
    buf.put_nowait(7)
    await asyncio.sleep(0)
    assert buf.empty() and getter.done() and getter.result() == 7


async def test_a_batch_goes_to_the_workers_awake_when_handlers_never_suspend() -> None:
    """asyncio.Queue would wake all 200 waiting workers for a batch of 500 (one per item);
    most would find it emptied by the first few, which take on without suspending."""
    buf: WorkBuffer[int] = WorkBuffer()
    taken: list[int] = []

    async def worker() -> None:
        while (item := await buf.get()) >= 0:
            taken.append(item)
            for _ in range(31):  # a no-op handler: take on, yielding every 32 messages
                if buf.empty():
                    break
                taken.append(buf.get_nowait())
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(worker()) for _ in range(200)]
    await asyncio.sleep(0)
    for i in range(500):
        buf.put_nowait(i)
    while len(taken) < 500:
        await asyncio.sleep(0)
    assert sorted(taken) == list(range(500))
    assert buf.wakes <= 500 // 32 + 2, f"{buf.wakes} of 200 idle workers woken for 500 items"
    for _ in tasks:
        buf.put_nowait(-1)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)


async def test_workers_whose_handlers_suspend_all_start() -> None:
    buf: WorkBuffer[int] = WorkBuffer()
    started: set[int] = set()
    release = asyncio.Event()

    async def worker() -> None:
        while (item := await buf.get()) >= 0:
            started.add(item)
            await release.wait()  # an I/O-bound handler

    tasks = [asyncio.create_task(worker()) for _ in range(100)]
    await asyncio.sleep(0)
    for i in range(150):
        buf.put_nowait(i)
    async with asyncio.timeout(5):
        while len(started) < 100:
            await asyncio.sleep(0)
    assert buf.qsize() == 50  # every worker busy, the rest waiting in the buffer
    release.set()
    for _ in tasks:
        buf.put_nowait(-1)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert started == set(range(150))
