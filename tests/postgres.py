"""A real PostgreSQL server for the tests, started by the test itself: Debian's `postgresql`
package (`apt-get install postgresql`; .ci/run installs it), initdb in a temporary folder, the
server on a free loopback port with its unix socket in /tmp, password authentication over TCP
(as a deployment has it), stopped and removed at the end.

Its server refuses to run as root: as root, initdb and pg_ctl run as the `postgres` user
(`runuser -u postgres --`), which owns the folder. tests/store/conftest.py makes fixtures of it
(`postgres_server`, one per session, and `postgres_url`, a fresh database per test); another
suite imports them from there, e.g. to run two servers on one database.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.servers import free_port

USER = "nmt"
PASSWORD = "test-password"  # a throwaway server, on loopback, for the length of a test run


def postgres_bin() -> Path | None:
    """The newest installed server's bin folder, or None (PostgreSQL not installed)."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    found.sort(key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def why_not() -> str | None:
    """Why no server can be started here, or None when one can."""
    if postgres_bin() is None:
        return "PostgreSQL not installed (no /usr/lib/postgresql/*/bin/initdb: apt-get install postgresql; .ci/run installs it)"  # noqa: E501
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root, and no runuser to start PostgreSQL as another user"
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and no `postgres` user to start PostgreSQL as"
    return None


@dataclass
class PostgresServer:
    port: int
    folder: Path
    host: str = "127.0.0.1"
    user: str = USER
    password: str = PASSWORD

    def url(self, database: str = "postgres", password: bool = True) -> str:
        """A SQLAlchemy URL of one database (NMT_DATABASE_URL)."""
        secret = f":{self.password}" if password else ""
        return f"postgresql+psycopg://{self.user}{secret}@{self.host}:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname="postgres",
            autocommit=True,
        ) as connection:
            connection.execute(sql)

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        name = name or f"test_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _as_server_user(command: list[str | Path]) -> list[str]:
    command = [str(part) for part in command]
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server for as long as the block runs (callers check why_not() first)."""
    bin_dir = postgres_bin()
    assert bin_dir is not None, why_not()
    # Not pytest's tmp_path: root's is closed to the postgres user. Short, for the socket path.
    folder = Path(tempfile.mkdtemp(prefix="nmt-pg-", dir="/tmp"))
    data, sockets = folder / "data", folder / "sockets"
    sockets.mkdir()
    password_file = folder / "password"
    password_file.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        for path in (folder, sockets, password_file):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    subprocess.run(
        _as_server_user(
            [
                bin_dir / "initdb",
                "--pgdata", data,
                "--username", USER,
                "--pwfile", password_file,
                "--auth-local", "trust",
                "--auth-host", "scram-sha-256",
                "--encoding", "UTF8",
                "--no-locale",
                "--no-sync",  # a throwaway cluster: no fsync of its files
            ]
        ),
        check=True,
        capture_output=True,
    )  # fmt: skip
    server = None
    try:
        for _ in range(3):  # a port taken between free_port() and the server's bind: retry
            port = free_port()
            options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1"
            started = subprocess.run(
                _as_server_user(
                    [bin_dir / "pg_ctl", "--pgdata", data, "--log", folder / "server.log",
                     "--wait", "--timeout", "60", "--options", options, "start"]
                ),
                capture_output=True,
                text=True,
                check=False,
            )  # fmt: skip
            if started.returncode == 0:
                server = PostgresServer(port=port, folder=folder)
                break
        if server is None:
            log = (folder / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"PostgreSQL did not start: {started.stderr}\n{log}")
        yield server
    finally:
        if server is not None:
            subprocess.run(
                _as_server_user([bin_dir / "pg_ctl", "--pgdata", data, "--mode", "immediate",
                                 "--wait", "stop"]),
                capture_output=True,
                check=False,
            )  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)
