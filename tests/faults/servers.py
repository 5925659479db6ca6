"""Private PostgreSQL and MariaDB servers that a test may stop and start at will.

The shared servers on 5432/3306 belong to everyone on the machine; a restart test must never
touch them. These run from a temporary data directory on a free port, and are removed after.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PG_BIN = Path(os.environ.get("SQLMQ_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
MARIADBD = os.environ.get("SQLMQ_TEST_MARIADBD", "/usr/sbin/mariadbd")
MARIADB_INSTALL = os.environ.get("SQLMQ_TEST_MARIADB_INSTALL_DB", "mariadb-install-db")


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], what: str, timeout: float = 120.0) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"cannot {what}: {' '.join(cmd)}: {exc}") from None
    if done.returncode != 0:
        raise ServerError(f"cannot {what}: {' '.join(cmd)} exited {done.returncode}:\n"
                          f"{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _wait_port(port: int, up: bool, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            is_up = s.connect_ex(("127.0.0.1", port)) == 0
        if is_up == up:
            return
        time.sleep(0.05)
    raise ServerError(f"{what} did not {'start' if up else 'stop'} within {timeout}s")


class PrivatePostgres:
    """``initdb`` + ``pg_ctl`` in a temporary directory. PostgreSQL refuses to run as root,
    so as root the server runs as the ``postgres`` OS user."""

    kind = "postgresql"

    def __init__(self, base: Path) -> None:
        self.dir = base / "pg"
        self.data = self.dir / "data"
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def create(self) -> None:
        if not (PG_BIN / "initdb").exists():
            raise ServerError(f"no initdb in {PG_BIN} (set SQLMQ_TEST_PG_BIN)")
        self.dir.mkdir(parents=True)
        if self.as_user:
            shutil.chown(self.dir, "postgres")
            self.dir.parent.chmod(0o755)
        _run([*self.as_user, str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust",
              "-U", "postgres", "--no-sync"], "initdb a private PostgreSQL")
        self.start()

    def _ctl(self, *args: str) -> None:
        options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c max_connections=200")
        _run([*self.as_user, str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l",
              str(self.dir / "server.log"), "-o", options, "-w", "-t", "60", *args],
             f"pg_ctl {args[-1]}")

    def start(self) -> None:
        self._ctl("start")
        _wait_port(self.port, True, 60, "private PostgreSQL")

    def stop(self) -> None:
        self._ctl("-m", "fast", "stop")

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._ctl("-m", "immediate", "stop")
            except ServerError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateMariaDB:
    """``mariadb-install-db`` + ``mariadbd`` in a temporary directory."""

    kind = "mariadb"

    def __init__(self, base: Path) -> None:
        self.dir = base / "mariadb"
        self.data = self.dir / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mariadb://root@127.0.0.1:{self.port}/test"

    def create(self) -> None:
        self.dir.mkdir(parents=True)
        user = ["--user=root"] if os.geteuid() == 0 else []
        _run([MARIADB_INSTALL, "--no-defaults", f"--datadir={self.data}", *user,
              "--auth-root-authentication-method=normal", "--skip-test-db"],
             "install a private MariaDB")
        self.start()
        _run(["mariadb", "--no-defaults", "-uroot", "-h127.0.0.1", f"-P{self.port}", "-e",
              "CREATE DATABASE IF NOT EXISTS test"], "create the test database")

    def start(self) -> None:
        user = ["--user=root"] if os.geteuid() == 0 else []
        log = open(self.dir / "server.log", "ab")  # handed to the server
        try:
            self.proc = subprocess.Popen(
                [MARIADBD, "--no-defaults", f"--datadir={self.data}", f"--port={self.port}",
                 "--bind-address=127.0.0.1", f"--socket={self.dir}/mariadb.sock",
                 f"--pid-file={self.dir}/mariadb.pid", *user, "--skip-log-bin",
                 "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                 "--max-connections=300"],
                stdout=log, stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            raise ServerError(f"cannot start {MARIADBD}: {exc}") from None
        finally:
            log.close()
        try:
            _wait_port(self.port, True, 60, "private MariaDB")
        except ServerError:
            tail = (self.dir / "server.log").read_text(errors="replace")[-2000:]
            raise ServerError(f"private MariaDB did not start:\n{tail}") from None

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)  # a clean shutdown, like `systemctl stop`
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def destroy(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
