"""The `runtime` CLI against the real daemon: run, exit codes, timeouts,
files, sandbox ls/get/rm, a daemon that is not there, and doctor."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from helpers import free_port, wait_until


@pytest.fixture
def cli(build_dir, daemon):
    def run(*args: str, env: dict | None = None, timeout: float = 120, input: bytes | None = None,
            use_daemon: bool = True) -> subprocess.CompletedProcess:
        e = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        if use_daemon:
            e.update(daemon.env())
        e.update(env or {})
        return subprocess.run([str(build_dir / "runtime"), *args], env=e, capture_output=True,
                              timeout=timeout, input=input)
    return run


def _sandbox_ids(cli) -> set[str]:
    r = cli("--json", "sandbox", "ls")
    assert r.returncode == 0, r.stderr
    return {s["id"] for s in json.loads(r.stdout)["sandboxes"]}


@pytest.mark.microvm_subset
def test_run_prints_42(cli, driver):
    before = _sandbox_ids(cli)
    r = cli("sandbox", "run", "--driver", driver, "--", "python3", "-c", "print(6 * 7)")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == b"42\n", r.stdout
    # run deletes its sandbox
    assert _sandbox_ids(cli) == before


@pytest.mark.parametrize("code", [0, 1, 7, 255])
def test_run_exit_code_pass_through(cli, any_driver, code):
    r = cli("sandbox", "run", "--driver", any_driver, "--", "sh", "-c", f"exit {code}")
    assert r.returncode == code, (r.stdout, r.stderr)


def test_run_streams_stderr(cli, any_driver):
    r = cli("sandbox", "run", "--driver", any_driver, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert r.returncode == 3
    assert r.stdout == b"out\n" and r.stderr == b"err\n", (r.stdout, r.stderr)


def test_run_timeout_is_124(cli, any_driver):
    before = _sandbox_ids(cli)
    r = cli("sandbox", "run", "--driver", any_driver, "--timeout", "1s", "--", "sleep", "30", timeout=60)
    assert r.returncode == 124, (r.returncode, r.stderr)
    assert _sandbox_ids(cli) == before


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_run_reader_that_goes_away_is_141(build_dir, daemon, kind):
    # A reader that stops reading and closes its end: a pipe makes the writer's next write fail
    # with EPIPE; a socket (what many supervisors give a child as its stdout) fails a writer that
    # waits for room with ECONNRESET. Both are the shell's 141, and the run's sandbox is deleted.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}, **daemon.env()}

    def ids() -> set[str]:
        r = subprocess.run([str(build_dir / "runtime"), "--json", "sandbox", "ls"], env=env,
                           capture_output=True, check=True)
        return {s["id"] for s in json.loads(r.stdout)["sandboxes"]}

    def waits_for_room(pid: int) -> bool:
        for w in Path(f"/proc/{pid}/task").glob("*/wchan"):
            try:
                if w.read_text() in ("sock_alloc_send_pskb", "pipe_write", "anon_pipe_write",
                                     "pipe_wait_writable"):
                    return True
            except OSError:
                pass
        return False

    before = ids()
    if kind == "pipe":
        ours, theirs = os.pipe()
    else:
        a, b = socket.socketpair()
        ours, theirs = a.detach(), b.detach()
    p = subprocess.Popen([str(build_dir / "runtime"), "sandbox", "run", "--driver", "namespace", "--",
                          "sh", "-c", "while :; do echo y; done"], stdout=theirs, stderr=subprocess.PIPE,
                         env=env)
    os.close(theirs)
    try:
        assert os.read(ours, 4096), p.stderr.read()
        wait_until(lambda: waits_for_room(p.pid), 30, interval=0.05, what="the CLI to wait for its reader")
    finally:
        os.close(ours)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 141, err.decode()
    wait_until(lambda: ids() == before, 30, what="the run's sandbox to be deleted")


def test_run_argv_is_not_a_shell(cli, any_driver):
    r = cli("sandbox", "run", "--driver", any_driver, "--", "printf", "[%s]", "a b", "$(id)", "*")
    assert r.returncode == 0
    assert r.stdout == b"[a b][$(id)][*]"


def test_create_exec_files_ls_get_rm(cli, tmp_path, driver):
    r = cli("sandbox", "create", "--driver", driver)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    assert sid.startswith("sbx_"), sid
    try:
        assert sid in _sandbox_ids(cli)
        r = cli("sandbox", "ls")
        assert r.returncode == 0 and sid.encode() in r.stdout
        r = cli("sandbox", "get", sid)
        assert r.returncode == 0 and sid.encode() in r.stdout and b"running" in r.stdout
        r = cli("--json", "sandbox", "get", sid)
        assert json.loads(r.stdout)["state"] == "running"

        data = os.urandom(3 * 1024 * 1024) + b"\x00\xff\n"
        src = tmp_path / "in.bin"
        src.write_bytes(data)
        r = cli("files", "put", sid, str(src), "/workspace/sub/in.bin")
        assert r.returncode == 0, r.stderr
        r = cli("sandbox", "exec", sid, "--", "sha256sum", "/workspace/sub/in.bin")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
        dst = tmp_path / "out.bin"
        r = cli("files", "get", sid, "/workspace/sub/in.bin", str(dst))
        assert r.returncode == 0, r.stderr
        assert dst.read_bytes() == data
        r = cli("files", "ls", sid, "/workspace/sub")
        assert r.returncode == 0 and b"in.bin" in r.stdout
        r = cli("files", "get", sid, "/workspace/missing", str(tmp_path / "x"))
        assert r.returncode == 1 and r.stderr, (r.returncode, r.stderr)

        r = cli("sandbox", "exec", sid, "--", "sh", "-c", "exit 9")
        assert r.returncode == 9
    finally:
        r = cli("sandbox", "rm", sid)
    assert r.returncode == 0, r.stderr
    assert sid not in _sandbox_ids(cli)
    r = cli("sandbox", "get", sid)
    assert r.returncode == 1 and r.stderr


def test_bad_id_is_a_usage_error(cli):
    r = cli("sandbox", "get", "../../etc")
    assert r.returncode == 2 and r.stderr


def test_daemon_not_running(cli, tmp_path):
    port = free_port()
    r = cli("sandbox", "ls", use_daemon=False,
            env={"RUNTIME_BASE_URL": f"http://127.0.0.1:{port}", "RUNTIME_API_KEY": "rt_" + "0" * 40},
            timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.decode()
    assert err.startswith("runtime:"), err
    assert f"127.0.0.1:{port}" in err or "connect" in err.lower() or "running" in err.lower(), err
    assert len(err) < 2000
    r = cli("sandbox", "run", "--", "true", use_daemon=False,
            env={"RUNTIME_BASE_URL": f"http://127.0.0.1:{port}", "RUNTIME_API_KEY": "rt_" + "0" * 40})
    assert r.returncode == 1 and r.stderr


def test_wrong_key(cli):
    r = cli("sandbox", "ls", env={"RUNTIME_API_KEY": "rt_" + "0" * 40})
    assert r.returncode == 1
    assert b"runtime:" in r.stderr


def test_key_from_state_dir(cli, daemon):
    """Without RUNTIME_API_KEY the CLI reads $RUNTIME_STATE_DIR/admin.key."""
    e = daemon.env()
    e.pop("RUNTIME_API_KEY")
    r = cli("sandbox", "ls", use_daemon=False, env=e)
    assert r.returncode == 0, r.stderr


def test_usage_errors(cli):
    assert cli("sandbox", "frobnicate").returncode == 2
    assert cli("--no-such-flag").returncode == 2
    r = cli("--help")
    assert r.returncode == 0 and b"sandbox" in r.stdout
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith(b"runtime ")


def test_doctor_runs(cli, daemon):
    r = cli("doctor", timeout=120)
    out = (r.stdout + r.stderr).decode()
    assert r.returncode == 0, f"doctor failed against a healthy daemon ({r.returncode}):\n{out}"
    assert "namespace" in out and "gvisor" in out, out
    assert daemon.base_url in out, out


def test_doctor_without_daemon(cli):
    port = free_port()
    r = cli("doctor", use_daemon=False, timeout=120,
            env={"RUNTIME_BASE_URL": f"http://127.0.0.1:{port}", "RUNTIME_API_KEY": "rt_" + "0" * 40})
    out = (r.stdout + r.stderr).decode()
    assert r.returncode == 1, (r.returncode, out)
    assert f"127.0.0.1:{port}" in out, out


def test_files_cp_directories_both_ways(cli, sandbox, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("X = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("pkg/m.py")
    r = cli("files", "cp", str(src), f"{sandbox.id}:/workspace/dst")
    assert r.returncode == 0, r.stderr
    assert sandbox.run("/workspace/dst/run.sh") == "ran\n"
    assert sandbox.run("cat /workspace/dst/link") == "X = 1\n"
    sandbox.run("mkdir -p /workspace/out/d && printf hi > /workspace/out/d/f.txt && ln -s /etc/passwd /workspace/out/evil")
    out = tmp_path / "got"
    r = cli("files", "cp", f"{sandbox.id}:/workspace/out", str(out))
    # A link out of the directory is refused on this side too: the sandbox's files are not trusted.
    assert r.returncode != 0 and b"leads outside" in r.stderr, (r.stdout, r.stderr)
    assert not (out / "evil").exists() and not (out / "evil").is_symlink()
    sandbox.run("rm /workspace/out/evil")
    r = cli("files", "cp", f"{sandbox.id}:out", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "d" / "f.txt").read_text() == "hi"
    # A single file either way is files get / put.
    r = cli("files", "cp", f"{sandbox.id}:/workspace/out/d/f.txt", str(tmp_path / "one.txt"))
    assert r.returncode == 0 and (tmp_path / "one.txt").read_text() == "hi", r.stderr
    r = cli("files", "cp", str(tmp_path / "one.txt"), f"{sandbox.id}:/workspace/one.txt")
    assert r.returncode == 0 and sandbox.read("/workspace/one.txt") == b"hi", r.stderr
    r = cli("files", "cp", str(src), str(tmp_path / "x"))
    assert r.returncode == 2 and b"ID:PATH" in r.stderr


def test_user_option(cli, sandbox):
    """--user on exec, run, spawn and shell: the sandbox user by default, root when asked."""
    r = cli("sandbox", "exec", sandbox.id, "--", "id", "-un")
    assert r.returncode == 0 and r.stdout == b"sandbox\n", r
    r = cli("sandbox", "exec", "--user", "root", sandbox.id, "--", "id", "-un")
    assert r.returncode == 0 and r.stdout == b"root\n", r
    r = cli("sandbox", "spawn", "--user", "root", sandbox.id, "--", "id -u > /tmp/spawned")
    assert r.returncode == 0 and r.stdout.startswith(b"proc_"), r
    wait_until(lambda: sandbox.exec("cat /tmp/spawned")["stdout"] == "0\n", timeout=60,
               what="the spawned command's file")
    r = cli("sandbox", "shell", "--user", "root", sandbox.id, "--", "id -u", input=b"")
    assert r.returncode == 0 and b"0" in r.stdout, r
    for argv in (("sandbox", "exec", "--user", "nobody", sandbox.id, "--", "true"),
                 ("sandbox", "spawn", "--user", "nobody", sandbox.id, "--", "true"),
                 ("sandbox", "shell", "--user", "", sandbox.id)):
        r = cli(*argv)
        assert r.returncode == 2 and b"--user" in r.stderr, (argv, r)
