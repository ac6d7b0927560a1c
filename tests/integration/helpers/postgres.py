"""A PostgreSQL server of Debian's packages for the tests: a cluster made in a temporary directory
by initdb, run as the postgres user (it refuses root), listening on a unix socket in that directory
only (no TCP), trust authentication for the role `runtime`. Stopped and removed at the end."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

PG_BIN = Path(os.environ.get("RUNTIME_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def available() -> str | None:
    """Why no server can run here, or None."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL server at {PG_BIN} (Debian's postgresql-15)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user (Debian's postgresql-15 makes it)"
    if os.geteuid() != 0:
        return "running the server as the postgres user needs root"
    return None


class PostgresServer:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="runtime-pg-"))
        self.data = self.dir / "data"
        self.sock = self.dir / "sock"
        self.proc: subprocess.Popen | None = None
        self.port = 5432

    def _as_postgres(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", "postgres", "--", *argv], **kw)

    def start(self) -> "PostgresServer":
        pw = pwd.getpwnam("postgres")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.sock.mkdir()
        os.chown(self.sock, pw.pw_uid, pw.pw_gid)
        r = self._as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "runtime",
                               "--no-sync", "-E", "UTF8"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stdout}{r.stderr}")
        self.proc = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / "postgres"), "-D", str(self.data),
             "-k", str(self.sock), "-c", "listen_addresses=", "-c", "fsync=off", "-c", "max_connections=300",
             "-p", str(self.port)],
            stdout=open(self.dir / "log", "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.dir / 'log').read_text()[-4000:]}")
            ok = subprocess.run([str(PG_BIN / "pg_isready"), "-h", str(self.sock), "-p", str(self.port)],
                                capture_output=True)
            if ok.returncode == 0:
                return self
            time.sleep(0.1)
        raise RuntimeError("postgres did not become ready in 60 s")

    def url(self, db: str = "postgres") -> str:
        return f"postgresql:///{db}?host={quote(str(self.sock), safe='')}&port={self.port}&user=runtime"

    def psql(self, sql: str, db: str = "postgres") -> str:
        r = subprocess.run([str(PG_BIN / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                            "-d", self.url(db), "-c", sql], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"psql: {r.stderr}")
        return r.stdout

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
