"""Commands and file operations run as the unprivileged `sandbox` user.

The image has a `sandbox` user (uid and gid 1000, home /workspace, which it
owns); every command, process, terminal and file operation runs as that user
unless the request says `user: "root"`. Root inside is still an unprivileged
uid outside (test_isolation.py); the sandbox user is one more step down, so a
command the model writes cannot rewrite the image's system files by accident.
What a request may name as its user is bounded and validated: anything but
"sandbox" and "root" is a 400 in the API's one error shape.
"""
from __future__ import annotations

import io
import tarfile

import pytest

from helpers import assert_error, wait_until

SANDBOX_UID = 1000


@pytest.mark.microvm_subset
def test_default_user_is_sandbox(sandbox):
    res = sandbox.exec("id -u; id -g; id -un; echo $HOME $USER $LOGNAME; pwd")
    assert res["exitCode"] == 0, res
    assert res["stdout"].split() == ["1000", "1000", "sandbox", "/workspace", "sandbox", "sandbox",
                                     "/workspace"], res
    assert res["user"] == "sandbox", res
    # /workspace is its own: it makes files there.
    out = sandbox.run("touch /workspace/mine && stat -c '%u:%g' /workspace /workspace/mine")
    assert out.split() == ["1000:1000", "1000:1000"], out


@pytest.mark.microvm_subset
def test_root_on_request(sandbox):
    res = sandbox.exec("id -u; echo $HOME; touch /etc/by-root && echo made", user="root")
    assert res["exitCode"] == 0, res
    assert res["stdout"].split() == ["0", "/root", "made"], res
    assert res["user"] == "root", res
    # argv too, not only a shell line.
    res = sandbox.exec(argv=["id", "-u"], user="root")
    assert res["stdout"] == "0\n", res


@pytest.mark.microvm_subset
def test_sandbox_user_cannot_write_system_files(sandbox):
    res = sandbox.exec("echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd")
    assert res["exitCode"] != 0, res
    assert "Permission denied" in res["stderr"], res
    res = sandbox.exec("touch /usr/bin/evil; cat /etc/shadow")
    assert res["exitCode"] != 0, res
    assert "sandbox" in sandbox.run("cat /etc/passwd") and "evil" not in sandbox.run("cat /etc/passwd")
    # Nor through the files API, which acts with the same user's rights.
    r = sandbox.put_file("/etc/passwd", b"evil:x:0:0::/:/bin/sh\n")
    assert_error(r, 403, "forbidden")
    assert "evil" not in sandbox.run("cat /etc/passwd")
    r = sandbox.files_call("mkdir", path="/usr/evil")
    assert_error(r, 403, "forbidden")


def test_image_without_the_user_runs_as_root_and_says_so(sandbox):
    """An older or custom image has no `sandbox` user: requests still run, as root, and the
    answers say so. Made here by removing the user from this sandbox's /etc/passwd."""
    sandbox.run("sed -i '/^sandbox:/d' /etc/passwd && ! grep -q '^sandbox:' /etc/passwd", user="root")
    res = sandbox.exec("id -u; echo $HOME")
    assert res["exitCode"] == 0 and res["stdout"] == "0\n/root\n", res
    assert res["user"] == "root", res
    events = [ev for _, ev in sandbox.exec_stream(command="id -u")]
    assert events[0]["type"] == "start" and events[0]["user"] == "root", events
    r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/processes", json={"command": "true"})
    pid = r.json()["id"]
    info = wait_until(lambda: (lambda p: p if p.get("pid") else None)(
        sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/processes/{pid}").json()),
        timeout=60, what="the process to start")
    assert info["user"] == "root", info
    # Files too: written as root, the owner root.
    sandbox.write("/workspace/after.txt", b"x")
    assert sandbox.run("stat -c %u /workspace/after.txt", user="root").strip() == "0"
    # A passwd entry the agent cannot use is a clear 400, not a command run as someone else.
    sandbox.run("echo 'sandbox:x:70000:70000::/workspace:/bin/bash' >> /etc/passwd", user="root")
    assert_error(sandbox.api.post(f"/v1/sandboxes/{sandbox.id}:exec", json={"command": "id -u"}),
                 400, "invalid_request")


def test_user_values_refused(sandbox):
    for bad in ("nobody", "daemon", "Root", "root ", "", "sandbox\u0000", "root\u0000x", "a" * 5000, "0",
                "../root"):
        r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}:exec", json={"command": "id -u", "user": bad})
        assert_error(r, 400, "invalid_request")
    for bad in (0, 1000, True, ["root"], {"name": "root"}):
        r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}:exec", json={"command": "id -u", "user": bad})
        assert_error(r, 400, "invalid_request")
    # Processes, terminals and the files routes take the same two names only.
    r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/processes", json={"command": "true", "user": "nobody"})
    assert_error(r, 400, "invalid_request")
    r = sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/files/content",
                        params={"path": "/workspace/x", "user": "nobody"})
    assert_error(r, 400, "invalid_request")
    r = sandbox.api.put(f"/v1/sandboxes/{sandbox.id}/files/archive",
                        params={"path": "/workspace", "user": "daemon"}, content=b"")
    assert_error(r, 400, "invalid_request")
    # null is the default.
    res = sandbox.exec("id -un", user=None)
    assert res["stdout"] == "sandbox\n", res


def test_processes_and_terminals_follow_the_user(sandbox):
    api = sandbox.api
    r = api.post(f"/v1/sandboxes/{sandbox.id}/processes", json={"command": "id -u"})
    assert r.status_code in (200, 201), r.text
    proc = r.json()
    assert proc["user"] == "sandbox", proc
    r = api.post(f"/v1/sandboxes/{sandbox.id}/processes", json={"command": "id -u", "user": "root"})
    assert r.json()["user"] == "root", r.text
    root_id = r.json()["id"]

    def ended(pid):
        p = api.get(f"/v1/sandboxes/{sandbox.id}/processes/{pid}").json()
        return p if p["state"] != "running" else None

    wait_until(lambda: ended(proc["id"]), timeout=60, what="the sandbox user's process to end")
    wait_until(lambda: ended(root_id), timeout=60, what="root's process to end")
    out = api.get(f"/v1/sandboxes/{sandbox.id}/processes/{proc['id']}/output").text
    assert '"1000\\n"' in out, out
    out = api.get(f"/v1/sandboxes/{sandbox.id}/processes/{root_id}/output").text
    assert '"0\\n"' in out, out
    # A terminal's process: the user runs on a pty it owns.
    r = api.post(f"/v1/sandboxes/{sandbox.id}/processes",
                 json={"command": "id -un; stat -c %u $(tty)", "pty": {"cols": 80, "rows": 24}})
    assert r.json()["user"] == "sandbox", r.text
    tid = r.json()["id"]
    wait_until(lambda: ended(tid), timeout=60, what="the terminal process to end")
    out = api.get(f"/v1/sandboxes/{sandbox.id}/processes/{tid}/output").text
    assert "sandbox" in out and "1000" in out, out


def test_streamed_exec_says_the_user(sandbox):
    events = [ev for _, ev in sandbox.exec_stream(command="id -u", user="root")]
    start = next(ev for ev in events if ev.get("type") == "start")
    assert start["user"] == "root", events
    events = [ev for _, ev in sandbox.exec_stream(command="id -u")]
    start = next(ev for ev in events if ev.get("type") == "start")
    assert start["user"] == "sandbox", events
    assert "".join(ev.get("data", "") for ev in events if ev.get("type") == "stdout") == "1000\n", events


@pytest.mark.microvm_subset
def test_files_api_makes_the_users_files(sandbox):
    sandbox.write("/workspace/deep/er/f.txt", b"hi")
    assert sandbox.run("stat -c '%u:%g' /workspace/deep /workspace/deep/er /workspace/deep/er/f.txt").split() \
        == ["1000:1000"] * 3
    r = sandbox.files_call("mkdir", path="/workspace/m/n")
    assert r.status_code == 200, r.text
    r = sandbox.files_call("rename", **{"from": "/workspace/deep/er/f.txt", "to": "/workspace/m/n/g.txt"})
    assert r.status_code == 200, r.text
    assert sandbox.run("stat -c '%u:%g' /workspace/m /workspace/m/n /workspace/m/n/g.txt").split() \
        == ["1000:1000"] * 3
    # As root when asked: the file is root's, and root may write where the user may not.
    r = sandbox.put_file("/etc/runtime-test.conf", b"x=1\n", user="root")
    assert r.status_code == 200, r.text
    assert sandbox.run("stat -c '%u:%g' /etc/runtime-test.conf").strip() == "0:0"
    # A file only root may read is refused to the default user, read as root.
    sandbox.run("echo secret > /root/only && chmod 600 /root/only", user="root")
    assert_error(sandbox.get_file("/root/only"), 403, "forbidden")
    r = sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/files/content", params={"path": "/root/only", "user": "root"})
    assert r.status_code == 200 and r.content == b"secret\n", r.text


def test_unarchive_owner(sandbox):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"inside\n"
        ti = tarfile.TarInfo("d/a.txt")
        ti.size = len(data)
        ti.uid = ti.gid = 4242  # what the archive says is not who owns it
        tar.addfile(ti, io.BytesIO(data))
    url = f"/v1/sandboxes/{sandbox.id}/files/archive"
    r = sandbox.api.put(url, params={"path": "/workspace/un"}, content=buf.getvalue())
    assert r.status_code == 200, r.text
    assert sandbox.run("stat -c '%u:%g' /workspace/un /workspace/un/d /workspace/un/d/a.txt").split() \
        == ["1000:1000"] * 3
    r = sandbox.api.put(url, params={"path": "/opt/un", "user": "root"}, content=buf.getvalue())
    assert r.status_code == 200, r.text
    assert sandbox.run("stat -c '%u' /opt/un/d/a.txt").strip() == "0"
    # The sandbox user cannot unpack where it may not write.
    r = sandbox.api.put(url, params={"path": "/usr/share/un"}, content=buf.getvalue())
    assert r.status_code >= 400, r.text
    assert sandbox.exec("test -e /usr/share/un/d/a.txt")["exitCode"] != 0


@pytest.mark.microvm_subset
def test_sudo_works_as_sandbox(sandbox):
    # The image's sudo on the microVM, the agent's gateway under no_new_privs (namespace,
    # gVisor): the same answer (test_sudo.py has the rest).
    res = sandbox.exec("sudo -n true && sudo -n id -u")
    assert res["exitCode"] == 0 and res["stdout"] == "0\n", res


def test_interpreter_runs_as_sandbox(sandbox):
    r = sandbox.api.post(f"/v1/sandboxes/{sandbox.id}/interpreter:run",
                         json={"code": "import os; print(os.getuid(), os.environ.get('HOME'))"})
    if r.status_code == 404:
        pytest.skip("no interpreter route on this daemon")
    assert r.status_code == 200, r.text
    assert "1000 /workspace" in r.text, r.text


def test_our_sdk_takes_user(daemon, sandbox, monkeypatch, tmp_path):
    """Our SDK, sync and async: exec, spawn and the files calls name the user as the published
    client's do; the result says who ran it."""
    import asyncio
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
    from withruntime import AsyncSandbox, Sandbox
    from withruntime.errors import InvalidRequestError, PermissionDeniedError
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    with Sandbox.connect(sandbox.id) as sbx:
        r = sbx.exec("id -un")
        assert (r.stdout, r.user) == ("sandbox\n", "sandbox"), r
        r = sbx.exec("id -un", user="root")
        assert (r.stdout, r.user) == ("root\n", "root"), r
        assert sbx.spawn("id -u", user="root").wait().stdout == "0\n"
        sbx.files.write("/workspace/sdk.txt", "x")
        sbx.files.write("/etc/sdk.conf", "y", user="root")
        with pytest.raises(PermissionDeniedError):
            sbx.files.write("/etc/sdk-denied.conf", "z")
        sbx.files.mkdir("/opt/sdkdir", user="root")
        assert sbx.exec("stat -c %U /workspace/sdk.txt /etc/sdk.conf /opt/sdkdir").stdout.split() == \
            ["sandbox", "root", "root"]
        src = tmp_path / "up"
        src.mkdir()
        (src / "f").write_text("up")
        sbx.files.upload(str(src), "/srv/up", user="root")
        assert sbx.exec("stat -c %U /srv/up/f").stdout == "root\n"
        sbx.files.download("/srv/up", str(tmp_path / "down"), user="root")
        assert (tmp_path / "down" / "f").read_text() == "up"
        with pytest.raises(InvalidRequestError):
            sbx.files.read("/workspace/sdk.txt", user="nobody")

    async def run_async():
        async with await AsyncSandbox.connect(sandbox.id) as a:
            r = await a.exec("id -u", user="root")
            assert (r.stdout, r.user) == ("0\n", "root"), r
            await a.files.write("/etc/sdk-async.conf", "y", user="root")
            assert (await a.files.read("/etc/sdk-async.conf", user="root")) == b"y"
            assert (await a.exec("id -u")).stdout == "1000\n"
    asyncio.run(run_async())
