"""Runtime installed like a system service (docs/install.md): the Debian
package builds, lintian finds no error in it, it installs with its
dependencies from Debian's archive into a fresh Debian root made by
debootstrap, and what it installed answers; systemd accepts its unit; the
manual pages render without a warning; the bash completion completes; and
runtimed speaks systemd's notify protocol (READY=1 once /healthz answers,
WATCHDOG=1 pings, STOPPING=1 on SIGTERM).

The package's build and the Debian root are cached under
/var/cache/runtime/packaging: the .deb by the hash of the files it is made
from, the root (debootstrap's minbase) and the downloaded packages for good.
Each run installs into an overlay over the cached root, so every install is
into a fresh root."""
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from helpers import late_images

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("RUNTIME_PACKAGING_CACHE", "/var/cache/runtime/packaging"))
SUITE = "bookworm"
BINARIES = ("/usr/bin/runtimed", "/usr/bin/runtime", "/usr/libexec/runtime/runtime-agent",
            "/usr/libexec/runtime/runtime-egress", "/usr/libexec/runtime/runtime-supervisor")


def need(*tools: str) -> None:
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"{t} is not installed (scripts/install-deps.sh installs it)")


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("building the package in a clean copy, debootstrap and chroot need root")


def run(cmd, timeout=600, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n"
                    f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}", pytrace=False)
    return r


@pytest.fixture(scope="module")
def deb() -> Path:
    """runtime_*.deb, built by `make deb` (dpkg-buildpackage) unless the
    cache holds one of the same inputs (helpers/late_images.py, which the
    suite may have started in the background)."""
    need_root()
    need(*late_images.PACKAGE_TOOLS)
    late_images.JOB.hurry()
    try:
        return late_images.package(CACHE, REPO)
    except subprocess.CalledProcessError as e:
        pytest.fail(f"`make deb` failed ({e.returncode}):\n{(e.stdout or b'')[-8000:].decode(errors='replace')}",
                    pytrace=False)


@pytest.fixture(scope="module")
def unpacked(deb, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("unpacked")
    run(["dpkg-deb", "-x", str(deb), str(root)])
    return root


def debian_root() -> Path:
    """debootstrap's minbase of bookworm, made once (helpers/late_images.py,
    which the suite may have started in the background)."""
    need_root()
    need("debootstrap")
    late_images.JOB.hurry()
    try:
        return late_images.debian_root(CACHE)
    except subprocess.CalledProcessError as e:
        pytest.fail(f"debootstrap failed ({e.returncode}):\n{(e.stderr or b'')[-4000:].decode(errors='replace')}",
                    pytrace=False)


@contextlib.contextmanager
def fresh_root(tmp: Path):
    """An overlay over the cached root: what an install writes goes to tmp
    and is gone after. apt's downloads are kept in the cache."""
    lower = debian_root()
    upper, work, merged = tmp / "upper", tmp / "work", tmp / "root"
    for d in (upper, work, merged):
        d.mkdir()
    archives = CACHE / "apt-archives"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    mounts = []
    try:
        run(["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)])
        mounts.append(merged)
        for src, dst, opts in (("proc", "proc", ["-t", "proc"]),
                               (str(archives), "var/cache/apt/archives", ["--bind"])):
            target = merged / dst
            target.mkdir(parents=True, exist_ok=True)
            run(["mount", *opts, src, str(target)])
            mounts.append(target)
        shutil.copy("/etc/resolv.conf", merged / "etc/resolv.conf")
        # No service starts in a chroot (lxcfs's postinst would try).
        prc = merged / "usr/sbin/policy-rc.d"
        prc.write_text("#!/bin/sh\nexit 101\n")
        prc.chmod(0o755)
        yield merged
    finally:
        for m in reversed(mounts):
            subprocess.run(["umount", "-l", str(m)], capture_output=True)


@pytest.mark.slow
def test_the_package_installs_into_a_fresh_debian_and_its_programs_answer(deb, tmp_path):
    need("chroot")
    with fresh_root(tmp_path) as root:
        shutil.copy(deb, root / "tmp" / deb.name)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")
        env.pop("NOTIFY_SOCKET", None)
        run(["chroot", str(root), "apt-get", "-q", "update"], env=env, timeout=600)
        run(["chroot", str(root), "apt-get", "-q", "-y", "--no-install-recommends", "install",
             f"./tmp/{deb.name}"], cwd=root, env=env, timeout=1200)
        for prog in BINARIES:
            r = run(["chroot", str(root), prog, "--version"])
            assert r.stdout.startswith(Path(prog).name + " "), r.stdout
        for path in ("etc/runtime/runtimed.conf", "lib/systemd/system/runtimed.service",
                     "usr/libexec/runtime/runtime-image-build", "usr/libexec/runtime/runtime-microvm-build",
                     "usr/share/man/man8/runtimed.8.gz", "usr/share/man/man5/runtimed.conf.5.gz",
                     "usr/share/man/man1/runtime.1.gz", "usr/share/bash-completion/completions/runtime",
                     "usr/share/zsh/vendor-completions/_runtime"):
            assert (root / path).exists(), f"the package installed no /{path}"
        assert (root / "var/lib/runtime").stat().st_mode & 0o777 == 0o700
        run(["chroot", str(root), "getent", "passwd", "runtime-egress"])
        # The packaged config file is one runtimed accepts: --doctor reads
        # it (a bad line would end the run with 2, naming the file's line)
        # before it probes the drivers.
        r = subprocess.run(["chroot", str(root), "runtimed", "--config", "/etc/runtime/runtimed.conf",
                            "--doctor", "--json"], capture_output=True, text=True, timeout=300)
        assert r.returncode != 2 and "runtimed.conf:" not in r.stderr, r.stderr
        status = run(["chroot", str(root), "dpkg-query", "-W", "-f=${Status}", "runtime"]).stdout
        assert status == "install ok installed"


@pytest.mark.slow
def test_lintian_finds_no_error(deb):
    need("lintian")
    r = subprocess.run(["lintian", "--fail-on", "error", "--display-info", str(deb)], capture_output=True,
                       text=True, timeout=600)
    errors = [l for l in r.stdout.splitlines() if l.startswith("E:")]
    assert r.returncode == 0 and not errors, r.stdout + r.stderr
    print(r.stdout)


@pytest.mark.slow
def test_systemd_accepts_the_unit(unpacked):
    """systemd-analyze verify over the package's files: the unit's syntax,
    its ExecStart (present and executable), its Documentation= pages. The
    units it orders itself against come from this host's systemd."""
    need("systemd-analyze", "man")
    unit = unpacked / "lib/systemd/system/runtimed.service"
    assert unit.exists()
    for f in Path("/lib/systemd/system").iterdir():
        dst = unpacked / "lib/systemd/system" / f.name
        if not dst.exists() and not dst.is_symlink():
            if f.is_symlink():
                dst.symlink_to(os.readlink(f))
            elif f.is_file():
                shutil.copy2(f, dst)
    env = dict(os.environ, MANPATH=str(unpacked / "usr/share/man"))
    r = subprocess.run(["systemd-analyze", "verify", f"--root={unpacked}", str(unit)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    text = unit.read_text()
    for directive in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "KillMode=process",
                      "ExecStart=/usr/bin/runtimed --config /etc/runtime/runtimed.conf"):
        assert directive in text


def test_the_source_tree_unit_is_the_packaged_one():
    """debian/ installs packaging/runtimed.service as it is."""
    assert "packaging/runtimed.service" in (REPO / "debian/runtime.install").read_text()


@pytest.fixture(scope="module")
def pages(build_dir) -> dict:
    run(["make", "man", "completion"], cwd=REPO)
    return {n: build_dir / "man" / n for n in ("runtimed.8", "runtimed.conf.5", "runtime.1")}


@pytest.mark.parametrize("page", ["runtimed.8", "runtimed.conf.5", "runtime.1"])
def test_the_man_pages_render_without_warnings(pages, page):
    need("groff", "man")
    path = pages[page]
    r = subprocess.run(["groff", "-ww", "-man", "-Tutf8", "-z", str(path)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = run(["man", "-l", str(path)], env=dict(os.environ, MANWIDTH="100")).stdout
    out = re.sub(".\b", "", out)  # man's bold and underline by overstriking
    assert "NAME" in out and "SEE ALSO" in out


def test_the_man_pages_name_every_option_and_command(pages, build_dir):
    help_text = run([str(build_dir / "runtimed"), "--help"]).stdout
    man8 = pages["runtimed.8"].read_text().replace("\\-", "-")
    conf5 = pages["runtimed.conf.5"].read_text().replace("\\-", "-")
    for line in help_text.splitlines():
        if line.startswith("  --"):
            name = line.split()[0][2:]
            assert f"\\fB--{name}\\fR" in man8, name
    assert "\\fBlisten\\fR =" in conf5 and "\\fB--config" not in conf5.split(".SH KEYS")[1]
    man1 = pages["runtime.1"].read_text().replace("\\-", "-")
    cli_help = run([str(build_dir / "runtime"), "--help"]).stdout
    for line in cli_help.split("Commands:")[1].split("Global options")[0].splitlines():
        if line.strip():
            words = line.split()
            cmd = " ".join(words[:2]) if words[0] in ("sandbox", "files", "snapshot", "image", "keys", "hosts", "secrets") \
                else words[0]
            assert f"\\fBruntime {cmd}\\fR" in man1, cmd


def complete(script: Path, *words: str) -> list[str]:
    line = " ".join(words)
    prog = (f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
            f"COMP_LINE='{line}'; _runtime; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    return run(["bash", "-c", prog]).stdout.split()


def test_bash_completes_the_command_table(pages, build_dir):
    script = build_dir / "completion" / "runtime.bash"
    assert "exec" in complete(script, "runtime", "sandbox", "e")
    assert complete(script, "runtime", "sandbox", "exe") == ["exec"]
    assert complete(script, "runtime", "--url", "http://x", "sa") == ["sandbox"]
    assert set(complete(script, "runtime", "secrets", "r")) == {"rotate", "rm"}


def test_zsh_completion_is_made_from_the_table(pages, build_dir):
    text = (build_dir / "completion" / "_runtime").read_text()
    assert text.startswith("#compdef runtime")
    assert "'port-forward:carry a local port" in text
    if shutil.which("zsh"):
        run(["zsh", "-n", str(build_dir / "completion" / "_runtime")])


@contextlib.contextmanager
def notify_socket(tmp: Path):
    path = tmp / "notify"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    s.bind(str(path))
    try:
        yield s, path
    finally:
        s.close()


def wait_message(s: socket.socket, want: str, deadline: float, seen: list[str]) -> None:
    while time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            msg = s.recv(4096).decode()
        except socket.timeout:
            break
        seen.append(msg)
        if want in msg.split("\n"):
            return
    pytest.fail(f"no {want} from runtimed; it sent {seen}", pytrace=False)


def healthz(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
        return int(c.recv(64).split()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runtimed_tells_systemd_ready_watchdog_and_stopping(build_dir, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the daemon needs root (cgroups, namespaces, mounts)")
    port = free_port()
    with notify_socket(tmp_path) as (s, path):
        env = dict(os.environ, NOTIFY_SOCKET=str(path), WATCHDOG_USEC="1000000")
        env.pop("WATCHDOG_PID", None)
        log = (tmp_path / "runtimed.log").open("w")
        proc = subprocess.Popen([str(build_dir / "runtimed"), "--state-dir", str(tmp_path / "state"),
                                 "--listen", f"127.0.0.1:{port}", "--drivers", "namespace",
                                 "--cgroup-parent", f"runtime-test-pkg-{os.getpid()}"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            seen: list[str] = []
            wait_message(s, "READY=1", time.monotonic() + 60, seen)
            # READY=1 comes once the HTTP server listens: it answers now.
            assert healthz(port) == 200
            assert any(l.startswith("STATUS=listening on http://127.0.0.1:") for l in seen[-1].split("\n"))
            # WatchdogSec=1s: a ping every half second while /healthz answers.
            start = time.monotonic()
            wait_message(s, "WATCHDOG=1", start + 5, seen)
            wait_message(s, "WATCHDOG=1", start + 5, seen)
            proc.send_signal(signal.SIGTERM)
            wait_message(s, "STOPPING=1", time.monotonic() + 60, seen)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    shutil.rmtree(f"/sys/fs/cgroup/runtime-test-pkg-{os.getpid()}", ignore_errors=True)


def test_runtimed_without_notify_socket_sends_nothing(build_dir, tmp_path):
    """No NOTIFY_SOCKET: the daemon starts and stops as it always has (its
    log says nothing of a watchdog)."""
    if os.geteuid() != 0:
        pytest.skip("the daemon needs root (cgroups, namespaces, mounts)")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env["WATCHDOG_USEC"] = "1000000"
    proc = subprocess.Popen([str(build_dir / "runtimed"), "--state-dir", str(tmp_path / "state"),
                             "--listen", f"127.0.0.1:{port}", "--drivers", "namespace",
                             "--cgroup-parent", f"runtime-test-pkg-{os.getpid()}-plain"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("runtimed listening on http://127.0.0.1:")
        assert healthz(port) == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "watchdog" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_watchdog_pings_only_while_the_http_server_answers(build_dir, tmp_path):
    """With its one connection held by a request whose body never comes (an
    idle socket is the edge's, which holds it without taking the server's
    connection), the server takes no other, /healthz cannot answer, and the
    pings stop; they resume once the client goes."""
    if os.geteuid() != 0:
        pytest.skip("the daemon needs root (cgroups, namespaces, mounts)")
    port = free_port()
    with notify_socket(tmp_path) as (s, path):
        env = dict(os.environ, NOTIFY_SOCKET=str(path), WATCHDOG_USEC="1000000")
        env.pop("WATCHDOG_PID", None)
        log = (tmp_path / "runtimed.log").open("w")
        proc = subprocess.Popen([str(build_dir / "runtimed"), "--state-dir", str(tmp_path / "state"),
                                 "--listen", f"127.0.0.1:{port}", "--drivers", "namespace",
                                 "--max-connections", "1",
                                 "--cgroup-parent", f"runtime-test-pkg-{os.getpid()}-wd"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            seen: list[str] = []
            wait_message(s, "READY=1", time.monotonic() + 60, seen)
            wait_message(s, "WATCHDOG=1", time.monotonic() + 5, seen)
            hog = socket.create_connection(("127.0.0.1", port))
            hog.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            # Once the daemon logs a failed probe, every ping sent before it
            # is in the socket: drain them; after that, none for three
            # intervals.
            logged = tmp_path / "runtimed.log"
            deadline = time.monotonic() + 10
            while "did not answer 200; no ping" not in logged.read_text():
                assert time.monotonic() < deadline, "the watchdog's probe never failed"
                time.sleep(0.05)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                while True:
                    s.recv(4096)
            s.setblocking(True)
            quiet: list[str] = []
            s.settimeout(3)
            with contextlib.suppress(socket.timeout):
                while True:
                    quiet.append(s.recv(4096).decode())
            assert not [m for m in quiet if "WATCHDOG=1" in m.split("\n")], quiet
            hog.close()
            wait_message(s, "WATCHDOG=1", time.monotonic() + 5, seen)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
