"""The publisher ``bench.paired`` starts once per revision: it imports only ``sqlmq`` (the
revision's, through PYTHONPATH), publishes one batch per line read, and answers with the
wall and CPU seconds it took. It drops and creates its tables itself rather than through
``bench.common.drop_tables``: a revision's ``bench`` may not have that helper, and the
parent's would import the working tree's sqlmq.

    python bench/paired_child.py URL SYNC_URL PREFIX BATCH

SYNC_URL is URL for a synchronous driver (the parent derives it), for the DROP.
"""

import asyncio
import sys
import time

from sqlalchemy import create_engine

from sqlmq import Broker
from sqlmq.schema import build_schema


def _drop(sync_url: str, prefix: str) -> None:
    engine = create_engine(sync_url)
    try:
        build_schema(prefix).metadata.drop_all(engine)
    finally:
        engine.dispose()


async def serve(url: str, sync_url: str, prefix: str, batch: int) -> None:
    _drop(sync_url, prefix)
    broker = Broker(url, table_prefix=prefix)
    try:
        await broker.migrate()
        bodies = [b"x" * 64] * batch
        await broker.publish_batch("bench", bodies)  # connect and prepare outside the clock
        print("ready", flush=True)
        for _ in sys.stdin:
            wall, cpu = time.perf_counter(), time.process_time()
            await broker.publish_batch("bench", bodies)
            print(time.perf_counter() - wall, time.process_time() - cpu, flush=True)
    finally:
        await broker.close()
        _drop(sync_url, prefix)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
