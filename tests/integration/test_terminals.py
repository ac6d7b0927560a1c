"""Terminals: a PTY process and the interactive terminal over a WebSocket, through our SDK and
through raw WebSocket frames, on every driver (the emulated microVM runs the marked subset).
Resize, binary-safe input, Ctrl-C, the terminal ending when the process exits or the client
leaves, attaching to a spawned PTY process, and the attacks: an over-long frame closes that
terminal only, unmasked frames, bad queries, no key."""
from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))

from withruntime import AsyncSandbox, Sandbox  # noqa: E402
from withruntime.errors import APIError, ConflictError, InvalidRequestError, NotFoundError  # noqa: E402
from helpers import Api, read_until  # noqa: E402


@pytest.fixture
def sdk(daemon, monkeypatch):
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    return daemon


@pytest.fixture
def sbx(sdk, sandbox):
    with Sandbox.connect(sandbox.id) as s:
        yield s


def bound(driver: str) -> float:
    """Seconds a step may take: the emulated microVM needs far longer under load."""
    return 240.0 if driver == "microvm" else 60.0


def wait_ended(sbx, pid: str, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        info = sbx.process(pid).info
        if info["state"] != "running":
            return info
        assert time.monotonic() < deadline, f"process {pid} still runs after {seconds}s"
        time.sleep(0.1)


def read_to_end(term, seconds: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"terminal did not end in {seconds}s; got {seen[-400:]!r}"
        try:
            chunk = term.recv(timeout=left)
        except TimeoutError:
            continue
        if chunk is None:
            return seen
        seen += chunk


@pytest.mark.microvm_subset
def test_shell_is_a_tty_with_its_size_and_resize(sbx, driver):
    with sbx.terminal(cols=100, rows=30) as term:
        assert term.process_id and term.process_id.startswith("proc_")
        term.write("tty -s && echo IS-A-TTY; stty size\n")
        out = read_until(term, b"30 100", bound(driver))
        assert b"IS-A-TTY" in out
        term.resize(132, 43)
        term.write("stty size\n")
        read_until(term, b"43 132", bound(driver))
        info = sbx.process(term.process_id).info
        assert info["pty"] == {"cols": 132, "rows": 43}
        term.write("exit 7\n")
        read_to_end(term, bound(driver))
        assert term.exit_code == 7


def test_a_resize_outlives_a_size_written_back_from_before_it(sbx, driver):
    # Readline reads the window's size and writes the same back each time it takes the terminal
    # (rltty.c, set_winsize); a resize that lands between the two was undone, and the shell's next
    # `stty size` printed the old size (seen on gVisor under load). Here python3 plays that part
    # with the resize surely in between: it writes back the size it read once the resize is in.
    put_back = ("import fcntl, termios, time; get = lambda: fcntl.ioctl(0, termios.TIOCGWINSZ, bytes(8)); "
                "w = get(); print('READ', flush=True); end = time.monotonic() + 60\n"
                "while get() == w and time.monotonic() < end: time.sleep(0.01)\n"
                "fcntl.ioctl(0, termios.TIOCSWINSZ, w); print('PUT-' + 'BACK', flush=True)")
    with sbx.terminal(cols=80, rows=24, command=f'python3 -c "{put_back}"; read line; stty size') as term:
        read_until(term, b"READ", bound(driver))
        term.resize(120, 40)
        read_until(term, b"PUT-BACK", bound(driver))
        term.write("go\n")  # typed after the stale size went back, as keys after a prompt are
        out = read_until(term, b"\n", bound(driver))
        out += read_to_end(term, bound(driver))
        assert b"40 120" in out and b"24 80" not in out, out


def test_input_is_binary_safe_and_ctrl_c_reaches_the_sandbox(sbx, driver):
    # Raw mode first (READY says it is set): bytes then reach the program unchanged, NUL,
    # 0xff, DEL, ESC and ^C included.
    # gVisor interrupts on ^C even with -isig (docs/drivers.md): there the sixth byte is another.
    last = b"\x04" if driver == "gvisor" else b"\x03"
    with sbx.terminal(command="stty raw -echo; echo READY; od -An -tx1 -N6; sleep 600") as term:
        read_until(term, b"READY", bound(driver))
        term.write(b"\x00\xff\x01\x7f\x1b" + last)
        out = read_until(term, b"1b " + last.hex().encode(), bound(driver))
        assert b"00 ff 01 7f 1b " + last.hex().encode() in out, out
    # The program that takes the ^C is one process: a bash loop of `sleep`s would also test bash
    # 5.2's own race (docs/drivers.md, Terminals), which leaves it in an endless loop of SIGINTs
    # to itself now and then under gVisor's slower system calls.
    catch = ("import signal, time; signal.signal(signal.SIGINT, lambda *a: print('GOT-INT', flush=True)); "
             "print('READY', flush=True); [time.sleep(0.1) for _ in iter(int, 1)]")
    with sbx.terminal(command=f'exec python3 -c "{catch}"') as term:
        read_until(term, b"READY", bound(driver))
        term.write(b"\x03")  # Ctrl-C: the terminal's line discipline sends SIGINT to the group
        read_until(term, b"GOT-INT", bound(driver))


def test_terminal_ends_with_its_process_and_the_process_with_the_terminal(sbx, driver):
    with sbx.terminal(command="echo bye; exit 3") as term:
        out = read_to_end(term, bound(driver))
        assert b"bye" in out and term.exit_code == 3
    term = sbx.terminal(command="echo UP; sleep 600")
    read_until(term, b"UP", bound(driver))
    pid = term.process_id
    term.close()  # the client goes away: the terminal's process is hung up
    info = wait_ended(sbx, pid, bound(driver))
    assert info["state"] in ("killed", "exited"), info
    assert info["exitCode"] in (None, 129), info


def test_attach_to_a_spawned_pty_process(sbx, driver):
    p = sbx.spawn("echo STARTED; read line; echo got:$line", pty={"cols": 90, "rows": 20})
    assert p.info["pty"] == {"cols": 90, "rows": 20}
    with sbx.terminal(process_id=p.id) as term:
        assert term.process_id == p.id
        read_until(term, b"STARTED", bound(driver))
        term.write("hello\n")
        read_until(term, b"got:hello", bound(driver))
        read_to_end(term, bound(driver))
        assert term.exit_code == 0
    # An ended process, or one without a terminal, cannot be attached.
    with pytest.raises(ConflictError):
        sbx.terminal(process_id=p.id)
    q = sbx.spawn("sleep 600")
    try:
        with pytest.raises(ConflictError):
            sbx.terminal(process_id=q.id)
    finally:
        q.kill()
    with pytest.raises(NotFoundError):
        sbx.terminal(process_id="proc_0123456789abcdef")


def test_a_detached_attach_leaves_the_process_running(sbx, driver):
    p = sbx.spawn("echo ON; while read l; do echo got:$l; done", pty={"cols": 80, "rows": 24})
    try:
        term = sbx.terminal(process_id=p.id)
        read_until(term, b"ON", bound(driver))
        term.close()
        # Attached again, it still answers: leaving did not hang it up.
        with sbx.terminal(process_id=p.id) as again:
            again.write("x\n")
            read_until(again, b"got:x", bound(driver))
        assert sbx.process(p.id).info["state"] == "running"
    finally:
        p.kill()


def test_bad_queries_are_refused(sbx):
    with pytest.raises(ValueError):
        sbx.terminal(cols=0)
    with pytest.raises(InvalidRequestError):
        sbx.terminal(user="nobody")
    with pytest.raises(InvalidRequestError):
        sbx.terminal(process_id="proc_xyz")
    with pytest.raises(InvalidRequestError):
        sbx.terminal(cwd="\x00")


def test_spawn_pty_bounds(sbx):
    with pytest.raises(InvalidRequestError):
        sbx.spawn("true", pty={"cols": 0, "rows": 24})
    with pytest.raises(InvalidRequestError):
        sbx.spawn("true", pty={"cols": 80, "rows": 100000})


def test_async_terminal(sdk, sandbox, driver):
    async def go():
        async with await AsyncSandbox.connect(sandbox.id) as s:
            async with await s.terminal(command="read x; echo async:$x") as term:
                await term.write("ok\n")
                seen = b""
                while True:
                    chunk = await asyncio.wait_for(term.recv(), bound(driver))
                    if chunk is None:
                        break
                    seen += chunk
                return seen, term.exit_code
    seen, code = asyncio.run(go())
    assert b"async:ok" in seen and code == 0


# ---------------------------------------------------------------------------
# Raw WebSocket frames: what a hostile client can send


def _connect(daemon, path: str, key: str | None = None, extra: str = "") -> tuple[socket.socket, bytes]:
    env = daemon.env()
    url = env["RUNTIME_BASE_URL"]
    host, port = url.split("://", 1)[1].rstrip("/").split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    api_key = key if key is not None else env["RUNTIME_API_KEY"]
    wskey = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {wskey}\r\nSec-WebSocket-Version: 13\r\n"
               f"Authorization: Bearer {api_key}\r\n{extra}\r\n").encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):  # byte by byte: the frames after it stay in the socket
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    return s, head


def _frame(opcode: int, payload: bytes, masked: bool = True) -> bytes:
    n = len(payload)
    b1 = (0x80 if masked else 0) | (n if n < 126 else 126 if n < 65536 else 127)
    head = bytes([0x80 | opcode, b1])
    if n >= 65536:
        head += struct.pack("!Q", n)
    elif n >= 126:
        head += struct.pack("!H", n)
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class _Frames:
    """A socket's frames as they come; the bytes of a frame not yet whole
    stay for the next read."""

    def __init__(self, s: socket.socket):
        self.s, self.buf = s, b""

    def until(self, seconds: float, stop) -> list[tuple[int, bytes]]:
        """Frames up to the first whose opcode stop() takes, the server's
        close frame, or EOF."""
        self.s.settimeout(seconds)
        out: list[tuple[int, bytes]] = []
        try:
            while True:
                while len(self.buf) >= 2:
                    n, at = self.buf[1] & 0x7F, 2
                    if n == 126:
                        n, at = struct.unpack("!H", self.buf[2:4])[0], 4
                    elif n == 127:
                        n, at = struct.unpack("!Q", self.buf[2:10])[0], 10
                    if len(self.buf) < at + n:
                        break
                    out.append((self.buf[0] & 0x0F, self.buf[at:at + n]))
                    self.buf = self.buf[at + n:]
                    if out[-1][0] == 0x8 or stop(out[-1][0]):
                        return out
                chunk = self.s.recv(65536)
                if not chunk:
                    return out
                self.buf += chunk
        except socket.timeout:
            raise AssertionError(f"no such frame and no close from the server in {seconds}s: {out[-5:]!r}")


def _read_frames(s: socket.socket, seconds: float) -> list[tuple[int, bytes]]:
    """Frames until the server closes (its close frame or EOF)."""
    return _Frames(s).until(seconds, lambda op: False)


def test_over_long_frame_closes_that_terminal_only(sdk, sbx, sandbox, driver):
    other = sbx.terminal(command="echo OTHER; read x; echo still:$x")
    read_until(other, b"OTHER", bound(driver))
    s, head = _connect(sdk, f"/v1/sandboxes/{sandbox.id}/terminal?command=sleep%20600")
    assert b" 101 " in head.split(b"\r\n", 1)[0], head
    # Its process running first (the ready message), so that there is one to
    # see end.
    frames = _Frames(s)
    got = frames.until(bound(driver), lambda op: op == 0x1)
    assert got and got[-1][0] == 0x1, got
    s.sendall(_frame(0x2, b"x" * (64 * 1024 + 1)))
    frames = got + frames.until(bound(driver), lambda op: False)
    s.close()
    assert frames and frames[-1][0] == 0x8
    assert struct.unpack("!H", frames[-1][1][:2])[0] == 1009
    ready = [p for op, p in frames if op == 0x1]
    pid = __import__("json").loads(ready[0])["processId"]
    wait_ended(sbx, pid, bound(driver))
    other.write("yes\n")
    read_until(other, b"still:yes", bound(driver))
    other.close()


def test_unmasked_frames_and_garbage_close_the_terminal(sdk, sbx, sandbox, driver):
    s, head = _connect(sdk, f"/v1/sandboxes/{sandbox.id}/terminal?command=sleep%20600")
    assert b" 101 " in head.split(b"\r\n", 1)[0], head
    s.sendall(_frame(0x2, b"ls\n", masked=False))
    frames = _read_frames(s, bound(driver))
    s.close()
    assert frames[-1][0] == 0x8 if frames else True
    s, head = _connect(sdk, f"/v1/sandboxes/{sandbox.id}/terminal?command=sleep%20600")
    s.sendall(b"\xff" * 64)
    _read_frames(s, bound(driver))
    s.close()
    # The daemon still serves terminals.
    with sbx.terminal(command="echo fine") as term:
        read_to_end(term, bound(driver))


def test_handshake_without_a_key_or_upgrade_is_refused(sdk, sandbox):
    s, head = _connect(sdk, f"/v1/sandboxes/{sandbox.id}/terminal", key="rt_" + "0" * 40)
    s.close()
    assert b" 401 " in head.split(b"\r\n", 1)[0], head
    env = sdk.env()
    import httpx
    r = httpx.get(env["RUNTIME_BASE_URL"] + f"/v1/sandboxes/{sandbox.id}/terminal",
                  headers={"Authorization": f"Bearer {env['RUNTIME_API_KEY']}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    s, head = _connect(sdk, f"/v1/sandboxes/{sandbox.id}/terminal", extra="")
    s.close()
    assert b" 101 " in head


def test_unknown_sandbox_is_an_error_message(sdk):
    s, head = _connect(sdk, "/v1/sandboxes/sbx_00000000000000000000/terminal")
    assert b" 101 " in head.split(b"\r\n", 1)[0], head
    frames = _read_frames(s, 30)
    s.close()
    import json
    err = json.loads([p for op, p in frames if op == 0x1][0])
    assert err["type"] == "error" and err["error"]["code"] == "not_found"



# ---------------------------------------------------------------------------
# The CLI: runtime sandbox shell, driven from a terminal of the test's own


def test_cli_shell_is_interactive_and_restores_the_terminal(sdk, build_dir, sandbox, driver):
    import pty
    import select
    import termios

    env = {**os.environ, **sdk.env()}
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(str(build_dir / "runtime"), ["runtime", "sandbox", "shell", sandbox.id], env)
    before = termios.tcgetattr(fd)

    def read_until(needle: bytes) -> bytes:
        buf, end = b"", time.monotonic() + bound(driver)
        while needle not in buf:
            assert time.monotonic() < end, f"{needle!r} not seen; got {buf[-400:]!r}"
            r, _, _ = select.select([fd], [], [], 0.5)
            if r:
                try:
                    buf += os.read(fd, 65536)
                except OSError:
                    break
        return buf

    try:
        read_until(b"$ ")  # the sandbox user's prompt
        raw = termios.tcgetattr(fd)
        assert not raw[3] & termios.ICANON and not raw[3] & termios.ECHO  # this side in raw mode
        os.write(fd, b"echo $((6*7)); tty\n")
        out = read_until(b"/dev/pts/")
        assert b"42" in out
        # Ctrl-C goes to the sandbox's foreground program, not to the CLI: once Python runs
        # (it says so; its start is slow on gVisor), one ^C is its KeyboardInterrupt.
        os.write(fd, b"python3 -c 'import time; print(\"SLEEP\" + \"ING\", flush=True); time.sleep(600)'\n")
        read_until(b"SLEEPING")
        os.write(fd, b"\x03")
        read_until(b"KeyboardInterrupt")
        os.write(fd, b"exit 5\n")
        read_until(b"logout")
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 5
    after = termios.tcgetattr(fd)
    assert after[3] == before[3] and after[0] == before[0], "the terminal's mode was not restored"
    os.close(fd)


def test_cli_shell_runs_a_command_and_reports_errors(sdk, build_dir, sandbox, driver):
    import subprocess
    env = {**os.environ, **sdk.env()}
    r = subprocess.run([str(build_dir / "runtime"), "sandbox", "shell", sandbox.id, "--", "echo piped; exit 3"],
                       env=env, capture_output=True, timeout=bound(driver), stdin=subprocess.DEVNULL)
    assert r.returncode == 3 and b"piped" in r.stdout, r
    r = subprocess.run([str(build_dir / "runtime"), "sandbox", "shell", "sbx_00000000000000000000"],
                       env=env, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and b"sbx_00000000000000000000" in r.stderr, r


def test_a_stopped_sandbox_ends_its_terminal_with_the_reason(sdk, sandbox, driver):
    import json
    s, head = _connect(sdk, f"/v1/sandboxes/{sandbox.id}/terminal?command=sleep%20600")
    assert b" 101 " in head.split(b"\r\n", 1)[0], head
    s.settimeout(bound(driver))
    first = s.recv(2)  # the ready message: the terminal runs
    assert first[0] == 0x81 and first[1] < 126, first
    ready = b""
    while len(ready) < first[1]:
        ready += s.recv(first[1] - len(ready))
    assert json.loads(ready)["type"] == "ready"
    r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}:stop")
    assert r.status_code == 200, r.text
    frames = _read_frames(s, bound(driver))
    s.close()
    texts = [json.loads(p) for op, p in frames if op == 0x1 and p.startswith(b"{")]
    assert texts and texts[-1]["type"] == "error" and texts[-1]["error"]["code"] == "conflict", frames
    assert frames[-1][0] == 0x8


def test_daemon_stops_cleanly_with_a_terminal_and_a_tunnel_open(fresh_daemon, fresh_api, any_driver):
    sbx = fresh_api.create_sandbox(driver=any_driver)
    term, head = _connect(fresh_daemon, f"/v1/sandboxes/{sbx.id}/terminal?command=sleep%20600")
    assert b" 101 " in head, head
    tunnel, head = _connect(fresh_daemon, f"/v1/sandboxes/{sbx.id}/tunnel")
    assert b" 101 " in head, head
    t0 = time.monotonic()
    assert fresh_daemon.stop(timeout=60) == 0
    assert time.monotonic() - t0 < 60
    for s in (term, tunnel):
        s.settimeout(10)
        try:
            while s.recv(65536):
                pass
        except (ConnectionResetError, socket.timeout):
            pass
        s.close()
    fresh_daemon.start()


def test_one_owner_has_at_most_its_share_of_terminals(sdk, api, sandbox, any_driver):
    # 16 terminals of one owner (its share of the daemon's 64): the 17th is refused naming the
    # owner's own bound, and another owner's terminal opens all the same.
    r = api.post("/v1/keys", json={"name": "other-owner", "owner": "terminals-b"})
    assert r.status_code == 201, r.text
    other_key = r.json()["key"]
    other = Api(sdk, key=other_key)
    theirs = other.create_sandbox(driver=any_driver, timeoutSeconds=300)
    held = []
    try:
        for _ in range(16):
            s, head = _connect(sdk, f"/v1/sandboxes/{sandbox.id}/terminal?command=sleep%20600")
            assert head.startswith(b"HTTP/1.1 101"), head
            held.append(s)
        s, head = _connect(sdk, f"/v1/sandboxes/{sandbox.id}/terminal?command=sleep%20600")
        assert head.startswith(b"HTTP/1.1 101"), head
        frames = _read_frames(s, 30)
        s.close()
        text = b"".join(p for op, p in frames if op == 0x1)
        assert b"rate_limited" in text and b"the most one owner may" in text, frames
        s, head = _connect(sdk, f"/v1/sandboxes/{theirs.id}/terminal?command=echo%20theirs", key=other_key)
        assert head.startswith(b"HTTP/1.1 101"), head
        frames = _read_frames(s, 60)
        s.close()
        assert not any(op == 0x1 and b"rate_limited" in p for op, p in frames), frames
        assert b"theirs" in b"".join(p for _, p in frames), frames
    finally:
        for s in held:
            s.close()
        other.close()
