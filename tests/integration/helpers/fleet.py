"""A fleet on one machine: runtimed hosts, each in a network namespace of its own on a bridge the
test makes, and a PostgreSQL they reach over TCP at the bridge's address (docs/fleet.md, "Tested
on one machine"). Only loopback and the addresses of this network are ever contacted.

    with FleetNet(3) as net:
        pg = net.postgres()            # listens on the bridge address, scram passwords, only the /24
        hosts = net.hosts(build_dir, image_dir, tmp, pg.url("db"))
        hosts[1].link_down()           # cut off from the database and the others
        hosts[1].link_up()

runtimed runs under `nsenter --net` (network namespace only: `ip netns exec` would mount a new
/sys over the cgroup hierarchy the daemon needs)."""
from __future__ import annotations

import ipaddress
import os
import pwd
import subprocess
import time
from pathlib import Path

from helpers import Daemon
from helpers.postgres import PG_BIN, PostgresServer

PREFIX = "rtf"  # every name this module makes starts so; stale ones of a killed run are removed


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _addresses_in_use() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    return nets


def _free_subnet() -> ipaddress.IPv4Network:
    used = _addresses_in_use()
    for third in range(213, 250):
        net = ipaddress.ip_network(f"10.{third}.{os.getpid() % 200 + 20}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free private /24 for the fleet's network")


def clean_stale() -> None:
    """Removes what a killed run left: namespaces and links of this module's prefix."""
    for ns in _ip("netns", "list", check=False).stdout.split():
        if ns.startswith(PREFIX + "-"):
            _ip("netns", "del", ns, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX):
            _ip("link", "del", name, check=False)


class FleetPostgres(PostgresServer):
    """A PostgreSQL of the test's own that listens on the bridge address (and a unix socket), with
    a password role, reachable from the hosts' namespaces only through the bridge. Stopped as the
    suite's own is (PostgresServer.stop)."""

    def __init__(self, address: str, subnet: str):
        super().__init__()
        self.address, self.subnet = address, subnet
        self.password = os.urandom(12).hex()

    def start(self) -> "FleetPostgres":
        pw = pwd.getpwnam("postgres")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.sock.mkdir()
        os.chown(self.sock, pw.pw_uid, pw.pw_gid)
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        os.chmod(pwfile, 0o600)
        r = self._as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "runtime", "--pwfile", str(pwfile),
                               "-A", "scram-sha-256", "--auth-local", "trust", "--no-sync", "-E", "UTF8"],
                              capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stdout}{r.stderr}")
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"local all all trust\nhost all runtime {self.subnet} scram-sha-256\n")
        self.proc = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / "postgres"), "-D", str(self.data), "-k", str(self.sock),
             "-c", f"listen_addresses={self.address}", "-c", "fsync=off", "-c", "max_connections=300",
             "-p", str(self.port)], stdout=open(self.dir / "log", "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while subprocess.run([str(PG_BIN / "pg_isready"), "-h", str(self.sock), "-p", str(self.port)],
                             capture_output=True).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {(self.dir / 'log').read_text()[-3000:]}")
            time.sleep(0.1)
        return self

    def psql(self, sql: str, db: str = "postgres") -> str:
        r = subprocess.run([str(PG_BIN / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", str(self.sock),
                            "-p", str(self.port), "-U", "runtime", "-d", db, "-c", sql],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"psql: {r.stderr}")
        return r.stdout

    def url(self, db: str) -> str:
        """What a host gives --database: over TCP to the bridge address, with the password."""
        return f"postgresql://runtime:{self.password}@{self.address}:{self.port}/{db}"

class FleetHost(Daemon):
    """A runtimed in network namespace `ns`, listening on `address`:7878."""

    def __init__(self, net: "FleetNet", index: int, *args, **kw):
        super().__init__(*args, **kw)
        self.net, self.index = net, index
        self.ns, self.address = net.namespaces[index], net.host_addresses[index]
        self.port = 7878
        self.base_url = f"http://{self.address}:{self.port}"

    def argv(self) -> list[str]:
        argv = super().argv()
        i = argv.index("--listen")
        argv[i + 1] = f"{self.address}:{self.port}"
        return ["nsenter", f"--net=/run/netns/{self.ns}", "--", *argv]

    def link_down(self) -> None:
        _ip("link", "set", self.net.root_links[self.index], "down")

    def link_up(self) -> None:
        _ip("link", "set", self.net.root_links[self.index], "up")


class FleetNet:
    def __init__(self, n: int = 3):
        self.n = n
        tag = f"{os.getpid() % 100000}"
        self.bridge = f"{PREFIX}b{tag}"
        self.namespaces = [f"{PREFIX}-{tag}-{i}" for i in range(n)]
        self.root_links = [f"{PREFIX}{tag}v{i}" for i in range(n)]
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        self.bridge_address = str(hosts[0])
        self.host_addresses = [str(hosts[10 + i]) for i in range(n)]
        self._pg: FleetPostgres | None = None

    def __enter__(self) -> "FleetNet":
        clean_stale()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_address}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, ns in enumerate(self.namespaces):
                _ip("netns", "add", ns)
                peer = f"{self.root_links[i]}p"
                _ip("link", "add", self.root_links[i], "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", ns)
                _ip("link", "set", self.root_links[i], "master", self.bridge)
                _ip("link", "set", self.root_links[i], "up")
                _ip("-n", ns, "addr", "add", f"{self.host_addresses[i]}/{self.subnet.prefixlen}", "dev", peer)
                _ip("-n", ns, "link", "set", peer, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def postgres(self) -> FleetPostgres:
        self._pg = FleetPostgres(self.bridge_address, str(self.subnet)).start()
        return self._pg

    def hosts(self, build_dir: Path, image_dir: Path, tmp: Path, database: str, extra: list[str] | None = None,
              cgroup_tag: str = "fleet") -> list[FleetHost]:
        """Starts a host in each namespace (the first makes the admin key, which the others get as
        an operator would hand them the file); stops what started if one fails."""
        made: list[FleetHost] = []
        try:
            for i in range(self.n):
                state = tmp / f"host{i}"
                if made:
                    state.mkdir(parents=True, exist_ok=True)
                    # The keys an operator hands every host: the admin's, and the
                    # one egress secrets are sealed with.
                    for name in ("admin.key", "secrets.key"):
                        (state / name).write_text((made[0].state_dir / name).read_text())
                        os.chmod(state / name, 0o600)
                h = FleetHost(self, i, build_dir, image_dir, state, f"runtime-test-{os.getpid()}-{cgroup_tag}{i}",
                              extra_args=["--database", database, "--host-id", f"node{i}",
                                          "--advertise", f"http://{self.host_addresses[i]}:7878", *(extra or [])])
                h.start()
                made.append(h)
        except Exception:
            for h in made:
                h.kill()
            raise
        return made

    def __exit__(self, *exc) -> None:
        if self._pg:
            self._pg.stop()
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)
        for link in self.root_links:
            _ip("link", "del", link, check=False)
        _ip("link", "del", self.bridge, check=False)


def hop_ports(port: int) -> set[tuple[int, int]]:
    """The established TCP connections to 127.0.0.1:port, as (local port, socket inode): a host's
    hop connections to another host's listener as the kernel sees them (a new connection is a new
    socket, even where loopback reuses a port at once)."""
    r = subprocess.run(["ss", "-tnHe", "state", "established", f"( dport = :{port} )"], capture_output=True,
                       text=True, timeout=10, check=True)
    found = set()
    for line in r.stdout.splitlines():
        fields = line.split()
        ino = next((f.split(":", 1)[1] for f in fields if f.startswith("ino:")), None)
        if len(fields) >= 4 and fields[3] == f"127.0.0.1:{port}" and ino:
            found.add((int(fields[2].rsplit(":", 1)[1]), int(ino)))
    return found
