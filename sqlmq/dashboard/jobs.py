"""The dashboard's long writes, run as tasks of its server: a bulk requeue or delete of every
archived message a filter matches (100,000 rows are a few minutes of batches, longer than a
request should take), which the page that started it follows through
``/api/operations/ID``.

A job runs the Broker's batched repair (:mod:`sqlmq.operations`: one transaction per batch,
the running total reported after each), so what it reports done is done. One job runs at a
time: two bulk repairs never race for the same rows, and the database does one long job at
a time. A failure is logged with its traceback and shown on the job's page; a job stopped
by the server's shutdown says so, its whole batches done and the one in flight rolled back.
The last :data:`KEPT` jobs stay to be looked at until the dashboard restarts.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..backoff import describe

log = logging.getLogger("sqlmq.dashboard")

#: Finished jobs kept to be looked at (the oldest go first).
KEPT = 20

#: A job's work: the batched repair, given the callback it reports its running total to.
Work = Callable[[Callable[[int], None]], Awaitable[int]]


@dataclass
class Job:
    """One bulk repair: what it does (``title``, the question its confirmation asked), how
    far it got, and how it ended (``state``: running, done or failed)."""

    id: str
    verb: str
    title: str
    total: int
    back: str
    done: int = 0
    state: str = "running"
    #: What was done, in the words of the notice a short write shows (once done).
    result: str | None = None
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def progress(self, done: int) -> None:
        self.done = done

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "verb": self.verb, "title": self.title, "state": self.state,
                "done": self.done, "total": self.total, "result": self.result,
                "error": self.error, "back": self.back, "started_at": self.started_at,
                "finished_at": self.finished_at}


class Jobs:
    """The jobs of one dashboard process."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def running(self) -> Job | None:
        return next((j for j in self._jobs.values() if j.state == "running"), None)

    def start(self, verb: str, title: str, total: int, back: str, work: Work,
              said: Callable[[int], str]) -> Job:
        """Run ``work`` as a task; ``said(n)`` is the result once it moved ``n`` rows. The
        caller checked that none runs (:meth:`running`)."""
        job = Job(secrets.token_hex(6), verb, title, total, back)
        self._jobs[job.id] = job
        for old in [j for j in self._jobs.values() if j.state != "running"][:-KEPT]:
            del self._jobs[old.id]
        job.task = asyncio.get_running_loop().create_task(_run(job, work, said),
                                                          name=f"sqlmq dashboard {verb}")
        return job

    async def stop(self) -> None:
        """Stop every running job (the server shuts down) and wait for it to roll back."""
        tasks = [j.task for j in self._jobs.values() if j.task is not None and not j.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run(job: Job, work: Work, said: Callable[[int], str]) -> None:
    try:
        job.done = await work(job.progress)
        job.result = said(job.done)
        job.state = "done"
        log.info("dashboard: %s", job.result)
    except asyncio.CancelledError:
        job.state = "failed"
        job.error = (f"stopped by the dashboard's shutdown after {job.done:,} of "
                     f"{job.total:,} (whole batches; the one in flight was rolled back)")
        log.warning("dashboard: %s: %s", job.title, job.error)
        raise
    except Exception as exc:
        job.state = "failed"
        job.error = (f"failed after {job.done:,} of {job.total:,} ({describe(exc)}); those "
                     "stay done, the batch in flight was rolled back")
        log.exception("dashboard: %s failed after %d of %d", job.title, job.done, job.total)
    finally:
        job.finished_at = time.time()


__all__ = ["KEPT", "Job", "Jobs"]
