"""A PostgreSQL that survives its primary, for the fleet's failover drill: three etcd members and
two PostgreSQL 15 nodes under Patroni (Debian's packages etcd-server and patroni), all on loopback
ports of their own, in a temporary directory. Patroni runs as the postgres user (PostgreSQL refuses
root), with synchronous_mode on: a commit is acknowledged once the standby has it, so a failover
loses no acknowledged write. Trust authentication, loopback only: a test's cluster, never a
deployment's (docs/fleet.md has one)."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from helpers.postgres import PG_BIN


def available() -> str | None:
    """Why no cluster can run here, or None."""
    for prog in ("etcd", "patroni"):
        if not shutil.which(prog):
            return f"no {prog} (Debian's etcd-server and patroni packages)"
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL server at {PG_BIN}"
    if os.geteuid() != 0:
        return "running the nodes as the postgres user needs root"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user"
    return None


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class PatroniCluster:
    SCOPE = "runtime-drill"
    TTL = 10

    def __init__(self, nodes: int = 2, members: int = 3) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="runtime-patroni-"))
        ports = _ports(2 * members + 2 * nodes)
        self.etcd_client = ports[:members]
        self.etcd_peer = ports[members:2 * members]
        self.pg_ports = ports[2 * members:2 * members + nodes]
        self.api_ports = ports[2 * members + nodes:]
        self.etcd: list[subprocess.Popen] = []
        self.nodes: list[subprocess.Popen | None] = [None] * nodes

    # ---- etcd ----

    def _start_etcd(self) -> None:
        cluster = ",".join(f"e{i}=http://127.0.0.1:{p}" for i, p in enumerate(self.etcd_peer))
        for i, (c, p) in enumerate(zip(self.etcd_client, self.etcd_peer)):
            self.etcd.append(subprocess.Popen(
                ["etcd", "--name", f"e{i}", "--data-dir", str(self.dir / f"etcd{i}"),
                 "--listen-client-urls", f"http://127.0.0.1:{c}", "--advertise-client-urls", f"http://127.0.0.1:{c}",
                 "--listen-peer-urls", f"http://127.0.0.1:{p}", "--initial-advertise-peer-urls",
                 f"http://127.0.0.1:{p}", "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 "--initial-cluster-token", f"drill-{os.getpid()}"],
                stdout=open(self.dir / f"etcd{i}.log", "wb"), stderr=subprocess.STDOUT))
        self._wait(lambda: all(self._get(f"http://127.0.0.1:{c}/health", want=200) for c in self.etcd_client),
                   60, "etcd's three members healthy")

    # ---- Patroni ----

    def _config(self, i: int) -> Path:
        d = self.dir / f"pg{i}"
        sock = self.dir / f"sock{i}"
        # JSON is YAML: no YAML writer needed.
        conf = {
            "scope": self.SCOPE, "name": f"pg{i}",
            "restapi": {"listen": f"127.0.0.1:{self.api_ports[i]}",
                        "connect_address": f"127.0.0.1:{self.api_ports[i]}"},
            "etcd3": {"hosts": [f"127.0.0.1:{c}" for c in self.etcd_client]},
            "bootstrap": {
                "dcs": {"ttl": self.TTL, "loop_wait": 2, "retry_timeout": 3, "synchronous_mode": True,
                        "postgresql": {"use_pg_rewind": False,
                                       "parameters": {"max_connections": 200, "wal_level": "replica",
                                                      "hot_standby": "on", "max_wal_senders": 10,
                                                      "max_replication_slots": 10, "wal_keep_size": "128MB"}}},
                "initdb": [{"encoding": "UTF8"}],
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_ports[i]}", "connect_address": f"127.0.0.1:{self.pg_ports[i]}",
                "data_dir": str(d), "bin_dir": str(PG_BIN), "pgpass": str(self.dir / f"pgpass{i}"),
                "authentication": {"superuser": {"username": "postgres", "password": "drill"},
                                   "replication": {"username": "replicator", "password": "drill"}},
                "parameters": {"unix_socket_directories": str(sock)},
            },
        }
        path = self.dir / f"patroni{i}.yml"
        path.write_text(json.dumps(conf))
        return path

    def start_node(self, i: int) -> None:
        pw = pwd.getpwnam("postgres")
        sock = self.dir / f"sock{i}"
        sock.mkdir(exist_ok=True)
        os.chown(sock, pw.pw_uid, pw.pw_gid)
        conf = self._config(i)
        os.chown(conf, pw.pw_uid, pw.pw_gid)
        self.nodes[i] = subprocess.Popen(["runuser", "-u", "postgres", "--", "patroni", str(conf)],
                                         stdout=open(self.dir / f"patroni{i}.log", "ab"), stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def start(self) -> "PatroniCluster":
        pw = pwd.getpwnam("postgres")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._start_etcd()
        for i in range(len(self.nodes)):
            self.start_node(i)
        self._wait(lambda: self.leader() is not None, 90, "a Patroni leader")
        self._wait(lambda: self.sync_standby() is not None, 90, "a synchronous standby streaming")
        return self

    # ---- state ----

    def _get(self, url: str, want: int | None = None):
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return True if want is not None and r.status == want else json.loads(r.read() or b"null")
        except Exception:
            return None if want is None else False

    def cluster(self) -> dict | None:
        for p in self.api_ports:
            c = self._get(f"http://127.0.0.1:{p}/cluster")
            if c:
                return c
        return None

    def leader(self) -> int | None:
        c = self.cluster() or {}
        for m in c.get("members", []):
            if m.get("role") == "leader" and m.get("state") == "running":
                return int(m["name"][2:])
        return None

    def sync_standby(self) -> int | None:
        c = self.cluster() or {}
        for m in c.get("members", []):
            if m.get("role") == "sync_standby" and m.get("state") in ("running", "streaming"):
                return int(m["name"][2:])
        return None

    def url(self, db: str) -> str:
        """libpq's multi-host form: whichever node is the primary now."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.pg_ports)
        return f"postgresql://postgres:drill@{hosts}/{db}?target_session_attrs=read-write&connect_timeout=3"

    def psql(self, sql: str, db: str = "postgres") -> str:
        r = subprocess.run([str(PG_BIN / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", self.url(db),
                            "-c", sql], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"psql: {r.stderr}")
        return r.stdout

    def kill_node(self, i: int) -> None:
        """The node gone as a machine goes: Patroni and its PostgreSQL killed with SIGKILL."""
        p = self.nodes[i]
        if p and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        pid_file = self.dir / f"pg{i}" / "postmaster.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        # The postmaster's children (and a postmaster whose pid file was not yet written).
        subprocess.run(["pkill", "-9", "-f", str(self.dir / f"pg{i}")], capture_output=True)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.dir.glob("*.log")))

    def _wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}\n{self.logs()}")

    def stop(self) -> None:
        for i in range(len(self.nodes)):
            self.kill_node(i)
        for e in self.etcd:
            if e.poll() is None:
                e.kill()
                e.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "PatroniCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
