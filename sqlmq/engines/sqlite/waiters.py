"""Writers of other processes waiting for an SQLite file's write lock, made known to the
process that holds it, so that it lets them in.

SQLite keeps no queue of refused writers: each tries again after a pause (sqlmq's own, a
millisecond or two; see :mod:`sqlmq.engines.sqlite.connections`) and finds the lock free only if
it tries in a gap. A busy worker process leaves almost none: its writers queue on the
process's write turn, and the next one starts within a fraction of a millisecond of the
last one's commit. A publisher in a process of its own then waited 11-60 ms at the median
beside one to four such workers, 0.2-0.3 s at the 99th percentile.

So a refused writer holds a shared ``flock`` on a file beside the database (its name with
``-sqlmq`` added) while it waits, and a writer about to take the lock first checks for one
(an exclusive ``flock`` that would block) and, if one waits, steps back until it is in,
for a few milliseconds at most. A process that dies lets go of its lock with its files.
Where the file cannot be opened (a read-only directory), or there is no ``flock`` (Windows),
nobody is made known and writers wait as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator

try:
    import fcntl
except ImportError:  # not on Windows: writers there wait each on its own
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("sqlmq")

#: The longest a writer steps back for waiting writers of other processes: longer than their
#: pauses between tries (at most 3 ms), short beside a transaction that waits meanwhile.
STEP_BACK = 0.005
#: How often a writer stepping back looks whether the waiting writers are in.
_LOOK_EVERY = 0.0002


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class Waiters:
    """One database file's waiting writers, as seen from one engine of one process (an
    engine's own writers take turns already, see :mod:`sqlmq.engines.sqlite.connections`)."""

    def __init__(self, database: str | None) -> None:
        # Absolute: the database file is opened relative to the directory of that moment.
        self._path = f"{os.path.abspath(database)}-sqlmq" if database else ""
        self._fd: int | None = None
        self._closer: weakref.finalize[..., None] | None = None  # closes _fd
        self._pid = 0
        self._broken = fcntl is None or not database  # no file (in memory): no other process

    def _file(self) -> int | None:
        """The file's descriptor for this process: a forked child opens its own, as a lock
        on the one it inherited would be its parent's as well."""
        if self._broken:
            return None
        if self._fd is not None and self._pid == os.getpid():
            return self._fd
        if self._closer is not None:  # a forked child: the descriptor is its parent's too
            self._closer.detach()
            _close(self._fd)  # type: ignore[arg-type]
            self._fd = None
        try:
            # Read-only: a flock needs no more, and processes of other users (a web server's
            # beside the workers') can open what one of them made.
            self._fd = os.open(self._path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            log.info("sqlmq: writers of other processes waiting for %s cannot be made "
                     "known (%s); each waits for the lock on its own", self._path, exc)
            self._broken = True
            return None
        self._pid = os.getpid()
        # Closed with its engine: a process that makes and drops engines keeps none open.
        self._closer = weakref.finalize(self, _close, self._fd)
        return self._fd

    def others(self) -> bool:
        """Whether a writer of another process (or engine) waits for the lock."""
        fd = self._file()
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Made known as waiting for the lock, until the block ends."""
        fd = self._file()
        shown = False
        if fd is not None:
            with contextlib.suppress(OSError):  # another is checking this instant: no matter
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                shown = True
        try:
            yield
        finally:
            if shown:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)  # type: ignore[arg-type]

    def step_back(self, sleep: Callable[[float], None]) -> None:
        """Let waiting writers of other processes in first, for :data:`STEP_BACK` at most:
        each of them is let go of its wait once it has the lock."""
        if not self.others():
            return
        deadline = time.monotonic() + STEP_BACK
        while time.monotonic() < deadline:
            sleep(_LOOK_EVERY)
            if not self.others():
                return
