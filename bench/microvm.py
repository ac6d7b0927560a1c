#!/usr/bin/env python3
"""The microVM driver next to the namespace and gVisor drivers, in one run:
cold boot to the first exec result, restore (from the shape's template) to
the first exec result, the exec round trip of `true`, and
`python3 -c 'print(6*7)'` inside against the bare host.

    sudo python3 bench/microvm.py                 # writes the microVM section of docs/benchmarks.md
    sudo python3 bench/microvm.py --quick --out -  # fewer runs, print the section

Two daemons run side by side on the same build and images: one as shipped
(a sandbox's first start restores its shape's template) and one with
RUNTIME_MICROVM_SNAPSHOTS=0 (every start boots). The accelerator is the one
the driver's probe picks: TCG on a host where KVM does not boot a guest, KVM
where it does (set RUNTIME_MICROVM_ACCEL=kvm to insist). The same command
gives the KVM figures on a KVM host. Needs root, a built tree (it runs
`make`) and the default image; the microVM parts of the image are built on
first use.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "bench"))

from helpers import Api, Daemon, remove_empty_cgroup_tree  # noqa: E402
from sections import emit  # noqa: E402

BEGIN = "<!-- microvm benchmark: begin (bench/microvm.py) -->"
END = "<!-- microvm benchmark: end -->"
HOST_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
SHAPE = {"memoryMiB": 512, "diskMiB": 256}


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x >= 0.1 else f"{x * 1000:.1f} ms"


def first_exec(api: Api, driver: str) -> tuple[float, object]:
    t = time.monotonic()
    sbx = api.create_sandbox(driver=driver, **SHAPE)
    res = sbx.exec(argv=["true"])
    took = time.monotonic() - t
    assert res["exitCode"] == 0, res
    return took, sbx


def drop(api: Api, sbx) -> None:
    assert api.delete(f"/v1/sandboxes/{sbx.id}").status_code == 200
    api.created.remove(sbx.id)


def creates(api: Api, driver: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        took, sbx = first_exec(api, driver)
        out.append(took)
        drop(api, sbx)
    return out


def in_sandbox(api: Api, driver: str, n_exec: int, n_py: int) -> tuple[list[float], list[float]]:
    _, sbx = first_exec(api, driver)
    sbx.exec(argv=["python3", "-c", "pass"])  # warm the page cache (and, under TCG, the translations)
    rt, py = [], []
    for _ in range(n_exec):
        t = time.monotonic()
        assert sbx.exec(argv=["true"])["exitCode"] == 0
        rt.append(time.monotonic() - t)
    for _ in range(n_py):
        t = time.monotonic()
        assert sbx.exec(argv=["python3", "-c", "print(6*7)"])["stdout"] == "42\n"
        py.append(time.monotonic() - t)
    drop(api, sbx)
    return rt, py


def template_dirs(image_dir: Path) -> Path:
    return image_dir / "default" / "microvm" / "templates"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"),
                    help="the file whose microVM section is replaced (appended when absent); - prints it")
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    ap.add_argument("--quick", action="store_true", help="fewer runs")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/microvm.py: run as root (the daemon needs it)", file=sys.stderr)
        return 2
    n_create, n_exec, n_py, n_host = (3, 10, 5, 10) if args.quick else (8, 30, 10, 20)
    mk = subprocess.run(["make", "-j2"], cwd=REPO, capture_output=True, text=True)
    if mk.returncode != 0:
        print(mk.stdout[-2000:], mk.stderr[-4000:], file=sys.stderr)
        return 1

    image_dir = Path(args.image_dir)
    # The image's microVM parts, as the image build makes them: a create never builds them.
    parts = subprocess.run([str(REPO / "build" / "runtime-microvm-build"), str(image_dir), "default"],
                           capture_output=True, text=True)
    if parts.returncode != 0:
        print(parts.stderr[-4000:], file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="runtime-bench-microvm-"))
    cg = f"runtime-bench-microvm-{os.getpid()}"
    warm = Daemon(REPO / "build", image_dir, tmp / "warm", cg + "-w")
    cold = Daemon(REPO / "build", image_dir, tmp / "cold", cg + "-c",
                  extra_env={"RUNTIME_MICROVM_SNAPSHOTS": "0"})
    rows: dict[str, dict] = {}
    load0 = os.getloadavg()[0]
    try:
        warm.start()
        cold.start()
        wa, ca = Api(warm, timeout=600), Api(cold, timeout=600)
        drivers = {d["name"]: d for d in wa.get("/v1/info").json().get("drivers", [])}
        if not drivers.get("microvm", {}).get("available"):
            print(f"bench/microvm.py: the microvm driver is unavailable: {drivers.get('microvm')}",
                  file=sys.stderr)
            return 1
        accel = drivers["microvm"].get("reason") or drivers["microvm"].get("detail") or ""

        host = []
        for _ in range(n_host):
            t = time.monotonic()
            subprocess.run([HOST_PYTHON, "-c", "print(6*7)"], check=True, capture_output=True)
            host.append(time.monotonic() - t)
        rows["host"] = {"py": host}

        for drv in ("namespace", "gvisor"):
            if not drivers.get(drv, {}).get("available"):
                continue
            c = creates(wa, drv, n_create)
            rt, py = in_sandbox(wa, drv, n_exec, n_py)
            rows[drv] = {"create": c, "rt": rt, "py": py}

        # The template of this shape is made by the first start that needs
        # it: measured once from scratch, then the restores.
        tdir = template_dirs(image_dir)
        before = set(tdir.iterdir()) if tdir.is_dir() else set()
        key_shape = f" mem={SHAPE['memoryMiB']} disk={SHAPE['diskMiB']} "
        for t in before:
            k = t / "key"
            if k.exists() and key_shape in k.read_text():
                shutil.rmtree(t, ignore_errors=True)
        made, sbx = first_exec(wa, "microvm")
        drop(wa, sbx)
        restore = creates(wa, "microvm", n_create)
        rt, py = in_sandbox(wa, "microvm", n_exec, n_py)
        boot = creates(ca, "microvm", n_create)
        rows["microvm"] = {"made": made, "restore": restore, "boot": boot, "rt": rt, "py": py}
        wa.close()
        ca.close()
    finally:
        for d in (warm, cold):
            if d.alive():
                d.stop()
        remove_empty_cgroup_tree(cg + "-w")
        remove_empty_cgroup_tree(cg + "-c")
        shutil.rmtree(tmp, ignore_errors=True)

    section = render(rows, accel, load0, args, n_create)
    emit(args.out, BEGIN, END, section)
    return 0


def render(rows: dict, accel: str, load0: float, args, n_create: int) -> str:
    host = statistics.median(rows["host"]["py"])
    load = os.getloadavg()[0]
    lines = [BEGIN, "## microVM next to the other drivers", "",
             "Regenerate with `python3 bench/microvm.py` (as root, from the repo root; "
             f"{'`--quick`, ' if args.quick else ''}it replaces this section only). On a KVM host the same "
             "command gives the KVM figures (the probe picks KVM when a guest kernel boots under it; "
             "`RUNTIME_MICROVM_ACCEL=kvm` insists).", "",
             f"Run on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, kernel "
             f"{platform.release()}, load average {load0:.2f} at the start and {load:.2f} at the end. "
             f"microvm: {accel}.", "",
             f"Every sandbox {SHAPE['memoryMiB']} MiB, {SHAPE['diskMiB']} MiB of disk, 1 vCPU. *Create -> first "
             "exec*: `POST /v1/sandboxes` and an exec of `true` until its result, over "
             f"{n_create} sandboxes. *Restore*: the sandbox's first start restores its shape's template; "
             "*cold boot*: a daemon with `RUNTIME_MICROVM_SNAPSHOTS=0` boots the guest kernel. "
             "*Template made*: the first start of the shape when it has no template yet (a cold boot, the "
             "save, then the restore). Exec round trip and Python: one running sandbox, after one warm-up "
             "run of python3.", "",
             "| driver | create -> first exec p50 (max) | exec `true` p50 / p95 | `python3 -c 'print(6*7)'` p50 |",
             "| --- | --- | --- | --- |",
             f"| bare host | | | {ms(host)} (1.00x) |"]
    for drv in ("namespace", "gvisor"):
        if drv not in rows:
            continue
        r = rows[drv]
        py = statistics.median(r["py"])
        lines.append(f"| {drv} | {ms(statistics.median(r['create']))} ({ms(max(r['create']))}) | "
                     f"{ms(statistics.median(r['rt']))} / {ms(pct(r['rt'], 95))} | {ms(py)} ({py / host:.1f}x) |")
    m = rows["microvm"]
    py = statistics.median(m["py"])
    lines += [f"| microvm, restore | {ms(statistics.median(m['restore']))} ({ms(max(m['restore']))}) | "
              f"{ms(statistics.median(m['rt']))} / {ms(pct(m['rt'], 95))} | {ms(py)} ({py / host:.1f}x) |",
              f"| microvm, cold boot | {ms(statistics.median(m['boot']))} ({ms(max(m['boot']))}) | | |",
              f"| microvm, template made | {ms(m['made'])} (once per image, agent and shape) | | |", "",
              "Under TCG every guest instruction is translated: exec round trips and Python's start-up pay "
              "for it, and a restored guest's first commands pay again for translations the saved guest "
              "had made (QEMU does not save its translation cache). Restore vs cold boot is the figure "
              "the template exists for.", END]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
