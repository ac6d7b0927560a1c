"""Shared machinery of the integration suite: the daemon under test, a small
API client bound to it, and host-side probes (processes and cgroups of a
sandbox) used to check isolation and clean-up from outside.

Everything here drives the real programs; nothing of ours is mocked.
"""
from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
CGROUP_ROOT = Path("/sys/fs/cgroup")

# Every error body has this shape (docs/api.md, "Errors").
ERROR_FIELDS = ("code", "status", "message", "hint", "requestId")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 200) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"(no log: {e})"
    text = data.decode("utf-8", "replace").splitlines()
    return "\n".join(text[-lines:])


def wait_until(pred, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Polls pred() until it returns a truthy value; returns it, or raises
    AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


# ---------------------------------------------------------------------------
# The daemon under test


LIVE_DAEMONS: list["Daemon"] = []
POOLED_DAEMONS: list["Daemon"] = []
LAYER_POOL_SCRIPT = REPO / "scripts" / "layer-pool.sh"


def layer_pool_skip_reason() -> str | None:
    """Why a test daemon gets no layer pool (its state dir stays on the host's filesystem and
    snapshots copy sparse), or None: the suite runs on a pool unless RUNTIME_TEST_LAYER_POOL=0."""
    if os.environ.get("RUNTIME_TEST_LAYER_POOL", "1") == "0":
        return "RUNTIME_TEST_LAYER_POOL=0"
    if os.geteuid() != 0:
        return "a layer pool is mounted by root"
    if shutil.which("mkfs.xfs") is None:
        return "mkfs.xfs is missing (xfsprogs; scripts/install-deps.sh installs it)"
    return None


@atexit.register
def _release_layer_pools() -> None:
    for d in list(POOLED_DAEMONS):
        d.release_layer_pool()


class DaemonError(Exception):
    pass


class Daemon:
    """One runtimed process with its own state directory and port.

    restart() keeps the state directory and the port, so base_url and
    api_key stay valid (the admin key is made once, on first start)."""

    def __init__(self, build_dir: Path, image_dir: Path, state_dir: Path, cgroup_parent: str,
                 extra_args: list[str] | None = None, extra_env: dict[str, str] | None = None,
                 keep_sandboxes: bool = False):
        self.build_dir = Path(build_dir)
        # runtimed leaves its sandboxes running when it stops (for the next start to re-attach);
        # a test daemon stops them unless the test is about that, so that none outlives the test.
        self.keep_sandboxes = keep_sandboxes
        self.image_dir = Path(image_dir)
        self.state_dir = Path(state_dir)
        self.cgroup_parent = cgroup_parent
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(extra_env or {})
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.state_dir.parent / (self.state_dir.name + ".log")
        self.proc: subprocess.Popen | None = None
        self.api_key: str | None = None
        self.starts = 0
        self.layer_pool = False

    # -- the layer pool ----------------------------------------------------

    def make_layer_pool(self) -> None:
        """Mounts a fresh XFS pool with reflink at the state dir before the first start, as
        scripts/setup.sh does, so the daemon's snapshots and forks share blocks. A state dir that
        already has files, or a host that cannot have a pool, keeps the sparse copy."""
        if self.layer_pool or layer_pool_skip_reason():
            return
        if self.state_dir.exists() and any(self.state_dir.iterdir()):
            return
        mib = os.environ.get("RUNTIME_TEST_LAYER_POOL_MIB", "16384")
        r = subprocess.run([str(LAYER_POOL_SCRIPT), str(self.state_dir), mib], capture_output=True,
                           text=True, timeout=300)
        if r.returncode == 3:
            return
        if r.returncode != 0:
            raise DaemonError(f"layer-pool.sh {self.state_dir} failed ({r.returncode}): {r.stderr}")
        if os.path.ismount(self.state_dir):
            self.layer_pool = True
            POOLED_DAEMONS.append(self)

    def release_layer_pool(self) -> None:
        """Unmounts the pool and deletes its image (the daemon stopped first)."""
        if not self.layer_pool:
            return
        subprocess.run([str(LAYER_POOL_SCRIPT), "--release", str(self.state_dir)], capture_output=True,
                       timeout=120)
        self.layer_pool = False
        if self in POOLED_DAEMONS:
            POOLED_DAEMONS.remove(self)

    # -- lifecycle ---------------------------------------------------------

    def argv(self) -> list[str]:
        return [str(self.build_dir / "runtimed"),
                "--state-dir", str(self.state_dir),
                "--listen", f"127.0.0.1:{self.port}",
                "--image-dir", str(self.image_dir),
                "--cgroup-parent", self.cgroup_parent,
                *([] if self.keep_sandboxes else ["--stop-sandboxes-on-exit"]),
                *self.extra_args]

    def start(self, timeout: float = 60.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "daemon already running"
        if self.starts == 0:
            self.make_layer_pool()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"\n==== start #{self.starts + 1}: {' '.join(self.argv())}\n".encode())
        log.flush()
        env = {**os.environ, **self.extra_env} if self.extra_env else None
        self.killed = False
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env)
        log.close()
        self.starts += 1
        if self not in LIVE_DAEMONS:
            LIVE_DAEMONS.append(self)
        deadline = time.monotonic() + timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise DaemonError(f"runtimed exited with {rc} during start-up; log:\n{tail(self.log_path)}")
            try:
                r = httpx.get(self.base_url + "/healthz", timeout=2.0)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise DaemonError(f"runtimed did not answer /healthz within {timeout}s; log:\n"
                                  f"{tail(self.log_path)}")
            time.sleep(0.05)
        key_path = self.state_dir / "admin.key"
        try:
            key = wait_until(lambda: key_path.exists() and key_path.read_text().strip(), 10,
                             what=f"{key_path}")
        except AssertionError as e:
            raise DaemonError(f"{e}; log:\n{tail(self.log_path)}") from None
        self.api_key = key

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit status (negative: a signal)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise DaemonError(f"runtimed did not exit within {timeout}s of SIGTERM; log:\n"
                                  f"{tail(self.log_path)}")
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would: the sandboxes are left as they are."""
        if self.proc is not None and self.proc.poll() is None:
            self.killed = True
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self, timeout: float = 60.0) -> None:
        rc = self.stop()
        if rc != 0:
            raise DaemonError(f"runtimed exited with {rc} on SIGTERM; log:\n{tail(self.log_path)}")
        self.start(timeout)

    def without_live_restore(self) -> None:
        """Starts it again with --no-live-restore: its sandboxes then end with it, and a kill
        leaves them to be recorded stopped at the next start (the path of the microVM, and of a
        sandbox whose supervisor is gone)."""
        if "--no-live-restore" not in self.extra_args:
            self.extra_args.append("--no-live-restore")
            self.restart()

    def env(self) -> dict[str, str]:
        return {"RUNTIME_BASE_URL": self.base_url,
                "RUNTIME_API_KEY": self.api_key or "",
                "RUNTIME_STATE_DIR": str(self.state_dir)}

    def rss_kib(self) -> int:
        return proc_status_kib(self.pid, "VmRSS")

    def hwm_kib(self) -> int:
        return proc_status_kib(self.pid, "VmHWM")

    def client(self, **kw) -> "Api":
        return Api(self, **kw)


def proc_status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


# ---------------------------------------------------------------------------
# Drivers

DRIVER_TOOLS = {"namespace": "bwrap", "gvisor": "runsc"}
_info_cache: dict[str, dict] = {}


def daemon_info(d: Daemon) -> dict:
    if d.base_url not in _info_cache:
        r = httpx.get(d.base_url + "/v1/info", headers={"Authorization": f"Bearer {d.api_key}"},
                      timeout=30)
        assert r.status_code == 200, f"GET /v1/info: {r.status_code} {r.text[:500]}"
        _info_cache[d.base_url] = r.json()
    return _info_cache[d.base_url]


def skip_unless_driver(d: Daemon, name: str) -> None:
    selected = os.environ.get("RUNTIME_TEST_DRIVERS")
    if selected and name not in selected.split(","):
        pytest.skip(f"driver {name}: not in RUNTIME_TEST_DRIVERS={selected}")
    tool = DRIVER_TOOLS.get(name)
    if tool and shutil.which(tool) is None:
        pytest.skip(f"driver {name}: {tool} is not installed")
    drivers = {x.get("name"): x for x in daemon_info(d).get("drivers", [])}
    if name not in drivers:
        pytest.skip(f"driver {name}: not offered by this runtimed (offers {sorted(drivers)})")
    if not drivers[name].get("available"):
        pytest.skip(f"driver {name} unavailable: {drivers[name].get('reason')}")



def first_driver(d: Daemon) -> str:
    """The first usable driver in DRIVER_TOOLS order, for tests where the
    driver does not matter; skips when none is."""
    drivers = {x.get("name"): x for x in daemon_info(d).get("drivers", [])}
    for name in DRIVER_TOOLS:
        if drivers.get(name, {}).get("available"):
            return name
    pytest.skip(f"no usable driver: {drivers}")


# ---------------------------------------------------------------------------
# API client


def error_of(resp: httpx.Response) -> dict:
    try:
        body = resp.json()
    except ValueError:
        raise AssertionError(f"error response is not JSON: {resp.status_code} {resp.text[:500]!r}")
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), \
        f"error response without an error object: {body!r}"
    return body["error"]


def assert_error(resp: httpx.Response, status: int, code: str | None = None,
                 mentions: str | list[str] | None = None) -> dict:
    """Checks the one error shape of the API; returns the error object."""
    assert resp.status_code == status, \
        f"expected {status} {code or ''}, got {resp.status_code}: {resp.text[:1000]!r}"
    err = error_of(resp)
    for f in ERROR_FIELDS:
        assert f in err, f"error object lacks {f!r}: {err!r}"
    assert err["status"] == status, err
    if code is not None:
        assert err["code"] == code, f"expected code {code!r}: {err!r}"
    assert isinstance(err["message"], str) and err["message"], err
    rid = resp.headers.get("x-request-id")
    assert rid, "response without X-Request-Id"
    assert err["requestId"] == rid, f"requestId {err['requestId']!r} != X-Request-Id {rid!r}"
    if mentions:
        for m in [mentions] if isinstance(mentions, str) else mentions:
            assert m in err["message"], f"error message does not name {m!r}: {err!r}"
    return err


class Api(httpx.Client):
    """httpx client bound to one daemon and its admin key. create_sandbox()
    remembers what it made; close() deletes it all."""

    def __init__(self, daemon: Daemon, key: str | None = None, timeout: float = 120.0):
        self.daemon = daemon
        self.created: list[str] = []
        super().__init__(base_url=daemon.base_url,
                         headers={"Authorization": f"Bearer {key or daemon.api_key}"},
                         timeout=timeout)

    # -- sandboxes ---------------------------------------------------------

    def create_sandbox(self, **fields: Any) -> "Sandbox":
        r = self.post("/v1/sandboxes", json=fields)
        assert r.status_code == 201, f"create {fields!r}: {r.status_code} {r.text[:2000]}"
        sbx = Sandbox(self, r.json())
        self.created.append(sbx.id)
        assert sbx["state"] == "running", sbx
        return sbx

    def sandbox(self, sid: str) -> dict:
        r = self.get(f"/v1/sandboxes/{sid}")
        assert r.status_code == 200, f"GET {sid}: {r.status_code} {r.text[:1000]}"
        return r.json()

    def wait_state(self, sid: str, states: str | tuple[str, ...], timeout: float = 30.0) -> dict:
        want = (states,) if isinstance(states, str) else states
        seen: dict = {}

        def check():
            r = self.get(f"/v1/sandboxes/{sid}")
            if r.status_code != 200:
                seen["last"] = (r.status_code, r.text[:300])
                return None
            seen["last"] = r.json()
            return seen["last"] if seen["last"].get("state") in want else None
        try:
            return wait_until(check, timeout, 0.2, what=f"sandbox {sid} in {want}")
        except AssertionError as e:
            raise AssertionError(f"{e}; last seen: {seen.get('last')!r}") from None

    def exec(self, sid: str, expect_status: int = 200, **body: Any) -> dict:
        # A command given longer than the client's own timeout gets an HTTP
        # wait of its bound plus a minute: the answer comes when it ends.
        t = body.get("timeoutMs")
        kw: dict[str, Any] = {}
        if isinstance(t, int) and not isinstance(t, bool) and t / 1000 + 60 > (self.timeout.read or 0):
            kw["timeout"] = t / 1000 + 60
        r = self.post(f"/v1/sandboxes/{sid}:exec", json=body, **kw)
        assert r.status_code == expect_status, f"exec {body!r}: {r.status_code} {r.text[:2000]}"
        return r.json()

    def exec_stream(self, sid: str, **body: Any) -> Iterator[tuple[float, dict]]:
        """Yields (monotonic arrival time, event) for each NDJSON line."""
        body["stream"] = True
        with self.stream("POST", f"/v1/sandboxes/{sid}:exec", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise AssertionError(f"stream exec: {r.status_code} {r.text[:2000]}")
            ctype = r.headers.get("content-type", "")
            assert ctype.startswith("application/x-ndjson"), f"content-type {ctype!r}"
            for line in r.iter_lines():
                if not line.strip():
                    continue
                yield time.monotonic(), json.loads(line)

    def put_file(self, sid: str, path: str, data: bytes, **params: Any) -> httpx.Response:
        return self.put(f"/v1/sandboxes/{sid}/files/content", params={"path": path, **params},
                        content=data)

    def get_file(self, sid: str, path: str) -> httpx.Response:
        return self.get(f"/v1/sandboxes/{sid}/files/content", params={"path": path})

    def delete_all(self) -> list[str]:
        problems = []
        for sid in self.created:
            try:
                r = self.delete(f"/v1/sandboxes/{sid}")
                if r.status_code not in (200, 404):
                    problems.append(f"DELETE {sid}: {r.status_code} {r.text[:300]}")
            except httpx.HTTPError as e:
                problems.append(f"DELETE {sid}: {e!r}")
        self.created.clear()
        return problems

    def close(self) -> None:
        if self.daemon.alive():
            self.delete_all()
        super().close()


class Sandbox(dict):
    """A sandbox object as the API answers it, with shortcuts bound to it."""

    def __init__(self, api: Api, data: dict):
        super().__init__(data)
        self.api = api

    @property
    def id(self) -> str:
        return self["id"]

    @property
    def driver(self) -> str:
        return self["driver"]

    def refresh(self) -> "Sandbox":
        self.clear()
        self.update(self.api.sandbox(self.id))
        return self

    def exec(self, command: str | None = None, **body: Any) -> dict:
        if command is not None:
            body["command"] = command
        return self.api.exec(self.id, **body)

    def run(self, command: str, **body: Any) -> str:
        """Runs a command that must succeed; returns its stdout."""
        res = self.exec(command, **body)
        assert res["exitCode"] == 0, f"{command!r} failed: {res!r}"
        return res["stdout"]

    def exec_stream(self, **body: Any):
        return self.api.exec_stream(self.id, **body)

    def put_file(self, path: str, data: bytes, **params: Any) -> httpx.Response:
        return self.api.put_file(self.id, path, data, **params)

    def get_file(self, path: str) -> httpx.Response:
        return self.api.get_file(self.id, path)

    def write(self, path: str, data: bytes) -> None:
        r = self.put_file(path, data)
        assert r.status_code == 200, f"PUT {path}: {r.status_code} {r.text[:500]}"

    def read(self, path: str) -> bytes:
        r = self.get_file(path)
        assert r.status_code == 200, f"GET {path}: {r.status_code} {r.text[:500]}"
        return r.content

    def files_call(self, verb: str, **body: Any) -> httpx.Response:
        return self.api.post(f"/v1/sandboxes/{self.id}/files:{verb}", json=body)

    def list(self, path: str, **params: Any) -> httpx.Response:
        return self.api.get(f"/v1/sandboxes/{self.id}/files/list", params={"path": path, **params})

    def stat(self, path: str) -> httpx.Response:
        return self.api.get(f"/v1/sandboxes/{self.id}/files/stat", params={"path": path})


# ---------------------------------------------------------------------------
# Host-side probes


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def proc_identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time) so that a reused pid is not taken for the old process."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return pid, int(fields[19])


def proc_alive(ident: tuple[int, int]) -> bool:
    now = proc_identity(ident[0])
    if now is None or now != ident:
        return False
    state = _read(f"/proc/{ident[0]}/stat")
    return state is not None and state[state.rfind(")") + 2] != "Z"


def proc_cmdline(pid: int) -> list[str]:
    raw = _read(f"/proc/{pid}/cmdline") or ""
    return [a for a in raw.split("\0") if a]


def proc_comm(pid: int) -> str:
    return (_read(f"/proc/{pid}/comm") or "").strip()


def proc_uid(pid: int) -> int | None:
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])  # effective uid
    return None


def proc_ppid(pid: int) -> int | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return int(stat[stat.rfind(")") + 2:].split()[1])


def host_pids(sid: str) -> list[int]:
    """Host processes that belong to sandbox `sid`: in a cgroup named after it,
    or carrying its id on their command line (launchers, runsc)."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        cg = _read(f"/proc/{name}/cgroup")
        if cg is None:
            continue
        if sid in cg or any(sid in a for a in proc_cmdline(int(name))):
            st = _read(f"/proc/{name}/stat")
            if st is not None and st[st.rfind(")") + 2] != "Z":
                found.append(int(name))
    return sorted(found)


def cgroup_dirs(needle: str) -> list[Path]:
    """cgroup directories on any hierarchy (v1 and the unified v2 mount) whose
    name contains `needle`."""
    out = []
    if not CGROUP_ROOT.is_dir():
        return out
    for hier in CGROUP_ROOT.iterdir():
        if not hier.is_dir():
            continue
        for dirpath, dirnames, _ in os.walk(hier):
            for d in dirnames:
                if needle in d:
                    out.append(Path(dirpath) / d)
    return sorted(out)


def cgroup_procs_under(dirs: list[Path]) -> list[int]:
    pids: set[int] = set()
    for d in dirs:
        for dirpath, _, files in os.walk(d):
            if "cgroup.procs" in files:
                txt = _read(os.path.join(dirpath, "cgroup.procs")) or ""
                pids.update(int(x) for x in txt.split())
    return sorted(pids)


def assert_no_host_trace(sid: str, timeout: float = 15.0) -> None:
    """After a delete or a stop: no process of the sandbox is left on the host,
    and no cgroup directory of it."""
    wait_until(lambda: not host_pids(sid), timeout,
               what=f"processes of {sid} to be gone (left: "
                    f"{[(p, proc_cmdline(p)[:3]) for p in host_pids(sid)]})")


def assert_no_cgroups(sid: str, timeout: float = 15.0) -> None:
    wait_until(lambda: not cgroup_dirs(sid), timeout,
               what=f"cgroup dirs of {sid} to be removed ({cgroup_dirs(sid)})")


def layer_read(state_dir: Path, sid: str, path: str) -> bytes | None:
    """Reads `path` (absolute, inside the sandbox) from a stopped sandbox's
    writable layer on the host: <state>/sandboxes/<id>/layer.img, an ext4 file
    whose upper/ directory holds what the sandbox wrote. Uses debugfs, so
    nothing is mounted. None when this layout or debugfs is not there."""
    img = Path(state_dir) / "sandboxes" / sid / "layer.img"
    if not img.is_file() or shutil.which("debugfs") is None:
        return None
    r = subprocess.run(["debugfs", "-R", f"cat /upper{path}", str(img)], capture_output=True,
                       timeout=60)
    return r.stdout if r.returncode == 0 else None


def host_ipv4_addresses() -> list[str]:
    """The host's non-loopback IPv4 addresses (read locally; nothing is sent)."""
    try:
        out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True,
                             timeout=5).stdout
        addrs = []
        for link in json.loads(out or "[]"):
            for a in link.get("addr_info", []):
                if not a.get("local", "").startswith("127."):
                    addrs.append(a["local"])
        return addrs
    except (OSError, ValueError, subprocess.SubprocessError):
        return []


def remove_empty_cgroup_tree(name: str) -> list[str]:
    """rmdir the (empty) cgroup trees called `name` at the top of each
    hierarchy, deepest first. Returns what could not be removed."""
    left = []
    if not CGROUP_ROOT.is_dir():
        return left
    for hier in CGROUP_ROOT.iterdir():
        top = hier / name
        if not top.is_dir():
            continue
        for dirpath, dirnames, _ in sorted(os.walk(top), key=lambda t: -len(t[0])):
            try:
                os.rmdir(dirpath)
            except OSError as e:
                left.append(f"{dirpath}: {e.strerror}")
    return left


def read_until(term, needle: bytes, seconds: float) -> bytes:
    """Reads a terminal (anything with recv(timeout=) answering bytes, or None
    at its end) until needle has been seen; fails with what it got."""
    seen = b""
    deadline = time.monotonic() + seconds
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{needle!r} not seen in {seconds}s; got {seen[-400:]!r}")
        try:
            chunk = term.recv(timeout=left)
        except TimeoutError:
            continue
        if chunk is None:
            raise AssertionError(f"terminal ended before {needle!r}; got {seen[-400:]!r}")
        seen += chunk
    return seen


def websocket_open(base_url: str, path: str, token: str, timeout: float = 30) -> tuple[socket.socket, bytes]:
    """A WebSocket handshake by hand to the daemon at base_url: the socket and the answer's head,
    read byte by byte so that the frames after it stay in the socket."""
    host, port = base_url.split("://", 1)[1].rstrip("/").split(":")
    s = socket.create_connection((host, int(port)), timeout=timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
               f"Authorization: Bearer {token}\r\n\r\n").encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    return s, head


def vnc_greeting(preview_port: int, host: str, token: str) -> bytes:
    """A noVNC live view's WebSocket (/websockify) opened through a preview listener with the
    token in its header: what came back up to the RFB server's greeting (or 64 KiB, or the
    connection's end)."""
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", preview_port), timeout=15) as s:
        s.sendall((f"GET /websockify HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Protocol: binary\r\nx-runtime-preview-token: {token}\r\n\r\n").encode())
        got = b""
        while b"RFB 00" not in got and len(got) < 65536:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got
