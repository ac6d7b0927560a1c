"""The withruntime SDK against the real daemon: lifecycle, exec (buffered, streamed, argv,
stdin, timeouts, truncation), files, threads, and how it finds the daemon and its key."""
from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))

from withruntime import AsyncSandbox, CommandResult, Sandbox  # noqa: E402
from withruntime.errors import ConflictError, InvalidRequestError, NotFoundError  # noqa: E402


DRIVER: str | None = None


def pick_fast_driver(daemon) -> str | None:
    """namespace or gvisor when the daemon offers one: the daemon's default may be microvm under
    TCG here, seconds per start; the samples that run as written keep the default."""
    r = httpx.get(daemon.base_url + "/v1/info", headers={"Authorization": f"Bearer {daemon.api_key}"})
    available = {d.get("name") for d in r.json().get("drivers", []) if d.get("available")}
    return next((d for d in ("namespace", "gvisor") if d in available), None)


@pytest.fixture
def sdk_env(daemon, monkeypatch):
    global DRIVER
    DRIVER = pick_fast_driver(daemon)
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    return daemon


@pytest.fixture
def sbx(sdk_env):
    with Sandbox.create(driver=DRIVER, timeout_seconds=600, name="sdk-test", labels={"suite": "sdk"}) as s:
        yield s


def test_create_with_the_sample_fields_and_delete_on_exit(sdk_env):
    with Sandbox.create(driver=DRIVER, network={"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"]},
                        timeout_seconds=900, on_lease_end="stop", memory_mib=512,
                        labels={"a": "b"}) as sbx:
        sid = sbx.id
        assert sbx.state == "running"
        assert sbx.network["internet"] is True
        assert sorted(sbx.network["allow"]) == ["*.pythonhosted.org", "pypi.org"]
        assert sbx.on_lease_end == "stop" and sbx.timeout_seconds == 900
        assert sbx.memory_mib == 512 and sbx.labels == {"a": "b"}
        assert sid in [s.id for s in Sandbox.list()]
    with pytest.raises(NotFoundError):
        Sandbox.connect(sid)


def test_keep_and_connect(sdk_env):
    with Sandbox.create(driver=DRIVER, keep=True, timeout_seconds=120) as sbx:
        sid = sbx.id
    try:
        with Sandbox.connect(sid) as again:
            assert again.id == sid and again.state == "running"
            assert again.exec("echo kept").stdout == "kept\n"
        assert Sandbox.connect(sid).state == "running"  # connect's with-block does not delete
    finally:
        Sandbox.connect(sid).delete()


def test_key_from_the_daemons_admin_key_file(sdk_env, monkeypatch):
    monkeypatch.delenv("RUNTIME_API_KEY")
    monkeypatch.setenv("RUNTIME_STATE_DIR", str(sdk_env.state_dir))
    with Sandbox.create(driver=DRIVER, timeout_seconds=60) as sbx:
        assert sbx.exec("echo found").stdout == "found\n"


def test_refresh_extend_stop(sbx):
    before = sbx.lease_ends_at
    sbx.extend(3600)
    assert sbx.lease_ends_at > before
    assert sbx.refresh().state == "running"
    sbx.stop()
    assert sbx.state == "stopped"
    assert sbx.refresh().state == "stopped"
    sbx.stop()  # a no-op
    with pytest.raises(ConflictError):
        sbx.exec("true")
    with pytest.raises(ConflictError):
        sbx.files.read("/workspace/x")


def test_lease_end_stops_it(sdk_env):
    with Sandbox.create(driver=DRIVER, timeout_seconds=1, on_lease_end="stop") as sbx:
        deadline = time.monotonic() + 30
        while sbx.refresh().state == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sbx.state == "stopped"


def test_exec_buffered(sbx):
    r = sbx.exec("echo hi; echo warn >&2; exit 3")
    assert isinstance(r, CommandResult)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "hi\n", "warn\n", False)
    assert not r.stdout_truncated and not r.stderr_truncated and r.duration_ms >= 0
    assert not r.ok and sbx.exec("true").ok


def test_exec_argv_has_no_shell(sbx):
    r = sbx.exec(["printf", "%s|", "a b", "$HOME", "; rm -rf /"])
    assert r.stdout == "a b|$HOME|; rm -rf /|"


def test_exec_cwd_env_stdin(sbx):
    sbx.files.mkdir("/workspace/sub/dir")
    r = sbx.exec("pwd; echo $GREETING; cat", cwd="/workspace/sub/dir", env={"GREETING": "hello"},
                 stdin="from stdin")
    assert r.stdout == "/workspace/sub/dir\nhello\nfrom stdin"
    r = sbx.exec(["python3", "-c", "import sys; print(sys.stdin.buffer.read().hex())"], stdin=b"\x00\xff")
    assert r.stdout.strip() == "00ff"


def test_timeout_is_a_result(sbx):
    t0 = time.monotonic()
    r = sbx.exec("echo started; sleep 30", timeout_seconds=1)
    assert r.timed_out and r.exit_code == 137
    assert r.stdout == "started\n"
    assert time.monotonic() - t0 < 15


def test_truncation_keeps_the_end(sbx):
    r = sbx.exec("seq 1 100000", max_output_bytes=1000)
    assert r.stdout_truncated and len(r.stdout.encode()) <= 1000
    assert r.stdout.endswith("99999\n100000\n")


def test_streaming_callbacks_see_output_as_it_happens(sbx):
    seen = []
    t0 = time.monotonic()
    r = sbx.exec("echo first; sleep 2; echo second; echo err >&2",
                 on_stdout=lambda d: seen.append(("out", d, time.monotonic() - t0)),
                 on_stderr=lambda d: seen.append(("err", d, time.monotonic() - t0)))
    total = time.monotonic() - t0
    assert r.exit_code == 0 and r.stdout == "first\nsecond\n" and r.stderr == "err\n"
    out = "".join(d for k, d, _ in seen if k == "out")
    assert out == "first\nsecond\n"
    first_at = next(t for k, d, t in seen if "first" in d)
    assert first_at < total - 1.5, f"first line arrived at {first_at:.2f}s of {total:.2f}s"


def test_streamed_timeout_is_a_result(sbx):
    r = sbx.exec("echo x; sleep 30", timeout_seconds=1, on_stdout=lambda d: None)
    assert r.timed_out and r.exit_code == 137 and r.stdout == "x\n"


def test_files(sbx):
    f = sbx.files
    w = f.write("/workspace/notes/a.txt", "héllo\n")
    assert (w.path, w.size) == ("/workspace/notes/a.txt", len("héllo\n".encode()))
    assert f.read("/workspace/notes/a.txt") == "héllo\n".encode()
    assert f.read_text("notes/a.txt") == "héllo\n"  # relative to /workspace
    blob = bytes(range(256)) * 1000
    f.write("/workspace/blob.bin", blob)
    assert f.read("/workspace/blob.bin") == blob
    st = f.stat("/workspace/blob.bin")
    assert st.is_file and st.size == len(blob) and st.name == "blob.bin"
    assert f.exists("/workspace/notes") and not f.exists("/workspace/nope")
    names = {e.path for e in f.list("/workspace", depth=2)}
    assert {"/workspace/notes", "/workspace/notes/a.txt", "/workspace/blob.bin"} <= names
    assert {e.path for e in f.list()} >= {"/workspace/notes", "/workspace/blob.bin"}
    f.mkdir("/workspace/d1/d2")
    assert f.stat("/workspace/d1/d2").is_dir
    f.rename("/workspace/notes/a.txt", "/workspace/d1/b.txt")
    assert not f.exists("/workspace/notes/a.txt") and f.read_text("/workspace/d1/b.txt") == "héllo\n"
    with pytest.raises(ConflictError):
        f.remove("/workspace/d1")
    assert f.remove("/workspace/d1", recursive=True) is True
    assert not f.exists("/workspace/d1")
    with pytest.raises(NotFoundError):
        f.read("/workspace/nope")
    assert f.remove("/workspace/nope") is False
    assert f.stat("/workspace/nope") == {"path": "/workspace/nope", "exists": False}
    f.write("/workspace/x.txt", "x")
    f.write("/workspace/y.txt", "y")
    with pytest.raises(ConflictError):
        f.rename("/workspace/x.txt", "/workspace/y.txt")
    f.rename("/workspace/x.txt", "/workspace/y.txt", overwrite=True)
    assert f.read_text("/workspace/y.txt") == "x"
    assert [e["path"] for e in f.glob("**/*.bin")] == ["/workspace/blob.bin"]
    f.write("/workspace/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sbx.exec(["/workspace/run.sh"]).stdout == "ran\n"


def test_multi_mib_writes_arrive_intact(sbx):
    """Bodies over the SDK's 1 MiB slice go out as slices with their length said up front:
    every byte arrives, in order, whatever type the caller handed in."""
    data = os.urandom(5 * 1024 * 1024 + 12345)  # not a multiple of the slice
    want = hashlib.sha256(data).hexdigest()
    for i, body in enumerate((data, bytearray(data), memoryview(data))):
        path = f"/workspace/big{i}.bin"
        res = sbx.files.write(path, body)
        assert res.size == len(data)
        got = sbx.exec(["sha256sum", path]).stdout.split()[0]
        assert got == want, type(body).__name__
    assert sbx.files.read("/workspace/big0.bin") == data

    async def via_async() -> str:
        async with await AsyncSandbox.connect(sbx.id) as asbx:
            await asbx.files.write("/workspace/big-async.bin", bytearray(data))
            return (await asbx.exec(["sha256sum", "/workspace/big-async.bin"])).stdout.split()[0]

    assert asyncio.run(via_async()) == want


def test_exec_sees_written_files_and_back(sbx):
    sbx.files.write("/workspace/in.txt", "3\n4\n")
    sbx.exec("awk '{s+=$1} END {print s}' in.txt > out.txt")
    assert sbx.files.read_text("/workspace/out.txt") == "7\n"


def test_threads_share_one_sandbox(sbx):
    n = 16
    results: dict = {}
    errors: list = []

    def work(i: int) -> None:
        try:
            sbx.files.write(f"/workspace/t{i}.txt", f"thread {i}")
            r = sbx.exec(f"cat t{i}.txt; echo; echo $(( {i} * {i} ))")
            results[i] = r.stdout
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert results == {i: f"thread {i}\n{i * i}\n" for i in range(n)}


def test_bad_values_are_invalid_request(sdk_env):
    with pytest.raises(InvalidRequestError) as ei:
        Sandbox.create(driver=DRIVER, vcpu=10_000)
    assert "vcpu" in ei.value.message
    with pytest.raises(TypeError, match="did you mean 'memory_mib'"):
        Sandbox.create(driver=DRIVER, memory_mb=512)


def test_unix_socket_and_admin_key(build_dir, image_dir, tmp_path, monkeypatch):
    """RUNTIME_BASE_URL=unix:/path, and the key read from the daemon's admin.key."""
    import os
    import signal
    import subprocess

    from helpers import remove_empty_cgroup_tree, wait_until

    sock = tmp_path / "runtimed.sock"
    state = tmp_path / "state"
    cgroup = f"runtime-test-sdk-uds-{os.getpid()}"
    log = open(tmp_path / "runtimed.log", "wb")
    proc = subprocess.Popen([str(build_dir / "runtimed"), "--state-dir", str(state), "--socket", str(sock),
                             "--image-dir", str(image_dir), "--cgroup-parent", cgroup],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        wait_until(lambda: sock.exists() and (state / "admin.key").exists() or proc.poll() is not None, 60,
                   what="the daemon's socket")
        assert proc.poll() is None, (tmp_path / "runtimed.log").read_text()
        monkeypatch.delenv("RUNTIME_API_KEY", raising=False)
        monkeypatch.setenv("RUNTIME_BASE_URL", f"unix:{sock}")
        monkeypatch.setenv("RUNTIME_STATE_DIR", str(state))
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport, base_url="http://runtimed") as c:
            key = (state / "admin.key").read_text().strip()
            info = c.get("/v1/info", headers={"Authorization": f"Bearer {key}"}).json()
        available = {d["name"] for d in info.get("drivers", []) if d.get("available")}
        drv = next((d for d in ("namespace", "gvisor") if d in available), None)
        with Sandbox.create(timeout_seconds=60, driver=drv) as sbx:
            assert sbx.exec("echo over the socket").stdout == "over the socket\n"
            got = []
            assert sbx.exec("echo streamed", on_stdout=got.append).ok and got == ["streamed\n"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        remove_empty_cgroup_tree(cgroup)


def test_get_or_create_list_pages_stop_all_delete_all(sdk_env):
    import secrets as _secrets
    tag = _secrets.token_hex(4)
    name = "sdk-goc-" + tag
    a = Sandbox.get_or_create(name, driver=DRIVER, timeout_seconds=600, labels={"suite": tag})
    b = Sandbox.get_or_create(name, driver=DRIVER, timeout_seconds=600)
    try:
        assert a.id == b.id and a.data["reused"] is False and b.data["reused"] is True
        a.update(labels={"suite": tag, "x": "y"}, timeout_seconds=900)
        assert a.data["labels"] == {"suite": tag, "x": "y"}
        c = Sandbox.create(driver=DRIVER, timeout_seconds=600, labels={"suite": tag, "n": "2"}, keep=True)
        assert [s.id for s in Sandbox.list(labels={"suite": tag}, limit=1)] == [a.id, c.id]  # two pages
        assert [s.id for s in Sandbox.list(labels={"suite": tag, "n": "2"})] == [c.id]
        assert [s.id for s in Sandbox.list(name=name)] == [a.id]
        c.stop()
        assert [s.id for s in Sandbox.list(labels={"suite": tag}, include_stopped=False)] == [a.id]
        assert [s.id for s in Sandbox.list(labels={"suite": tag}, state=["stopped"])] == [c.id]
        with pytest.raises(InvalidRequestError):
            Sandbox.stop_all(labels={})
        assert Sandbox.stop_all(labels={"suite": tag}) == {"stopped": [a.id], "failed": []}
        done = Sandbox.delete_all(labels={"suite": tag})
        assert sorted(done["deleted"]) == sorted([a.id, c.id]) and done["failed"] == []
        assert Sandbox.list(labels={"suite": tag}) == []
    finally:
        for s in (a, b):
            s.close()


def test_archives_upload_download(sbx, tmp_path):
    import io
    import tarfile
    f = sbx.files
    local = tmp_path / "src"
    (local / "pkg").mkdir(parents=True)
    (local / "pkg" / "m.py").write_text("X = 1\n")
    (local / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (local / "run.sh").chmod(0o755)
    f.upload(str(local), "/workspace/up")
    f.upload(str(local / "run.sh"), "/workspace/one.sh")
    assert sbx.exec(["/workspace/up/run.sh"]).stdout == "ran\n"
    assert sbx.exec(["/workspace/one.sh"]).stdout == "ran\n"
    data = f.archive("/workspace/up", exclude=["pkg"])
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
        assert sorted(m.name for m in t.getmembers()) == [".", "./run.sh"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        i = tarfile.TarInfo("a/b.txt")
        i.size = 2
        t.addfile(i, io.BytesIO(b"hi"))
    assert f.unarchive("/workspace/un", buf.getvalue(), gzip=False) == {"path": "/workspace/un", "entries": 1,
                                                                         "bytes": 2}
    with pytest.raises(InvalidRequestError):
        f.unarchive("/workspace/un", buf.getvalue(), gzip=True)
    f.download("/workspace/up", str(tmp_path / "back"))
    assert (tmp_path / "back" / "pkg" / "m.py").read_text() == "X = 1\n"
    f.download("/workspace/un/a/b.txt", str(tmp_path / "b.txt"))
    assert (tmp_path / "b.txt").read_text() == "hi"
    with pytest.raises(NotFoundError):
        f.download("/workspace/nope", str(tmp_path / "nope"))
    # A link out of the directory: refused on this side, nothing written outside.
    sbx.exec("mkdir -p /workspace/evil && ln -s /etc/passwd /workspace/evil/p")
    with pytest.raises(InvalidRequestError):
        f.download("/workspace/evil", str(tmp_path / "evil"))
    assert not (tmp_path / "evil" / "p").exists()


def test_user_and_update_settings_sync_and_async(sdk_env):
    """create(user=...) and update(...) take the published client's names, in both clients."""
    with Sandbox.create(driver=DRIVER, user="root", timeout_seconds=600) as sbx:
        assert sbx.user == "root" and sbx.exec("id -u").stdout == "0\n"
        sbx.update(user="sandbox", env={"A": "1"}, auto_wake=False, idle_pause_seconds=0)
        assert sbx.user == "sandbox" and sbx.data["autoWake"] is False
        assert sbx.exec("id -u; echo $A").stdout == "1000\n1\n"
        with pytest.raises(InvalidRequestError):
            sbx.update(user="admin", env={"A": "2"})
        assert sbx.exec("echo $A").stdout == "1\n"

        async def via_async() -> tuple:
            async with await AsyncSandbox.connect(sbx.id) as asbx:
                await asbx.update(user="root", env={"A": None})
                return asbx.user, (await asbx.exec("id -u; echo ${A-unset}")).stdout

        assert asyncio.run(via_async()) == ("root", "0\nunset\n")
