"""POST /v1/sandboxes/{id}:exec on every driver: buffered and streamed
results, stdin, env, cwd, argv without a shell, truncation, timeouts that
kill the whole process group, and a streaming client that goes away."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import time

import pytest

from helpers import assert_error, wait_until

RESULT_FIELDS = {"exitCode": int, "stdout": str, "stderr": str, "timedOut": bool,
                 "stdoutTruncated": bool, "stderrTruncated": bool, "durationMs": int}


@pytest.mark.microvm_subset
def test_buffered_result_fields(sandbox):
    res = sandbox.exec("echo hi; echo warn >&2; exit 3")
    for name, typ in RESULT_FIELDS.items():
        assert name in res, f"result lacks {name}: {res!r}"
        assert isinstance(res[name], typ) and not (typ is int and isinstance(res[name], bool)), \
            f"{name} is not {typ.__name__}: {res!r}"
    assert res["exitCode"] == 3
    assert res["stdout"] == "hi\n"
    assert res["stderr"] == "warn\n"
    assert res["timedOut"] is False
    assert res["stdoutTruncated"] is False and res["stderrTruncated"] is False
    assert 0 <= res["durationMs"] < 30000


@pytest.mark.microvm_subset
@pytest.mark.parametrize("code", [0, 1, 7, 42, 255])
def test_exit_code_pass_through(sandbox, code):
    assert sandbox.exec(f"exit {code}")["exitCode"] == code


@pytest.mark.microvm_subset
def test_exit_code_of_a_signal(sandbox):
    res = sandbox.exec("kill -9 $$")
    assert res["exitCode"] == 128 + 9, res
    assert res["timedOut"] is False
    res = sandbox.exec(argv=["sh", "-c", "kill -TERM $$"])
    assert res["exitCode"] == 128 + 15, res


@pytest.mark.microvm_subset
def test_program_that_cannot_start(sandbox):
    res = sandbox.exec(argv=["/nonexistent/program", "x"])
    assert res["exitCode"] == 127, res
    assert res["stderr"], "no message on stderr for a missing program"
    sandbox.run("printf 'echo x' > /workspace/noexec.sh; chmod 644 /workspace/noexec.sh")
    res = sandbox.exec(argv=["/workspace/noexec.sh"])
    assert res["exitCode"] == 126, res
    assert res["stderr"]


def test_stderr_separate_and_interleaved(sandbox):
    res = sandbox.exec("for i in 1 2 3; do echo out$i; echo err$i >&2; done")
    assert res["stdout"] == "out1\nout2\nout3\n"
    assert res["stderr"] == "err1\nerr2\nerr3\n"


def test_stdin_text(sandbox):
    text = "hello\nwörld ✓\n" * 100
    res = sandbox.exec(argv=["cat"], stdin=text)
    assert res["exitCode"] == 0
    assert res["stdout"] == text


@pytest.mark.microvm_subset
def test_stdin_base64_binary(sandbox):
    data = os.urandom(256 * 1024) + bytes(range(256))
    res = sandbox.exec("sha256sum | cut -d' ' -f1", stdinBase64=base64.b64encode(data).decode())
    assert res["exitCode"] == 0, res
    assert res["stdout"].strip() == hashlib.sha256(data).hexdigest()


def test_stdin_large(sandbox):
    """docs/api.md allows stdin up to 16 MiB decoded: 4 MiB must go through,
    though the JSON body is then far above the general 1 MiB."""
    data = os.urandom(4 * 1024 * 1024)
    res = sandbox.exec("sha256sum | cut -d' ' -f1", stdinBase64=base64.b64encode(data).decode(),
                       timeoutMs=120000)
    assert res["stdout"].strip() == hashlib.sha256(data).hexdigest()
    text = "line of text\n" * (300 * 1024)  # 3.9 MB
    res = sandbox.exec("wc -c", stdin=text, timeoutMs=120000)
    assert res["stdout"].strip() == str(len(text))


def test_no_stdin_is_dev_null(sandbox):
    """Without stdin the child reads EOF at once instead of hanging."""
    res = sandbox.exec("cat; echo done", timeoutMs=10000)
    assert res["timedOut"] is False
    assert res["stdout"] == "done\n"


@pytest.mark.microvm_subset
def test_env_from_sandbox_and_request(api, driver):
    sbx = api.create_sandbox(driver=driver, env={"SBX_VAR": "from sandbox $HOME", "SHARED": "s"})
    res = sbx.exec('printf "%s|%s|%s" "$SBX_VAR" "$REQ_VAR" "$SHARED"', env={"REQ_VAR": "req 1"})
    assert res["stdout"] == "from sandbox $HOME|req 1|s", res
    # request env is per exec: gone in the next one
    res = sbx.exec('printf "%s" "${REQ_VAR-unset}"')
    assert res["stdout"] == "unset"
    # the agent's base environment
    assert sbx.run("echo $PATH").strip(), "PATH is empty"


@pytest.mark.microvm_subset
def test_cwd(sandbox):
    assert sandbox.run("pwd") == "/workspace\n"
    assert sandbox.run("pwd", cwd="/tmp") == "/tmp\n"
    sandbox.run("mkdir -p /workspace/sub/dir")
    assert sandbox.exec(argv=["pwd"], cwd="/workspace/sub/dir")["stdout"] == "/workspace/sub/dir\n"


def test_bad_cwd_is_a_result(sandbox):
    res = sandbox.exec(argv=["pwd"], cwd="/no/such/dir")
    assert res["exitCode"] == 127, res
    assert res["stderr"]


def test_argv_without_shell(sandbox):
    args = ["a b", "$(echo pwned)", "`id`", "*", "; rm -rf /", "'quoted'", "$HOME", ""]
    res = sandbox.exec(argv=["printf", "[%s]"] + args)
    assert res["exitCode"] == 0, res
    assert res["stdout"] == "".join(f"[{a}]" for a in args)


def test_command_runs_under_bash(sandbox):
    res = sandbox.exec("echo ${BASH_VERSION:+bash}; arr=(1 2 3); echo ${#arr[@]}")
    assert res["stdout"] == "bash\n3\n", res


def test_invalid_utf8_replaced(sandbox):
    res = sandbox.exec(r"printf 'ok\377\376end'")
    assert res["stdout"] == "ok\ufffd\ufffdend", repr(res["stdout"])


def test_python_in_sandbox(sandbox):
    assert sandbox.run("python3 -c 'print(6 * 7)'") == "42\n"


@pytest.mark.microvm_subset
def test_streaming_events_arrive_as_they_happen(sandbox):
    events = list(sandbox.exec_stream(command="echo a; echo e1 >&2; sleep 2; echo b"))
    types = [e["type"] for _, e in events]
    assert types[0] == "start", types
    assert isinstance(events[0][1].get("pid"), int) and events[0][1]["pid"] > 0, events[0]
    assert types[-1] == "exit", types
    assert types.count("exit") == 1
    out = "".join(e["data"] for _, e in events if e["type"] == "stdout")
    err = "".join(e["data"] for _, e in events if e["type"] == "stderr")
    assert out == "a\nb\n" and err == "e1\n", events
    first_out = next(t for t, e in events if e["type"] == "stdout")
    t_exit, exit_ev = events[-1]
    assert t_exit - first_out > 1.0, \
        f"first stdout came {t_exit - first_out:.2f}s before exit: output was not streamed"
    assert exit_ev["exitCode"] == 0 and exit_ev["timedOut"] is False
    assert isinstance(exit_ev["durationMs"], int) and exit_ev["durationMs"] >= 1900, exit_ev


def test_streaming_keeps_everything(sandbox):
    """Nothing is cut in a stream: 1.2 MB arrive whole and in order."""
    events = list(sandbox.exec_stream(command="seq 1 170000", maxOutputBytes=1000))
    out = "".join(e["data"] for _, e in events if e["type"] == "stdout")
    assert out == "".join(f"{i}\n" for i in range(1, 170001))
    assert events[-1][1]["type"] == "exit" and events[-1][1]["exitCode"] == 0


def test_streaming_never_splits_utf8(sandbox):
    # 3-byte characters written in odd-sized pieces.
    events = list(sandbox.exec_stream(
        command="python3 -c \"import sys,time\nb='€'.encode()*5000\n"
                "for i in range(0,len(b),7):\n sys.stdout.buffer.write(b[i:i+7]); sys.stdout.flush()\""))
    chunks = [e["data"] for _, e in events if e["type"] == "stdout"]
    assert "".join(chunks) == "€" * 5000
    assert all("\ufffd" not in c for c in chunks)


def test_output_truncation_keeps_the_tail(sandbox):
    res = sandbox.exec("seq 1 100000", maxOutputBytes=1000)
    assert res["stdoutTruncated"] is True and res["stderrTruncated"] is False
    assert len(res["stdout"].encode()) == 1000
    assert res["stdout"].endswith("99999\n100000\n")
    res = sandbox.exec("seq 1 100000 >&2; echo fine", maxOutputBytes=500)
    assert res["stderrTruncated"] is True and res["stdoutTruncated"] is False
    assert len(res["stderr"].encode()) == 500 and res["stderr"].endswith("100000\n")
    assert res["stdout"] == "fine\n"


def test_output_default_limit_is_64k(sandbox):
    res = sandbox.exec("head -c 300000 /dev/zero | tr '\\0' a; echo END")
    assert res["stdoutTruncated"] is True
    assert len(res["stdout"]) == 65536
    assert res["stdout"].endswith("aaaEND\n")
    res = sandbox.exec("head -c 65536 /dev/zero | tr '\\0' b")
    assert res["stdoutTruncated"] is False and len(res["stdout"]) == 65536


def test_max_output_zero(sandbox):
    res = sandbox.exec("echo something", maxOutputBytes=0)
    assert res["stdout"] == "" and res["stdoutTruncated"] is True and res["exitCode"] == 0


@pytest.mark.microvm_subset
def test_timeout_is_a_result_and_kills_grandchildren(sandbox):
    # An emulated guest on a loaded host may need seconds to start the
    # children before the timeout strikes.
    timeout_ms = 8000 if sandbox.driver == "microvm" else 1000
    t0 = time.monotonic()
    res = sandbox.exec("sleep 1000 & echo $! > /workspace/bg.pid; "
                       "(sleep 1001; echo never) & echo $! > /workspace/sub.pid; sleep 1002",
                       timeoutMs=timeout_ms)
    took = time.monotonic() - t0
    assert res["timedOut"] is True, res
    assert res["exitCode"] == 137, res
    assert took < timeout_ms / 1000 + 9, f"timeout of {timeout_ms} ms took {took:.1f}s"
    assert timeout_ms - 100 <= res["durationMs"] < timeout_ms + 9000, res
    for f in ("bg.pid", "sub.pid"):
        pid = sandbox.run(f"cat /workspace/{f}").strip()
        assert pid.isdigit(), pid

        def gone():
            r = sandbox.exec(f"kill -0 {pid} 2>/dev/null && echo alive; "
                             f"test -e /proc/{pid} && echo proc; true")
            return r["stdout"] == ""
        wait_until(gone, 5, 0.2, what=f"background process {pid} ({f}) to be killed and reaped")
    assert "sleep 100" not in sandbox.run(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")


def test_timeout_while_streaming(sandbox):
    events = list(sandbox.exec_stream(command="echo start; sleep 1000", timeoutMs=800))
    assert events[-1][1]["type"] == "exit", events
    assert events[-1][1]["timedOut"] is True and events[-1][1]["exitCode"] == 137


def _raw_stream_exec(daemon, sid: str, body: dict, until: bytes, timeout: float = 30):
    """Starts a streaming exec on a raw socket and returns once `until` is seen
    in the response, leaving the socket to the caller."""
    payload = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", daemon.port), timeout=timeout)
    s.sendall(f"POST /v1/sandboxes/{sid}:exec HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              f"Authorization: Bearer {daemon.api_key}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    got = b""
    deadline = time.monotonic() + timeout
    while until not in got:
        assert time.monotonic() < deadline, f"never saw {until!r}: {got[-500:]!r}"
        chunk = s.recv(65536)
        assert chunk, f"connection closed before {until!r}: {got[-500:]!r}"
        got += chunk
    return s, got


@pytest.mark.microvm_subset
def test_client_disconnect_leaves_the_process_to_be_followed(sandbox, daemon):
    """A streamed exec is a process: a client that drops the stream resumes from
    its cursor (the published client does) or ends it with a signal."""
    s, got = _raw_stream_exec(daemon, sandbox.id, {
        "command": "sleep 1000 & echo $! > /workspace/dc.pid; echo $$ > /workspace/dc.sh; "
                   "echo ready; wait", "stream": True}, b"ready")
    assert b" 200 " in got.split(b"\r\n", 1)[0], got[:200]
    # Lines, whatever chunks the events came in (one chunk may hold several).
    pid_id = json.loads(next(line for line in got.replace(b"\r\n", b"\n").split(b"\n")
                             if line.startswith(b'{"type":"start"')))["processId"]
    s.close()
    info = sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/processes/{pid_id}").json()
    assert info["state"] == "running", info
    r = sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/processes/{pid_id}/output",
                        params={"cursor": 0, "follow": "false"})
    assert r.status_code == 200 and '"data":"ready\\n"' in r.text, r.text
    pids = [sandbox.run("cat /workspace/dc.pid").strip(), sandbox.run("cat /workspace/dc.sh").strip()]
    r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/processes/{pid_id}:signal", json={"signal": "SIGKILL"})
    assert r.status_code == 200, r.text

    def gone():
        r = sandbox.exec(" ; ".join(f"test -e /proc/{p} && echo {p}" for p in pids) + "; true")
        return r["stdout"] == ""
    wait_until(gone, 10, 0.2, what=f"processes {pids} of a killed process group to be gone")


@pytest.mark.microvm_subset
def test_concurrent_execs_in_one_sandbox(sandbox):
    import concurrent.futures as cf
    t0 = time.monotonic()
    # Each reports when it began and ended its sleep (the guest's uptime):
    # run together, all eight were asleep at one moment, however slow the host.
    cmd = "s=$(cut -d' ' -f1 /proc/uptime); sleep 2; e=$(cut -d' ' -f1 /proc/uptime); echo {i} $s $e"
    with cf.ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(sandbox.exec, cmd.format(i=i)) for i in range(8)]
        outs = [f.result()["stdout"].split() for f in futs]
    took = time.monotonic() - t0
    assert [o[0] for o in outs] == [str(i) for i in range(8)], outs
    starts, ends = [float(o[1]) for o in outs], [float(o[2]) for o in outs]
    assert max(starts) < min(ends), f"8 execs of 2 s took {took:.1f}s: they ran one after another ({outs})"


def test_exec_on_unknown_sandbox(api):
    r = api.post("/v1/sandboxes/sbx_00000000000000000000:exec", json={"command": "true"})
    assert_error(r, 404, "not_found")
