"""Fixtures of the integration suite. They drive the real runtimed,
runtime-agent and runtime CLI over loopback; nothing of ours is mocked.

  build_dir      (session)  `make -j2` at the repo root once; the build/ path. When
                            the run holds sanitizer_lane items, it then starts their
                            build in the background at low priority, then the fuzz run
                            when the run holds the fuzzers' item (helpers/prebuild.py)
  sanitizer_build (session) that job: .wait() before the lane's own `make`
  image_dir      (session)  $RUNTIME_TEST_IMAGE_DIR or /var/cache/runtime/images,
                            with the `default` image built if missing or stale; then
                            the desktop and analysis images and the packaging test's
                            Debian root and package are made in the background when
                            missing, and the modules that need them run last
                            (helpers/late_images.py)
  daemon         (session)  one runtimed for the whole run
  fresh_daemon   (function) a runtimed of its own (restart and kill tests)
  api            (function) httpx client on `daemon` with its admin key;
                            create_sandbox(**fields) deletes at teardown
  fresh_api      (function) the same on `fresh_daemon`
  driver         (param)    "namespace", "gvisor", "microvm" (or $RUNTIME_TEST_DRIVERS): skipped
                            where the daemon says the driver is unavailable
  any_driver     (function) a usable driver, where which one does not matter
  sandbox        (function) a running sandbox on `driver`, deleted after
  published_client (session) the published withruntime client in a venv of its own
                            (helpers/published.py); .run(daemon, script) runs a script in it

Tests that need a privilege or a tool this machine lacks skip with the
reason; they never pass silently.

The microVM runs under TCG here, several times slower than the other drivers:
a test parametrized over drivers runs its microvm case only when marked
`microvm_subset` (isolation, faults, limits, exec, files and egress basics: what
differs in a VM), unless RUNTIME_TEST_ALL=1, which runs every case everywhere.
Tests written for the microVM alone (test_microvm_basic.py, the microVM faults
in test_heartbeat.py) always run. A driver-parametrized test marked
`driver_independent` checks a client or a wire contract whose answers do not
depend on the driver (the drivers' own behaviour is checked per driver by the
tests it calls on): by default it runs on the first driver under test other
than the microVM, namespace unless RUNTIME_TEST_DRIVERS says otherwise; its
microvm case still follows `microvm_subset`. RUNTIME_TEST_ALL=1 runs them all.

Items marked `sanitizer_lane` (the ASan+UBSan unit tests and the fuzzers of
test_c_suites.py) run after all others, so that their build overlaps the rest
of the run.

Every xfail is strict with a reason (pytest.ini sets xfail_strict; a test
marked otherwise fails).
"""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import (LIVE_DAEMONS, REPO, Api, Daemon, DaemonError, cgroup_dirs,  # noqa: E402
                     cgroup_procs_under, remove_empty_cgroup_tree, skip_unless_driver, tail,
                     first_driver, wait_until)
from helpers.prebuild import Prebuild  # noqa: E402
from helpers import first_image, late_images  # noqa: E402

# RUNTIME_TEST_DRIVERS=namespace narrows the driver-parametrized tests.
DRIVERS = [d for d in os.environ.get("RUNTIME_TEST_DRIVERS", "namespace,gvisor,microvm").split(",") if d]
DEFAULT_IMAGE_DIR = "/var/cache/runtime/images"
# RUNTIME_TEST_ALL=1 runs every driver-parametrized test on the microVM too.
RUN_ALL = os.environ.get("RUNTIME_TEST_ALL") == "1"
MICROVM_SKIP = ("microvm (TCG here) runs only the tests marked microvm_subset; "
                "RUNTIME_TEST_ALL=1 runs this one too")
# Where a `driver_independent` test runs by default: the first driver under
# test other than the emulated microVM (namespace unless RUNTIME_TEST_DRIVERS
# says otherwise).
HOME_DRIVER = next((d for d in DRIVERS if d != "microvm"), None)
INDEPENDENT_SKIP = (f"what this test checks does not depend on the driver: by default it runs on "
                    f"{HOME_DRIVER} only; RUNTIME_TEST_ALL=1 runs it on every driver")
PREBUILD = Prebuild(REPO)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes tens of seconds; deselect with -m 'not slow'")


# What helpers/late_images.py makes in the background; the modules that need
# it run after the others, whole, so that it has the run to finish in.
LATE_FIXTURES = {"desktop_image", "analysis_image", "analysis_sandbox"}
LATE_MODULES = {"test_debian_package.py"}


def _late_modules(items) -> set:
    return {item.path for item in items
            if item.path.name in LATE_MODULES or LATE_FIXTURES & set(getattr(item, "fixturenames", ()))}


def _needs_no_image(item) -> bool:
    """Items that run before the default image is ready (helpers/first_image.py):
    those outside the integration tests, and the release lane's C unit tests but
    the drivers'."""
    if item.path.parent != Path(__file__).parent:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return (item.path.name == "test_c_suites.py" and params.get("lane") == "release"
            and not str(params.get("binary", "test_driver_")).startswith("test_driver_"))


def pytest_collection_modifyitems(config, items):
    # The sanitizer lane runs last: its build runs beside everything before
    # it. Before it, the modules that need the late images. First, what needs
    # no image, while the default image is made.
    late = _late_modules(items)
    items.sort(key=lambda item: (item.get_closest_marker("sanitizer_lane") is not None, item.path in late,
                                 not _needs_no_image(item)))
    if RUN_ALL:
        return
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "microvm" in params.values():
            if item.get_closest_marker("microvm_subset") is None:
                item.add_marker(pytest.mark.skip(reason=MICROVM_SKIP))
        elif (item.get_closest_marker("driver_independent") is not None and HOME_DRIVER is not None
              and any(v in DRIVERS and v != HOME_DRIVER for v in params.values())):
            item.add_marker(pytest.mark.skip(reason=INDEPENDENT_SKIP))


# ---------------------------------------------------------------------------
# Daemon log on failure


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if call.when == "call":
        # Markers applied while the test ran (request.applymarker) count too.
        loose = [m for m in item.iter_markers("xfail")
                 if m.kwargs.get("strict") is not True or not m.kwargs.get("reason")]
        if loose:
            rep.outcome = "failed"
            if hasattr(rep, "wasxfail"):
                del rep.wasxfail
            rep.longrepr = (f"{item.nodeid}: an xfail must say strict=True and give a reason "
                            f"(it hides whatever fails inside it): {loose[0].kwargs}")
    if rep.failed and rep.when in ("setup", "call", "teardown"):
        for d in LIVE_DAEMONS:
            rep.sections.append((f"runtimed log {d.log_path.name} (last 150 lines)",
                                 tail(d.log_path, 150)))


# ---------------------------------------------------------------------------
# Build and image


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("the daemon needs root (cgroups, namespaces, mounts); run the suite as root")


@pytest.fixture(scope="session")
def build_dir(request, tmp_path_factory) -> Path:
    r = subprocess.run(["make", "-j2"], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"`make -j2` failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}",
                    pytrace=False)
    build = REPO / "build"
    for prog in ("runtimed", "runtime-agent", "runtime", "runtime-image-build"):
        if not (build / prog).exists():
            pytest.fail(f"`make` did not produce build/{prog}", pytrace=False)
    items = request.session.items
    if not all(_needs_no_image(item) for item in items):
        microvm = "microvm" in DRIVERS and any("microvm" in item.nodeid and not item.get_closest_marker("skip")
                                               for item in items)
        first_image.JOB.start(build, Path(os.environ.get("RUNTIME_TEST_IMAGE_DIR") or DEFAULT_IMAGE_DIR),
                              tmp_path_factory.getbasetemp() / "first-image.log", microvm)
        request.addfinalizer(first_image.JOB.stop)
    if any(item.get_closest_marker("sanitizer_lane") for item in items):
        PREBUILD.start(tmp_path_factory.getbasetemp() / "sanitizer-prebuild.log",
                       fuzz=any(item.name == "test_fuzzers_over_their_corpora" for item in items))
        request.addfinalizer(PREBUILD.stop)
    return build


@pytest.fixture(scope="session")
def sanitizer_build(build_dir) -> Prebuild:
    """The sanitizer lane's background build (helpers/prebuild.py), waited
    for by the items that need it before their own `make`."""
    return PREBUILD


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the suite (helpers/postgres.py); skips where none can run."""
    from helpers.postgres import PostgresServer, available
    why = available()
    if why:
        pytest.skip(why)
    server = PostgresServer().start()
    yield server
    server.stop()


def _start_late_images(request, tmp_path_factory, tool: Path, d: Path) -> None:
    """Starts helpers/late_images.py's job when this run has a module that needs it."""
    late = _late_modules(request.session.items)
    if not late:
        return
    late_images.JOB.start(tool, d, tmp_path_factory.getbasetemp() / "late-images.log",
                          debian=any(p.name in LATE_MODULES for p in late))
    request.addfinalizer(late_images.JOB.stop)


@pytest.fixture(scope="session")
def image_dir(request, tmp_path_factory, build_dir: Path) -> Path:
    d = Path(os.environ.get("RUNTIME_TEST_IMAGE_DIR") or DEFAULT_IMAGE_DIR)
    tool = build_dir / "runtime-image-build"
    first_image.JOB.wait()
    check = subprocess.run([str(tool), "--check", str(d), "default"], capture_output=True,
                           text=True)
    if check.returncode == 0:
        _start_late_images(request, tmp_path_factory, tool, d)
        return d
    if os.geteuid() != 0:
        pytest.skip(f"image {d}/default is not built and building it needs root")
    if shutil.which("mmdebstrap") is None:
        pytest.skip(f"image {d}/default is not built and mmdebstrap is not installed")
    d.mkdir(parents=True, exist_ok=True)
    build = subprocess.run([str(tool), str(d), "default"], capture_output=True, text=True,
                           timeout=1800)
    if build.returncode != 0:
        pytest.fail(f"runtime-image-build {d} default failed ({build.returncode}):\n"
                    f"{build.stdout[-4000:]}\n{build.stderr[-4000:]}", pytrace=False)
    check = subprocess.run([str(tool), "--check", str(d), "default"], capture_output=True,
                           text=True)
    if check.returncode != 0:
        pytest.fail(f"image built but `--check` still fails: {check.stdout}{check.stderr}",
                    pytrace=False)
    _start_late_images(request, tmp_path_factory, tool, d)
    return d


def _recipe_image(build_dir: Path, image_dir: Path, name: str) -> str:
    """The recipe's image `name` in the suite's image dir, built once when missing or stale, like
    the default one; skips where it cannot be built."""
    tool = build_dir / "runtime-image-build"
    if subprocess.run([str(tool), "--check", str(image_dir), name]).returncode == 0:
        return name
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        pytest.skip(f"image {image_dir}/{name} is not built and building it needs root and mmdebstrap")
    # The background job may be building it: its lock makes this build wait.
    late_images.JOB.hurry()
    build = subprocess.run([str(tool), str(image_dir), name], capture_output=True, text=True,
                           timeout=1800)
    if build.returncode != 0:
        pytest.fail(f"runtime-image-build {image_dir} {name} failed ({build.returncode}):\n"
                    f"{build.stdout[-4000:]}\n{build.stderr[-4000:]}", pytrace=False)
    return name


@pytest.fixture(scope="session")
def analysis_image(build_dir: Path, image_dir: Path) -> str:
    """The `analysis` image (numpy, pandas, matplotlib)."""
    return _recipe_image(build_dir, image_dir, "analysis")


@pytest.fixture(scope="session")
def desktop_image(build_dir: Path, image_dir: Path) -> str:
    """The `desktop` image (Chromium, Xvfb, openbox, xdotool, ffmpeg, noVNC): the browser and
    desktop tests' sandboxes."""
    return _recipe_image(build_dir, image_dir, "desktop")


# ---------------------------------------------------------------------------
# Daemons


def _start_daemon(build_dir: Path, image_dir: Path, state_dir: Path, cgroup_parent: str,
                  extra_args: list[str] | None = None, extra_env: dict[str, str] | None = None,
                  keep_sandboxes: bool = False) -> Daemon:
    _need_root()
    d = Daemon(build_dir, image_dir, state_dir, cgroup_parent, extra_args, extra_env, keep_sandboxes)
    try:
        d.start()
    except DaemonError as e:
        pytest.fail(str(e), pytrace=False)
    return d


def _describe_pid(pid: int) -> str:
    """A leftover process as a reader of a failure needs it: its pid, parent and command line."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        ppid = next(l.split()[1] for l in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if l.startswith("PPid:"))
        return f"{pid} (parent {ppid}): {cmd[:200]}"
    except (OSError, StopIteration):
        return f"{pid} (gone)"


def _two_hosts(build_dir: Path, image_dir: Path, tmp_path: Path, postgres, *, dead_after: int, ids: tuple[str, str],
               secret: str | None = None, extra_args: tuple[str, ...] = ()):
    """Two runtimed hosts of one fleet on a database of their own in `postgres`, sharing one fleet
    secret (`secret`, or a new one) and host a's admin and secrets keys; yields (a, b, db) once each sees both live, and
    stops them after. `ids` are the host ids, also the tail of their cgroup names (a test's own)."""
    db = f"rt_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {db}")
    secret_file = tmp_path / "fleet.secret"
    secret_file.write_text((secret or f"fleet-{uuid.uuid4().hex}") + "\n")
    os.chmod(secret_file, 0o600)
    args = ["--database", postgres.url(db), "--fleet-secret-file", str(secret_file), "--host-dead-after-seconds",
            str(dead_after), *extra_args]
    n = next(_TWO_HOSTS)
    hosts = []
    try:
        a = _start_daemon(build_dir, image_dir, tmp_path / "a", f"runtime-test-{os.getpid()}-{ids[0]}{n}",
                          extra_args=[*args, "--host-id", ids[0]])
        hosts.append(a)
        (tmp_path / "b").mkdir()
        for name in ("admin.key", "secrets.key"):
            (tmp_path / "b" / name).write_text((a.state_dir / name).read_text())
            os.chmod(tmp_path / "b" / name, 0o600)
        b = _start_daemon(build_dir, image_dir, tmp_path / "b", f"runtime-test-{os.getpid()}-{ids[1]}{n}",
                          extra_args=[*args, "--host-id", ids[1]])
        hosts.append(b)
        # Each host sees the other live before a request is sent through it.
        for h in hosts:
            with Api(h) as c:
                wait_until(lambda: len([x for x in c.get("/v1/hosts").json()["hosts"] if x["state"] == "live"]) == 2,
                           20, what="both hosts live")
        yield a, b, db
    finally:
        for h in reversed(hosts):
            _finish_daemon(h)


_TWO_HOSTS = itertools.count()  # cgroup names of one test alone: what one leaves cannot fail the next


def _finish_daemon(d: Daemon) -> None:
    """Stops a daemon at teardown and checks that it went cleanly: exit 0 on
    SIGTERM and no process left in its cgroups."""
    was_alive = d.alive()
    try:
        rc = d.stop()
    except DaemonError as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        if d in LIVE_DAEMONS:
            LIVE_DAEMONS.remove(d)
        d.release_layer_pool()
    left = cgroup_procs_under(cgroup_dirs(d.cgroup_parent))
    leftover_note = remove_empty_cgroup_tree(d.cgroup_parent) if not left else []
    if was_alive and rc != 0:
        pytest.fail(f"runtimed exited with {rc} on SIGTERM; log:\n{tail(d.log_path)}",
                    pytrace=False)
    if not was_alive and d.proc is not None and not getattr(d, "killed", False):
        # Nothing the test did ended it: it died on its own (a crash, an abort).
        pytest.fail(f"runtimed died during the test (exit status {rc}); log:\n{tail(d.log_path)}",
                    pytrace=False)
    if left:
        pytest.fail(f"processes left in cgroup {d.cgroup_parent} after runtimed stopped: "
                    f"{[_describe_pid(p) for p in left]}; runtimed exit status {rc}; log:\n{tail(d.log_path)}",
                    pytrace=False)
    if leftover_note:
        print(f"cgroup dirs left under {d.cgroup_parent}: {leftover_note}", file=sys.stderr)


@pytest.fixture(scope="session")
def daemon(build_dir, image_dir, tmp_path_factory):
    state = tmp_path_factory.mktemp("daemon") / "state"
    d = _start_daemon(build_dir, image_dir, state, f"runtime-test-{os.getpid()}")
    yield d
    _finish_daemon(d)


_fresh_count = 0


@pytest.fixture
def fresh_daemon(build_dir, image_dir, tmp_path):
    """A daemon of its own. Its cgroup parent differs from the shared
    daemon's so that its start-up clean-up can never touch the other's
    sandboxes."""
    global _fresh_count
    _fresh_count += 1
    d = _start_daemon(build_dir, image_dir, tmp_path / "state",
                      f"runtime-test-{os.getpid()}-{_fresh_count}")
    yield d
    if not d.alive():
        # A test that killed it must leave it running again; if not, clean up
        # the sandboxes of that state dir with one more start.
        try:
            d.start()
        except DaemonError:
            pass
    if d.alive():
        with d.client() as c:
            for s in c.get("/v1/sandboxes").json().get("sandboxes", []):
                c.delete(f"/v1/sandboxes/{s['id']}")
    _finish_daemon(d)


@pytest.fixture
def api(daemon):
    c = Api(daemon)
    yield c
    problems = c.delete_all()
    c.close()
    assert daemon.alive(), f"runtimed died during the test; log:\n{tail(daemon.log_path)}"
    assert not problems, problems


@pytest.fixture
def fresh_api(fresh_daemon):
    c = Api(fresh_daemon)
    yield c
    if fresh_daemon.alive():
        c.delete_all()
    c.close()


# ---------------------------------------------------------------------------
# Drivers and sandboxes


_microvm_parts: dict[tuple[Path, str], str | None] = {}


def need_microvm_parts(build_dir: Path, image_dir: Path, image: str = "default") -> None:
    """The image's microVM parts (kernel, modules, root.ext4), made once per
    test run with runtime-microvm-build: a create never builds them. Skips
    when they cannot be made here."""
    if (image_dir, image) not in _microvm_parts:
        first_image.JOB.wait()
        tool = build_dir / "runtime-microvm-build"
        problem = None
        if not tool.exists():
            problem = "build/runtime-microvm-build is missing (the Makefile installs images/microvm/build.sh)"
        elif subprocess.run([str(tool), "--check", str(image_dir), image],
                            capture_output=True).returncode != 0:
            r = subprocess.run([str(tool), str(image_dir), image], capture_output=True, text=True,
                               timeout=1800)
            if r.returncode != 0:
                problem = f"runtime-microvm-build {image} failed ({r.returncode}): {r.stderr[-2000:]}"
        _microvm_parts[(image_dir, image)] = problem
    if _microvm_parts[(image_dir, image)]:
        pytest.skip(_microvm_parts[(image_dir, image)])


@pytest.fixture(params=DRIVERS)
def driver(request, daemon, build_dir, image_dir) -> str:
    skip_unless_driver(daemon, request.param)
    if request.param == "microvm":
        need_microvm_parts(build_dir, image_dir)
    return request.param


@pytest.fixture
def any_driver(daemon) -> str:
    """A usable driver, for tests where which one does not matter."""
    return first_driver(daemon)


@pytest.fixture
def sandbox(api, driver):
    return api.create_sandbox(driver=driver)


# ---------------------------------------------------------------------------
# The published client, for conformance tests


@pytest.fixture(scope="session")
def published_client():
    from helpers.published import PublishedClientUnavailable, ensure_venv, published_client as load
    try:
        client = load(ensure_venv())
    except PublishedClientUnavailable as e:
        pytest.skip(f"the published client cannot be installed here: {e}")
    # Same package name as our SDK: the suite's own interpreter must never hold the other one.
    ours = sys.modules.get("withruntime")
    assert ours is None or str(client.venv) not in str(getattr(ours, "__file__", "")), ours
    return client


@pytest.fixture
def pub(published_client, daemon):
    """Runs a script of the published client against the shared daemon: pub(script, *args) is
    its JSON answer (a sandbox's id is usually the first argument)."""
    def run(script: str, *args: str, **kw):
        return published_client.run_json(daemon, script, args=list(args), **kw)
    return run
