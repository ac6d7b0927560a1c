#!/usr/bin/env python3
"""The interpreter's first cell in a new sandbox, with the default python kernel started ahead
(runtimed's default) and without (--no-interpreter-prestart), side by side in one run.

    sudo python3 bench/interpreter_first.py                  # writes its section of docs/benchmarks.md
    sudo python3 bench/interpreter_first.py --quick --out -  # fewer rounds, print the section

Two daemons of this tree's build run at once on the same image directory, one with each
setting; rounds alternate between them per driver. A round creates a sandbox and measures
the create, the first exec of `true` after it (create -> first exec result), then a first
`interpreter:run` of `6*7` at once, and, in a second sandbox, the same first cell after the
sandbox has been up 5 s (an agent that runs a few commands before code). The sandbox's idle
memory with the kernel started is the resident size of its context's processes. Then, on the
prestart daemon, the first cell of a new context per language the image has (python, bash, javascript,
typescript; r in the analysis image):
the create of the context and its first cell. Needs root and a built tree.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

from _harness import bench_daemon, options, pct, prepare
from helpers import Api, Sandbox, daemon_info
from sections import emit

BEGIN = "<!-- interpreter first cell benchmark: begin (bench/interpreter_first.py) -->"
END = "<!-- interpreter first cell benchmark: end -->"
FIRST_CELL = {"python": ("6*7", lambda out: out["results"][0]["data"]["text/plain"] == "42"),
              "bash": ("echo $((6*7))", lambda out: out["stdout"].strip() == "42"),
              "javascript": ("6*7", lambda out: out["results"][0]["data"]["text/plain"] == "42"),
              "typescript": ("const n: number = 6; n*7",
                             lambda out: out["results"][0]["data"]["text/plain"] == "42"),
              # IRkernel's value is display data, the cell's last result.
              "r": ("6*7", lambda out: out["results"][-1]["data"]["text/plain"] == "[1] 42")}
# Resident memory of the context's processes (its client and kernel, which carry the
# context's variable), in KiB.
RSS = ("for p in /proc/[0-9]*; do grep -qz RUNTIME_INTERPRETER_CONTEXT= $p/environ 2>/dev/null && "
       "awk '/^VmRSS/ { print $2 }' $p/status; done | awk '{ s += $1 } END { print s + 0 }'")


def cell(api: Api, sid: str, code: str = "6*7", **body) -> tuple[float, dict]:
    t = time.perf_counter()
    r = api.post(f"/v1/sandboxes/{sid}/interpreter:run", json={"code": code, **body}, timeout=600)
    ms = (time.perf_counter() - t) * 1000
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    return ms, r.json()


def one_round(api: Api, driver: str, wait_s: float) -> dict:
    t = time.perf_counter()
    sbx = api.create_sandbox(driver=driver)
    created = (time.perf_counter() - t) * 1000
    r = api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"argv": ["true"]})
    first_exec = (time.perf_counter() - t) * 1000
    assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text
    if wait_s:
        time.sleep(wait_s)
    ms, out = cell(api, sbx.id)
    assert FIRST_CELL["python"][1](out), out
    rss = None
    if wait_s:
        r = api.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": RSS})
        rss = int(r.json()["stdout"].strip() or 0) / 1024
    api.delete(f"/v1/sandboxes/{sbx.id}")
    return {"create": created, "exec": first_exec, "cell": ms, "rss": rss}


def languages(api: Api, driver: str, rounds: int, image: str | None = None, skip=()) -> dict:
    """Each language the image has (but those in skip): a new context and its first cell."""
    if image is None:
        sbx = api.create_sandbox(driver=driver)
    else:
        r = api.post("/v1/sandboxes", json={"driver": driver, "image": image})
        if r.status_code != 201:
            print(f"no {image} sandbox on {driver}: {r.status_code} {r.text[:200]}", file=sys.stderr)
            return {}
        sbx = Sandbox(api, r.json())
    listed = api.get(f"/v1/sandboxes/{sbx.id}/interpreter/contexts").json()["data"]
    have = [c["language"] for c in listed if c["id"] == c["language"] and c["language"] not in skip]
    out = {}
    for lang in have:
        out[lang] = []
        for i in range(rounds):
            t = time.perf_counter()
            made = api.post(f"/v1/sandboxes/{sbx.id}/interpreter/contexts",
                            json={"id": f"{lang}-{i}", "language": lang}, timeout=600)
            assert made.status_code == 201, made.text
            code, ok = FIRST_CELL[lang]
            _, got = cell(api, sbx.id, code, context=f"{lang}-{i}")
            out[lang].append((time.perf_counter() - t) * 1000)
            assert ok(got), got
            api.delete(f"/v1/sandboxes/{sbx.id}/interpreter/contexts/{lang}-{i}")
    api.delete(f"/v1/sandboxes/{sbx.id}")
    return out


def p50(xs) -> str:
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.0f} ms (p90 {pct(xs, 90):.0f})" if xs else "-"


def main() -> int:
    ap = options(__doc__, "interpreter first cell", quick="3 rounds instead of 8")
    args = ap.parse_args()
    if (rc := prepare("interpreter_first.py")) != 0:
        return rc
    rounds = 3 if args.quick else 8
    rows, lang_rows = [], []
    # The host's bound on kernels started ahead (8 per 5 minutes by default) would run out
    # within the run: the bench measures the mechanism, so its daemon's bound is the run's size.
    with bench_daemon("interp-first-on", args.image_dir,
                      extra_args=["--interpreter-prestart-max", "64"]) as on, \
            bench_daemon("interp-first-off", args.image_dir, extra_args=["--no-interpreter-prestart"]) as off:
        available = {x["name"] for x in daemon_info(on).get("drivers", []) if x.get("available")}
        apis = {"prestart": Api(on, timeout=600), "none": Api(off, timeout=600)}
        for driver in [d for d in args.drivers.split(",") if d in available and d != "microvm"]:
            got = {k: {"at once": [], "after 5 s": []} for k in apis}
            for _ in range(rounds):
                for kind, api in apis.items():
                    got[kind]["at once"].append(one_round(api, driver, 0))
                    got[kind]["after 5 s"].append(one_round(api, driver, 5))
            for kind in apis:
                a, w = got[kind]["at once"], got[kind]["after 5 s"]
                rows.append(f"| {driver} | {kind} | {p50([x['create'] for x in a + w])} | "
                            f"{p50([x['exec'] for x in a + w])} | {p50([x['cell'] for x in a])} | "
                            f"{p50([x['cell'] for x in w])} | "
                            f"{statistics.median([x['rss'] for x in w]):.0f} MiB |")
                print(rows[-1], file=sys.stderr)
            seen = languages(apis["prestart"], driver, rounds)
            # R is in the analysis image only.
            seen.update(languages(apis["prestart"], driver, rounds, image="analysis", skip=set(seen)))
            for lang, xs in seen.items():
                lang_rows.append(f"| {driver} | {lang} | {p50(xs)} |")
                print(lang_rows[-1], file=sys.stderr)
        for api in apis.values():
            api.close()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join([
        BEGIN,
        "## Interpreter: the first cell of a new sandbox, kernel started ahead or not",
        "",
        f"{rounds} rounds per driver and setting, alternating, {when}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; p50 (p90). "
        "`prestart`: runtimed's default, the default python context's kernel started in the "
        "background with each new sandbox; `none`: `--no-interpreter-prestart`, the kernel "
        "started by the first cell. Create -> first exec: the create and an exec of `true` "
        "after it, as a client sees them. First cell: `interpreter:run` of `6*7` without a "
        "context, right after that first exec, or in a sandbox up for 5 s. Kernel memory: "
        "resident size of the context's processes (its client and the kernel) in the idle "
        "sandbox, pages shared between them counted twice.",
        "",
        "| driver | kernel | create | create -> first exec | first cell at once | first cell after 5 s | kernel memory |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "A new context of each language the image has, on the prestart daemon: the create of "
        "the context and its first cell (`6*7`, `echo $((6*7))`, `6*7` in JavaScript, "
        "`const n: number = 6; n*7` in TypeScript).",
        "",
        "| driver | language | create + first cell |",
        "| --- | --- | --- |",
        *lang_rows,
        "",
        "`sudo python3 bench/interpreter_first.py` rewrites this section.",
        END,
    ])
    emit(args.out, BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
