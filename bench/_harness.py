"""What the per-area benchmark scripts (files, lifecycle, processes, terminals,
interpreter, egress) share: their options, the checks and build before a run, a
daemon of their own on a temporary state directory and cgroup, one sandbox per
driver, and the percentile they report. A private module: the scripts import
it, nothing else does."""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from helpers import Api, Daemon, remove_empty_cgroup_tree  # noqa: E402

DRIVERS = "namespace,gvisor,microvm"


def pct(xs: list[float], p: float) -> float:
    """The p-th percentile of xs (nearest rank)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def timed_get(client, url: str, size: int, **kw) -> float:
    """Seconds to stream a GET of url whose body must be size bytes long
    (client: an httpx.Client; kw go to its stream())."""
    t = time.perf_counter()
    got = 0
    with client.stream("GET", url, **kw) as r:
        assert r.status_code == 200, r.read()
        for chunk in r.iter_raw(1 << 20):
            got += len(chunk)
    assert got == size, (got, size)
    return time.perf_counter() - t


def options(doc: str, area: str, quick: str | None = None, drivers: bool = True) -> argparse.ArgumentParser:
    """The options every script takes: --out (its section of
    docs/benchmarks.md, or - to print it), --image-dir, and --quick and
    --drivers where it has them. The caller may add its own and parse."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    if quick:
        ap.add_argument("--quick", action="store_true", help=quick)
    if drivers:
        ap.add_argument("--drivers", default=DRIVERS)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"),
                    help=f"the file whose {area} section is replaced (appended when absent); - prints it")
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    return ap


def prepare(script: str) -> int:
    """0 when the run may start: root (the daemon needs it) and a built tree;
    else the exit code, with the reason on stderr."""
    if os.geteuid() != 0:
        print(f"bench/{script}: run as root (the daemon needs it)", file=sys.stderr)
        return 2
    mk = subprocess.run(["make", "-j2"], cwd=REPO, capture_output=True, text=True)
    if mk.returncode != 0:
        print(mk.stdout[-2000:], mk.stderr[-4000:], file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def bench_daemon(area: str, image_dir: str, tmp: Path | None = None,
                 extra_args: list[str] | None = None, build_dir: Path | None = None) -> Iterator[Daemon]:
    """A started daemon of this tree's build (or of build_dir's) on a state
    directory under tmp (a new temporary directory when None) and a cgroup
    of its own, stopped and its cgroup removed at the end."""
    tmp = tmp or Path(tempfile.mkdtemp(prefix=f"runtime-bench-{area}-"))
    cg = f"runtime-bench-{area}-{os.getpid()}"
    d = Daemon(build_dir or REPO / "build", Path(image_dir), tmp / "state", cg, extra_args=extra_args)
    d.start()
    try:
        yield d
    finally:
        d.stop()
        d.release_layer_pool()
        remove_empty_cgroup_tree(cg)


def per_driver(api: Api, drivers: str, results: dict, **create) -> Iterator[tuple[str, object]]:
    """For each driver named in drivers (comma-separated), a new sandbox made
    with create's fields, deleted after the caller's turn; a driver whose
    create fails gets {"error": ...} in results and no turn."""
    for drv in [x for x in drivers.split(",") if x]:
        try:
            sbx = api.create_sandbox(driver=drv, timeoutSeconds=3600, **create)
        except AssertionError as e:
            results[drv] = {"error": str(e)[:120]}
            continue
        yield drv, sbx
        api.delete(f"/v1/sandboxes/{sbx.id}")


def start_hosts(tmp: Path, image_dir: str, n: int, tag: str, extra_args: list[str],
                per_host=None) -> list[Daemon]:
    """n daemons of this tree's build, host ids <tag>-<i>, each with a state directory under tmp
    and a cgroup of its own. The first makes the admin key and the secrets key; the others get
    them as an operator hands them every host of a fleet. per_host(i), when given, adds host i's
    own arguments."""
    hosts: list[Daemon] = []
    try:
        for i in range(n):
            state = tmp / f"{tag}-{i}"
            if hosts:
                state.mkdir(parents=True)
                for name in ("admin.key", "secrets.key"):
                    (state / name).write_text((hosts[0].state_dir / name).read_text())
                    os.chmod(state / name, 0o600)
            d = Daemon(REPO / "build", Path(image_dir), state, f"runtime-bench-{tag}-{i}-{os.getpid()}",
                       extra_args=[*extra_args, *(per_host(i) if per_host else []), "--host-id", f"{tag}-{i}"])
            d.start()
            hosts.append(d)
    except BaseException:
        stop_hosts(hosts)
        raise
    return hosts


def stop_hosts(hosts: list[Daemon]) -> None:
    for d in reversed(hosts):
        d.stop()
        d.release_layer_pool()
        remove_empty_cgroup_tree(d.cgroup_parent)
