"""`sudo` for the sandbox user on every driver (docs/drivers.md, "sudo").

The image grants its `sandbox` user `ALL=(ALL:ALL) NOPASSWD: ALL`. On the microVM the image's
set-uid sudo does it; on namespace and gVisor the sandbox runs under no_new_privs and the
agent's root gateway does, behind a `sudo` front placed ahead of /usr/bin on PATH. Either way a
command sees what real sudo gives it: root (or -u's user), its exit code, stdin, stdout and
stderr, the working directory, sudo's environment and the caller's signals. The attacks: a
process of another user cannot use the gateway, not even with a client of its own or with
credentials it claims; garbage on the socket harms neither the gateway nor the agent; a
timed-out `sudo sleep` leaves nothing running.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from helpers import read_until, wait_until

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))

from withruntime import Sandbox  # noqa: E402


def bound(driver: str) -> float:
    """Seconds a step may take: the emulated microVM needs far longer under load."""
    return 240.0 if driver == "microvm" else 60.0


@pytest.mark.microvm_subset
def test_sudo_runs_as_root_and_as_another_user(sandbox):
    res = sandbox.exec("sudo id -u; sudo -n true && echo n-ok; sudo -u sandbox id -u; sudo -u sandbox id -un")
    assert res["exitCode"] == 0, res
    assert res["stdout"].split() == ["0", "n-ok", "1000", "sandbox"], res
    assert res["user"] == "sandbox", res


def test_sudo_writes_system_files(sandbox):
    # What `sudo apt-get install` and `sudo pip install` do: write /etc, /usr, /var as root.
    res = sandbox.exec("sudo mkdir -p /usr/local/lib/sudo-made && sudo touch /etc/sudo-made "
                       "/usr/share/sudo-made && echo deb-line | sudo tee /etc/apt/sources.list.d/x.list "
                       ">/dev/null && stat -c '%u' /etc/sudo-made /usr/share/sudo-made "
                       "/usr/local/lib/sudo-made /etc/apt/sources.list.d/x.list")
    assert res["exitCode"] == 0, res
    assert res["stdout"].split() == ["0"] * 4, res
    # Without sudo the same user still cannot.
    assert sandbox.exec("touch /etc/not-without-sudo")["exitCode"] != 0


def test_exit_codes_and_output_pass_through(sandbox):
    res = sandbox.exec("sudo sh -c 'echo out; echo err >&2; exit 7'")
    assert (res["exitCode"], res["stdout"], res["stderr"]) == (7, "out\n", "err\n"), res
    assert sandbox.exec("sudo false")["exitCode"] == 1
    res = sandbox.exec("sudo no-such-command-here")
    assert res["exitCode"] == 1 and "no-such-command-here: command not found" in res["stderr"], res
    # A command killed by a signal: sudo ends by the same signal, as real sudo does.
    res = sandbox.exec("sudo sh -c 'kill -TERM $$'; echo rc=$?")
    assert res["stdout"] == "rc=143\n", res


def test_stdin_is_piped_through(sandbox):
    res = sandbox.exec("sudo cat", stdin="line one\nline two\n")
    assert res["exitCode"] == 0 and res["stdout"] == "line one\nline two\n", res
    res = sandbox.exec("printf 'a\\nb\\n' | sudo tee /etc/piped >/dev/null && cat /etc/piped")
    assert res["stdout"] == "a\nb\n", res


def test_directory_and_environment(sandbox):
    res = sandbox.exec("cd /tmp && sudo pwd; sudo -i pwd; sudo -s pwd")
    assert res["stdout"].split() == ["/tmp", "/root", "/tmp"], res
    env = sandbox.run("FOO=kept-only-with-E sudo env")
    vars_ = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    assert vars_["HOME"] == "/root" and vars_["USER"] == "root" and vars_["LOGNAME"] == "root", env
    assert vars_["SUDO_USER"] == "sandbox" and vars_["SUDO_UID"] == "1000" and vars_["SUDO_GID"] == "1000", env
    assert vars_["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", env
    assert "FOO" not in vars_, env
    # The sandbox's way out (the egress relay) stays: sudo apt-get and pip need it.
    caller = dict(line.split("=", 1) for line in sandbox.run("env").splitlines() if "=" in line)
    if "HTTPS_PROXY" in caller:
        assert vars_.get("HTTPS_PROXY") == caller["HTTPS_PROXY"], env
    assert sandbox.run("FOO=1 sudo -E sh -c 'echo $FOO $HOME'").split() == ["1", "/workspace"]
    assert sandbox.run("FOO=1 BAR=2 sudo --preserve-env=FOO sh -c 'echo $FOO-$BAR'").strip() == "1-"
    assert sandbox.run("sudo FOO=set sh -c 'echo $FOO'").strip() == "set"
    # -i and -s run the shell with the arguments quoted as sudo quotes them.
    assert sandbox.run("sudo -i echo 'a b' '$HOME'").strip() == "a b /root"
    assert sandbox.run("sudo -s id -u").strip() == "0"
    assert sandbox.run("sudo -u sandbox -i sh -c 'echo $HOME $USER'").strip() == "/workspace sandbox"


def test_unsupported_options_are_refused_clearly(sandbox):
    if sandbox.driver == "microvm":
        pytest.skip("the microVM runs the image's own sudo")
    for opt in ("-b", "-g root", "-e", "-D /tmp"):
        res = sandbox.exec(f"sudo {opt} true")
        assert res["exitCode"] == 1 and "not supported" in res["stderr"], (opt, res)
    res = sandbox.exec("sudo")
    assert res["exitCode"] == 1 and "usage" in res["stderr"], res
    assert sandbox.exec("sudo -v && sudo -k && sudo -l")["exitCode"] == 0


def test_timed_out_sudo_leaves_nothing_running(sandbox):
    res = sandbox.exec("sudo sleep 100", timeoutMs=2000)
    assert res["timedOut"] is True, res

    def gone():
        out = sandbox.exec("ps -eo user,args", user="root")["stdout"]
        return "sleep 100" not in out
    wait_until(gone, timeout=bound(sandbox.driver), what="the timed-out sudo's command to end")


def test_ctrl_c_in_a_terminal(sandbox, daemon, monkeypatch):
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    seconds = bound(sandbox.driver)
    with Sandbox.connect(sandbox.id) as sbx:
        # The shell traps SIGINT so that it lives on to print sudo's status (bash -c would
        # end with a child that SIGINT ended, as it does after a plain `cat`).
        with sbx.terminal(command="trap 'echo got-int' INT; echo READY; sudo cat; echo after:$?; "
                                  "sleep 600") as term:
            seen = read_until(term, b"READY", seconds)
            term.write(b"typed\r")
            seen = read_until(term, b"typed\r\ntyped", seconds)
            term.write(b"\x03")
            seen = read_until(term, b"after:130", seconds)
            assert b"after:130" in seen


def test_a_terminal_of_its_own(sandbox, daemon, monkeypatch):
    # Debian's sudoers sets use_pty: in a terminal the command gets one of its own, its
    # controlling terminal, so /dev/tty and an interactive shell's job control work.
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    seconds = bound(sandbox.driver)
    with Sandbox.connect(sandbox.id) as sbx:
        with sbx.terminal(command="sudo sh -c 'tty; echo via-dev-tty >/dev/tty; stty size'; "
                                  "echo status:$?:end; sleep 600", cols=101, rows=33) as term:
            seen = read_until(term, b":end", seconds)
            assert b"/dev/pts/" in seen and b"33 101" in seen, seen
            # gVisor answers an open of /dev/tty with EIO in any terminal, sudo or not.
            if sandbox.driver != "gvisor":
                assert b"via-dev-tty" in seen and b"status:0:end" in seen, seen
        with sbx.terminal(command="sudo -i; echo back:$?; sleep 600") as term:
            term.write(b"echo $((6*7)) $(id -u); sleep 30 & jobs\r")
            # Job control: the background job is listed as one.
            seen = read_until(term, b"Running", seconds)
            assert b"42 0" in seen, seen
            term.write(b"kill %1; exit 5\r")
            seen += read_until(term, b"back:5", seconds)
            assert b"no job control" not in seen, seen


# A client of the gateway's own, run as `nobody`: it claims root's credentials (the kernel
# must refuse to send them), then sends a well-formed request with none (the kernel attaches
# its real ones) for a command that would leave a mark.
NOBODY_CLIENT = r"""
import os, socket, struct, sys
HDR = struct.Struct("=7I")
def request(argv):
    payload = b"\0/\0\0" + b"".join(a.encode() + b"\0" for a in argv)
    return HDR.pack(0x52535544, 1, 0, len(argv), 0, 0, len(payload)), payload
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("/.runtime/sudo.sock")
hdr, payload = request(["touch", "/etc/made-by-nobody"])
try:
    s.sendmsg([hdr], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2)),
                      (socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("3i", os.getpid(), 0, 0))])
    print("claimed-root-sent")
except PermissionError:
    print("claim-refused")
s.close()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("/.runtime/sudo.sock")
s.sendmsg([hdr], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
try:
    s.sendall(payload)
except BrokenPipeError:
    pass  # refused on the header: the answer is already waiting
data = b""
while len(data) < 12:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
print("reply", struct.unpack("=IiI", data[:12])[0] if len(data) >= 12 else None, data[12:].decode(errors="replace"))
"""


def test_other_users_cannot_use_the_gateway(sandbox):
    if sandbox.driver == "microvm":
        pytest.skip("the microVM runs the image's own sudo, no gateway")
    res = sandbox.exec("setpriv --reuid=65534 --regid=65534 --clear-groups sudo id -u", user="root")
    assert res["exitCode"] == 1 and res["stdout"] == "", res
    assert "not in the sudoers file" in res["stderr"], res
    sandbox.write("/tmp/nobody_client.py", NOBODY_CLIENT.encode())
    res = sandbox.exec("setpriv --reuid=65534 --regid=65534 --clear-groups python3 /tmp/nobody_client.py",
                       user="root")
    assert res["exitCode"] == 0, res
    assert "claim-refused" in res["stdout"] and "claimed-root-sent" not in res["stdout"], res
    assert "reply 3 user with uid 65534 is not in the sudoers file" in res["stdout"], res
    assert sandbox.exec("test -e /etc/made-by-nobody", user="root")["exitCode"] == 1
    # The socket is not a way in for the files API's user either: the gateway is the only
    # thing listening, and the sandbox user still gets root through it.
    assert sandbox.run("sudo id -u").strip() == "0"


GARBAGE_CLIENT = r"""
import os, socket, struct
HDR = struct.Struct("=7I")
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("/.runtime/sudo.sock")
    return s
def attempt(f):
    s = conn()
    try:
        f(s)
        s.settimeout(15)
        data = s.recv(4096)
        print("answer", len(data))
    except OSError as e:
        print("error", type(e).__name__)
    finally:
        s.close()
attempt(lambda s: s.sendall(os.urandom(65536)))
attempt(lambda s: s.sendall(b"\0" * 5))
attempt(lambda s: s.shutdown(socket.SHUT_WR))
fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))]
# Counts and lengths past every bound, a wrong magic, a payload that does not add up.
for hdr, payload in [
    (HDR.pack(0x52535544, 1, 0, 1 << 30, 0, 0, 8), b""),
    (HDR.pack(0x52535544, 1, 0, 1, 0, 0, 0xFFFFFFFF), b""),
    (HDR.pack(0x52535544, 1, 0xFF, 1, 0, 0, 8), b""),
    (HDR.pack(0xDEADBEEF, 1, 0, 1, 0, 0, 8), b""),
    (HDR.pack(0x52535544, 1, 0, 2, 0, 0, 8), b"\0/\0\0id\0\0\0"),
    (HDR.pack(0x52535544, 1, 0, 1, 1, 0, 9), b"\0/\0\0id\0noequals"),
    (HDR.pack(0x52535544, 1, 0, 1, 0, 0, 7), b"\0rel\0\0id"),
]:
    attempt(lambda s: (s.sendmsg([hdr], fds), s.sendall(payload)))
# Too few descriptors, too many, none.
for n in (0, 1, 5):
    attempt(lambda s: s.sendmsg([HDR.pack(0x52535544, 1, 0, 1, 0, 0, 7)],
                               [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{n}i", *([0] * n)))] if n else [])
            and s.sendall(b"\0/\0\0id\0"))
print("done")
"""


def test_garbage_on_the_socket_harms_nothing(sandbox):
    if sandbox.driver == "microvm":
        pytest.skip("the microVM runs the image's own sudo, no gateway")
    sandbox.write("/tmp/garbage_client.py", GARBAGE_CLIENT.encode())
    res = sandbox.exec("python3 /tmp/garbage_client.py", timeoutMs=120000)
    assert res["exitCode"] == 0 and "done" in res["stdout"], res
    # Each attempt got a refusal or a closed connection, never a command run.
    assert "Traceback" not in res["stderr"], res
    assert sandbox.run("sudo id -u").strip() == "0"
    assert sandbox.exec("echo agent-alive")["stdout"] == "agent-alive\n"


def test_an_image_or_operator_turns_the_gateway_off(api, sandbox):
    if sandbox.driver == "microvm":
        pytest.skip("the microVM runs the image's own sudo, no gateway")
    # The switch is a file of the image (an image builder's `touch`); made here by root in
    # the sandbox's own files, it takes effect at the next boot from that disk.
    sandbox.exec("touch /.runtime/no-sudo-gateway", user="root")
    r = api.post(f"/v1/sandboxes/{sandbox.id}:stop", json={})
    assert r.status_code == 200, r.text
    r = api.post(f"/v1/sandboxes/{sandbox.id}:restart", json={})
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    res = sandbox.exec("command -v sudo; test -e /.runtime/sudo.sock || echo no-socket; sudo id -u")
    # The image's own sudo again, which no_new_privs stops.
    assert res["stdout"].split() == ["/usr/bin/sudo", "no-socket"], res
    assert res["exitCode"] == 1 and "no new privileges" in res["stderr"], res
    sandbox.exec("rm /.runtime/no-sudo-gateway", user="root")
    assert api.post(f"/v1/sandboxes/{sandbox.id}:restart", json={}).status_code == 200
    assert sandbox.run("sudo id -u").strip() == "0"
