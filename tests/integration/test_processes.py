"""Background processes (docs/api.md, Processes) on every driver: spawn returns at once, output
read from a cursor, stdin written in pieces and closed, signals, the bounded ring reporting what
it dropped, a stopped sandbox ending its processes, idempotency keys, limits, and bad input."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
import uuid

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, wait_until


def procs(sandbox) -> str:
    return f"/v1/sandboxes/{sandbox.id}/processes"


def spawn(sandbox, expect=201, headers=None, **body):
    r = sandbox.api.post(procs(sandbox), json=body, headers=headers or {})
    assert r.status_code == expect, r.text
    return r.json()


def events(api, path: str, **params) -> list[dict]:
    with api.stream("GET", path, params=params) as r:
        if r.status_code != 200:
            r.read()
            raise AssertionError(f"GET {path}: {r.status_code} {r.text[:1000]}")
        assert r.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in r.iter_lines() if line.strip()]


def follow(sandbox, pid: str, cursor: int = 0) -> list[dict]:
    return events(sandbox.api, f"{procs(sandbox)}/{pid}/output", cursor=cursor, follow="true")


def text(evs: list[dict], kind: str = "stdout") -> str:
    return "".join(e["data"] for e in evs if e["type"] == kind)


def test_spawn_returns_at_once_and_output_follows(sandbox):
    t0 = time.monotonic()
    info = spawn(sandbox, command="echo one; sleep 2; echo two >&2; exit 4")
    assert time.monotonic() - t0 < 1.5, "spawn waited for the process"
    assert info["id"].startswith("proc_") and info["state"] == "running", info
    assert info["exitCode"] is None
    listed = sandbox.api.get(procs(sandbox)).json()["data"]
    assert [p["id"] for p in listed] == [info["id"]]
    evs = follow(sandbox, info["id"])
    assert text(evs) == "one\n" and text(evs, "stderr") == "two\n", evs
    assert [e["offset"] for e in evs if e["type"] in ("stdout", "stderr")] == [0, 4]
    assert evs[-1]["type"] == "exit" and evs[-1]["exitCode"] == 4 and evs[-1]["state"] == "exited", evs
    assert evs[-1]["timedOut"] is False and evs[-1]["durationMs"] >= 1900
    got = sandbox.api.get(f"{procs(sandbox)}/{info['id']}").json()
    assert got["state"] == "exited" and got["exitCode"] == 4 and got["outputBytes"] == 8, got
    # Finished output stays readable, from any cursor.
    assert text(follow(sandbox, info["id"], cursor=2)) == "e\n"
    # A cursor at the end of a finished process: only its exit.
    assert [e["type"] for e in follow(sandbox, info["id"], cursor=8)] == ["exit"]


def test_cursor_past_the_end_returns_nothing_without_follow(sandbox):
    info = spawn(sandbox, command="echo hi; sleep 30")
    wait_until(lambda: sandbox.api.get(f"{procs(sandbox)}/{info['id']}").json()["outputBytes"] == 3, 20, 0.1,
               what="the first line")
    assert events(sandbox.api, f"{procs(sandbox)}/{info['id']}/output", cursor=3, follow="false") == []
    assert events(sandbox.api, f"{procs(sandbox)}/{info['id']}/output", cursor=10**9, follow="false") == []
    r = sandbox.api.post(f"{procs(sandbox)}/{info['id']}:signal", json={"signal": "SIGKILL"})
    assert r.status_code == 200, r.text


def test_stdin_pipe_write_replay_and_close(sandbox):
    info = spawn(sandbox, command="cat; echo done", stdinMode="pipe")
    path = f"{procs(sandbox)}/{info['id']}:write"
    r = sandbox.api.post(path, json={"base64": base64.b64encode(b"hello ").decode(), "offset": 0})
    assert r.status_code == 200 and r.json() == {"offset": 6}, r.text
    # A retry of the same bytes (the client never saw the answer) is not typed twice.
    r = sandbox.api.post(path, json={"base64": base64.b64encode(b"hello ").decode(), "offset": 0})
    assert r.json() == {"offset": 6}, r.text
    r = sandbox.api.post(path, json={"base64": base64.b64encode(b"x").decode(), "offset": 99})
    assert_error(r, 409, "conflict")
    r = sandbox.api.post(path, json={"data": "world", "offset": 6, "eof": True})
    assert r.json() == {"offset": 11}, r.text
    evs = follow(sandbox, info["id"])
    assert text(evs) == "hello worlddone\n", evs
    r = sandbox.api.post(path, json={"data": "late", "offset": 11})
    assert_error(r, 409, "conflict")


def test_signal_ends_the_process_group(sandbox):
    info = spawn(sandbox, command="sleep 1000 & echo $! > /workspace/child.pid; wait")
    wait_until(lambda: sandbox.exec("test -s /workspace/child.pid")["exitCode"] == 0, 20, 0.1, what="the child")
    child = sandbox.run("cat /workspace/child.pid").strip()
    r = sandbox.api.post(f"{procs(sandbox)}/{info['id']}:signal", json={"signal": "SIGTERM"})
    assert r.status_code == 200, r.text
    evs = follow(sandbox, info["id"])
    assert evs[-1]["type"] == "exit" and evs[-1]["state"] == "killed" and evs[-1]["exitCode"] == 143, evs
    wait_until(lambda: sandbox.exec(f"test -e /proc/{child}")["exitCode"] != 0, 10, 0.2, what="the child gone")
    r = sandbox.api.post(f"{procs(sandbox)}/{info['id']}:signal", json={"signal": "SIGTERM"})
    assert_error(r, 409, "conflict")
    for bad in ({"signal": "SIGSEGV"}, {"signal": 11}, {"signal": "x" * 5000}, {"signal": None},
                {"signal": "TERM", "extra": 1}):
        r = sandbox.api.post(f"{procs(sandbox)}/{info['id']}:signal", json=bad)
        assert_error(r, 400, "invalid_request")


def skip_emulated(driver):
    if driver == "microvm":
        pytest.skip("microvm is emulated here (TCG): tens of MB through it take minutes; namespace and gvisor "
                    "cover the ring")


def test_ring_reports_what_it_dropped(sandbox, driver):
    skip_emulated(driver)
    # 24 MiB with nobody reading: more than a process keeps (8 MiB).
    info = spawn(sandbox, command="head -c 25165824 /dev/zero | tr '\\0' a; echo END")
    wait_until(lambda: sandbox.api.get(f"{procs(sandbox)}/{info['id']}").json()["state"] != "running",
               120, 0.2, what="the writer to end")
    evs = follow(sandbox, info["id"])
    assert evs[0]["type"] == "truncated", evs[0]
    dropped, resume = evs[0]["droppedBytes"], evs[0]["resumeAt"]
    assert dropped == resume and dropped >= 16 * 1024 * 1024, evs[0]
    body = text(evs)
    assert len(body.encode()) + dropped == 25165824 + 4 and body.endswith("aaaEND\n")
    assert evs[-1]["type"] == "exit" and evs[-1]["exitCode"] == 0


def test_a_reader_that_keeps_up_loses_nothing(sandbox, driver):
    skip_emulated(driver)
    info = spawn(sandbox, command="seq 1 3000000")  # 20.9 MB, more than the ring
    evs = follow(sandbox, info["id"])
    assert not [e for e in evs if e["type"] == "truncated"]
    assert text(evs) == "".join(f"{i}\n" for i in range(1, 3000001))


# 100 MiB of ASCII in blocks of 1 MiB, each block a different digest repeated, so that a block
# out of place or a byte lost shows; the program writes the SHA-256 of what it wrote to a file.
BIG_WRITER = """
import hashlib, os
h = hashlib.sha256()
for k in range(100):
    block = hashlib.sha256(str(k).encode()).hexdigest().encode() * 16384
    h.update(block)
    view = memoryview(block)
    while view:
        view = view[os.write(1, view):]
open("/workspace/big.sha256", "w").write(h.hexdigest())
"""


def big_block(k: int) -> bytes:
    return hashlib.sha256(str(k).encode()).hexdigest().encode() * 16384


def test_100_mib_through_the_cursor_complete_in_order_and_bounded(daemon, sandbox, driver):
    """What the cursor gives is what the program wrote, byte for byte and in order (or the loss is
    reported as truncated, for a reader starved past the ring's grace), while the daemon's memory
    stays within a bound far below the 100 MiB that passed through it."""
    skip_emulated(driver)
    total = 100 << 20
    rss = [daemon.rss_kib()]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.1):
            rss.append(daemon.rss_kib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        info = spawn(sandbox, argv=["python3", "-c", BIG_WRITER])
        h = hashlib.sha256()
        at = dropped = 0
        exits = []
        cursor = 0
        while True:
            resumed = False
            with sandbox.api.stream("GET", f"{procs(sandbox)}/{info['id']}/output",
                                    params={"cursor": cursor, "follow": "true"}, timeout=600) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    ev = json.loads(line)
                    if ev["type"] == "stdout":
                        data = ev["data"].encode()
                        assert "base64" not in ev and ev["offset"] == at, (ev["offset"], at)
                        k, off = divmod(at, 1 << 20)
                        want = b"".join(big_block(j) for j in range(k, min(100, k + 2 + len(data) // (1 << 20))))
                        assert data == want[off:off + len(data)], f"bytes at offset {at} differ"
                        h.update(data)
                        at += len(data)
                    elif ev["type"] == "truncated":
                        assert ev["resumeAt"] == at + ev["droppedBytes"], ev
                        dropped += ev["droppedBytes"]
                        at = ev["resumeAt"]
                    elif ev["type"] == "continue":
                        cursor, resumed = ev["cursor"], True
                    elif ev["type"] == "exit":
                        exits.append(ev)
                    else:
                        pytest.fail(f"an event the program cannot have caused: {ev}")
            if not resumed:
                break
    finally:
        stop.set()
        sampler.join()
    assert exits and exits[-1]["exitCode"] == 0, exits
    assert at == total, (at, dropped)
    r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}:exec", json={"argv": ["cat", "/workspace/big.sha256"]})
    if dropped == 0:
        assert h.hexdigest() == r.json()["stdout"], "the cursor's bytes are not what the program wrote"
    # The ring (8 MiB), a window of the channel (1 MiB), the reply's buffer (2 MiB) and the
    # allocator's slack: far below what went through.
    grown = (max(rss) - rss[0]) / 1024
    assert grown < 48, f"the daemon grew by {grown:.0f} MiB while 100 MiB went through it"


def test_binary_output_carries_base64(sandbox):
    info = spawn(sandbox, argv=["printf", "ok\\377\\376end"])
    evs = follow(sandbox, info["id"])
    out = [e for e in evs if e["type"] == "stdout"]
    raw = b"".join(base64.b64decode(e["base64"]) if "base64" in e else e["data"].encode() for e in out)
    assert raw == b"ok\xff\xfeend", out
    assert any("\ufffd" in e["data"] for e in out)
    info = spawn(sandbox, command="echo plain", outputEncoding="base64")
    out = [e for e in follow(sandbox, info["id"]) if e["type"] == "stdout"]
    assert base64.b64decode(out[0]["base64"]) == b"plain\n" and out[0]["data"] == "plain\n"


def test_every_byte_value_survives_the_cursor(sandbox):
    """The escaping of output lines works in words of 8 bytes: quotes, backslashes, control and
    non-ASCII bytes at every offset within a word come back as they were written."""
    prog = ("import sys\n"
            "for shift in range(9):\n"
            "    sys.stdout.buffer.write(b'x' * shift + bytes(range(256)) + b'\"\\\\' + 'é€😀'.encode() + b'abcdefgh' * 3)\n")
    expected = b"".join(b"x" * shift + bytes(range(256)) + b'"\\' + "é€😀".encode() + b"abcdefgh" * 3
                        for shift in range(9))
    info = spawn(sandbox, argv=["python3", "-c", prog])
    out = [e for e in follow(sandbox, info["id"]) if e["type"] == "stdout"]
    raw = b"".join(base64.b64decode(e["base64"]) if "base64" in e else e["data"].encode() for e in out)
    assert raw == expected
    # Valid UTF-8 with every escape JSON has, at each offset in a word: the text is the bytes.
    text_prog = ("import sys\n"
                 "for shift in range(9):\n"
                 "    sys.stdout.write('y' * shift + ''.join(map(chr, range(1, 128))) + '\"\\\\é€😀' + 'abcdefgh' * 3)\n")
    want = "".join("y" * shift + "".join(map(chr, range(1, 128))) + '"\\é€😀' + "abcdefgh" * 3 for shift in range(9))
    info = spawn(sandbox, argv=["python3", "-c", text_prog])
    out = [e for e in follow(sandbox, info["id"]) if e["type"] == "stdout"]
    assert not any("base64" in e for e in out)
    assert "".join(e["data"] for e in out) == want


def test_stopped_sandbox_ends_its_processes(api, driver):
    sbx = api.create_sandbox(driver=driver)
    info = spawn(sbx, command="echo before; sleep 1000")
    wait_until(lambda: api.get(f"{procs(sbx)}/{info['id']}").json()["outputBytes"] == 7, 30, 0.1,
               what="its first line")
    r = api.post(f"/v1/sandboxes/{sbx.id}:stop")
    assert r.status_code == 200, r.text
    evs = follow(sbx, info["id"])
    assert text(evs) == "before\n", evs
    assert evs[-1]["type"] == "error" and evs[-1]["error"]["code"] == "conflict", evs
    assert "stopped" in evs[-1]["error"]["message"]
    assert api.get(f"/v1/sandboxes/{sbx.id}/processes/{info['id']}").json()["state"] == "lost"
    r = api.delete(f"/v1/sandboxes/{sbx.id}")
    assert r.status_code == 200
    assert_error(api.get(f"/v1/sandboxes/{sbx.id}/processes/{info['id']}"), 404, "not_found")


def test_idempotency_key(sandbox):
    # Keys are the owner's, across its sandboxes: each run of this test takes new ones.
    key = {"Idempotency-Key": f"spawn-once-{uuid.uuid4().hex}"}
    first = spawn(sandbox, headers=key, command="echo $RANDOM$RANDOM")
    again = spawn(sandbox, expect=200, headers=key, command="echo $RANDOM$RANDOM")
    assert again["id"] == first["id"] and again.get("replayed") is True
    r = sandbox.api.post(procs(sandbox), json={"command": "echo other"}, headers=key)
    assert_error(r, 409, "conflict")
    r = sandbox.api.post(procs(sandbox), json={"command": "true"}, headers={"Idempotency-Key": "bad key!"})
    assert_error(r, 400, "invalid_request")
    assert len(sandbox.api.get(procs(sandbox)).json()["data"]) == 1
    # A streamed exec under a key already used gives back the first run.
    body = {"command": "echo streamed-$RANDOM", "stream": True}
    exec_key = f"exec-once-{uuid.uuid4().hex}"
    runs = []
    for _ in range(2):
        with sandbox.api.stream("POST", f"/v1/sandboxes/{sandbox.id}:exec", json=body,
                                headers={"Idempotency-Key": exec_key}) as r:
            runs.append([json.loads(x) for x in r.iter_lines() if x.strip()])
    assert runs[0][0]["processId"] == runs[1][0]["processId"] and runs[1][0]["replayed"] is True
    assert text(runs[0]) == text(runs[1])


def test_running_limit(api, any_driver):
    sbx = api.create_sandbox(driver=any_driver)
    ids = [spawn(sbx, command="sleep 1000")["id"] for _ in range(32)]
    r = api.post(procs(sbx), json={"command": "true"})
    assert_error(r, 429, "rate_limited")
    api.post(f"{procs(sbx)}/{ids[0]}:signal", json={"signal": "KILL"})
    wait_until(lambda: api.get(f"{procs(sbx)}/{ids[0]}").json()["state"] != "running", 20, 0.1,
               what="the killed process to end")
    spawn(sbx, command="true")


def test_bad_input(sandbox):
    info = spawn(sandbox, command="true")
    base = f"{procs(sandbox)}/{info['id']}"
    for cursor in ("-1", "abc", "1.5", "1e3", " 1", "99999999999999999999"):
        assert_error(sandbox.api.get(f"{base}/output", params={"cursor": cursor}), 400, "invalid_request")
    assert_error(sandbox.api.get(f"{base}/output", params={"follow": "maybe"}), 400, "invalid_request")
    assert_error(sandbox.api.get(f"{procs(sandbox)}/proc_0000000000000000"), 404, "not_found")
    assert_error(sandbox.api.get(f"{procs(sandbox)}/proc_0000000000000000/output"), 404, "not_found")
    assert_error(sandbox.api.get(f"{procs(sandbox)}/proc_../output"), 404, "not_found")
    assert_error(sandbox.api.get(f"{procs(sandbox)}/{'a' * 500}"), 404, "not_found")
    for body in ({}, {"command": ""}, {"command": "true", "pty": {"cols": 0, "rows": 24}},
                 {"command": "true", "stdinMode": "file"}, {"command": "true", "stdin": "x", "stdinMode": "pipe"},
                 {"command": "true", "user": "nobody"}, {"command": "true", "user": 0},
                 {"command": "true", "outputEncoding": "latin1"}, {"command": "true", "stream": True}):
        assert_error(sandbox.api.post(procs(sandbox), json=body), 400, "invalid_request")
    for body in ({"base64": "!!"}, {"base64": 1}, {"data": "x", "base64": "eA=="}, {"offset": -2},
                 {"offset": "0"}, {"eof": "yes"}):
        assert_error(sandbox.api.post(f"{base}:write", json=body), 400, "invalid_request")
    assert_error(sandbox.api.post(f"{base}:wait", json={"timeoutMs": -1}), 400, "invalid_request")
    # A read key lists and looks, but cannot start or signal.
    assert sandbox.exec("true", user="root")["exitCode"] == 0


@pytest.fixture
def short_stream_daemon(build_dir, image_dir, tmp_path):
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-short-{time.time_ns()}",
                      extra_env={"RUNTIME_TEST_STREAM_MAX_BYTES": "100000"})
    c = Api(d)
    yield c
    c.delete_all()
    c.close()
    _finish_daemon(d)


def test_long_stream_ends_with_continue(short_stream_daemon, any_driver):
    api = short_stream_daemon
    sbx = api.create_sandbox(driver=any_driver)
    evs = [e for _, e in sbx.exec_stream(command="seq 1 100000")]
    assert evs[0]["type"] == "start" and evs[-1]["type"] == "continue", evs[-1]
    assert evs[-1]["processId"] == evs[0]["processId"]
    got = text(evs)
    assert evs[-1]["cursor"] == len(got.encode()) >= 100000
    rest = []
    cursor = evs[-1]["cursor"]
    while True:
        more = follow(sbx, evs[0]["processId"], cursor=cursor)
        rest += [e for e in more if e["type"] != "continue"]
        if more[-1]["type"] != "continue":
            break
        cursor = more[-1]["cursor"]
    assert got + text(rest) == "".join(f"{i}\n" for i in range(1, 100001))
    assert rest[-1]["type"] == "exit" and rest[-1]["exitCode"] == 0


def _cpu_ticks(pids: list[int]) -> int:
    total = 0
    for p in pids:
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


def test_the_agent_waits_for_a_full_channel(build_dir, image_dir, tmp_path):
    """Output towards a daemon that reads nothing (stopped with SIGSTOP) fills the agent's channel:
    the agent then waits for room, using no CPU (it once polled without waiting and spun a whole
    core), and once the daemon reads again every process's output arrives and each ends."""
    import signal
    from helpers import host_pids, skip_unless_driver
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-fullchan-{time.time_ns()}")
    c = Api(d)
    try:
        skip_unless_driver(d, "namespace")
        sbx = c.create_sandbox(driver="namespace")
        agents = [p for p in host_pids(sbx.id) if open(f"/proc/{p}/comm").read().strip() == "agent"]
        assert agents, host_pids(sbx.id)
        # More than the channel holds: each stream may send a window (1 MiB) unacknowledged.
        ids = [spawn(sbx, argv=["sh", "-c", "yes | head -c 3000000"])["id"] for _ in range(12)]
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            def idle() -> bool:
                before = _cpu_ticks(agents)
                time.sleep(0.5)
                return _cpu_ticks(agents) - before <= 5  # at most 50 ms of CPU in 0.5 s
            wait_until(idle, timeout=20, what="the agent to wait without CPU while its channel is full")
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        for pid in ids:
            r = c.post(f"{procs(sbx)}/{pid}:wait", json={"timeoutMs": 60000})
            assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text
            assert c.get(f"{procs(sbx)}/{pid}").json()["outputBytes"] == 3000000
    finally:
        c.delete_all()
        c.close()
        _finish_daemon(d)
