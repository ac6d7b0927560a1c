#!/usr/bin/env python3
"""File links: a signed link's download against the authenticated download of the same file, per
driver, side by side in one run (the two interleaved, round after round, in alternating order):
the throughput of a 64 MiB file, and the round trip of a 1 KiB file, for which the link's own
cost (reading the sandbox's sealed secret, the HMAC, and for a one-time link the claim written to
the store) weighs most.

    sudo python3 bench/file_links.py                       # writes its section of docs/benchmarks.md
    sudo python3 bench/file_links.py --out -               # print the section
    sudo python3 bench/file_links.py --drivers namespace   # only these drivers

Needs root, a built tree (it runs `make`), the default image and httpx.
"""
from __future__ import annotations

import os
import platform
import sys
from datetime import datetime, timezone

import httpx

from _harness import DRIVERS, bench_daemon, options, pct, per_driver, prepare, timed_get
from helpers import Api
from sections import emit

BEGIN = "<!-- file links benchmark: begin (bench/file_links.py) -->"
END = "<!-- file links benchmark: end -->"
BIG = 64 * 1024 * 1024
ROUNDS = 8
SMALL_ROUNDS = 200


def make_link(api: Api, sid: str, path: str, **fields) -> str:
    r = api.post(f"/v1/sandboxes/{sid}/files:link", json={"path": path, **fields})
    assert r.status_code == 201, r.text
    return r.json()["url"]


def measure(api: Api, sid: str) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}:exec", json={"command": f"head -c {BIG} /dev/urandom > /workspace/big; "
                                                               "head -c 1024 /dev/urandom > /workspace/small"})
    assert r.json()["exitCode"] == 0, r.text
    auth_big = f"/v1/sandboxes/{sid}/files/content"
    link_big = make_link(api, sid, "/workspace/big")
    link_small = make_link(api, sid, "/workspace/small")
    keyless = httpx.Client(timeout=600)
    big = {"key": [], "link": []}
    for i in range(ROUNDS):
        order = ("key", "link") if i % 2 == 0 else ("link", "key")
        for how in order:
            if how == "key":
                big[how].append(BIG / timed_get(api, auth_big, BIG, params={"path": "/workspace/big"}) / 1e6)
            else:
                big[how].append(BIG / timed_get(keyless, link_big, BIG) / 1e6)
    small = {"key": [], "link": [], "once": []}
    for i in range(SMALL_ROUNDS):
        once = make_link(api, sid, "/workspace/small", oneTime=True)
        order = ("key", "link", "once") if i % 2 == 0 else ("once", "link", "key")
        for how in order:
            if how == "key":
                small[how].append(timed_get(api, auth_big, 1024, params={"path": "/workspace/small"}) * 1000)
            else:
                small[how].append(timed_get(keyless, once if how == "once" else link_small, 1024) * 1000)
    keyless.close()
    med = lambda xs: pct(xs, 50)  # noqa: E731
    return {"big_key": med(big["key"]), "big_link": med(big["link"]),
            "small_key": med(small["key"]), "small_link": med(small["link"]), "small_once": med(small["once"])}


def render(results: dict, drivers: str) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "sudo python3 bench/file_links.py" + ("" if drivers == DRIVERS else f" --drivers {drivers}")
    lines = [BEGIN, "", "## File links: a signed link's download against the authenticated one", "",
             f"`{command}` ({when}, {platform.node()}, {os.cpu_count()} cores, shared with "
             "other builds and tests while it ran; figures move with that load). Medians of "
             f"{ROUNDS} downloads of a 64 MiB file and {SMALL_ROUNDS} of a 1 KiB file each way, the ways "
             "interleaved in alternating order; the key's client and the link's each keep their connection.", "",
             "| driver | 64 MiB with the key (MB/s) | 64 MiB through a link (MB/s) | link / key "
             "| 1 KiB with the key, p50 (ms) | 1 KiB through a link, p50 (ms) | 1 KiB through a one-time link, p50 (ms) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "error" in r:
            lines.append(f"| {drv} | not run: {r['error']} | | | | | |")
        else:
            lines.append(f"| {drv} | {r['big_key']:.0f} | {r['big_link']:.0f} | {r['big_link'] / r['big_key']:.2f} "
                         f"| {r['small_key']:.2f} | {r['small_link']:.2f} | {r['small_once']:.2f} |")
    lines += ["", END]
    return "\n".join(lines)


def main() -> int:
    args = options(__doc__, "file_links").parse_args()
    if (rc := prepare("file_links.py")) != 0:
        return rc
    results: dict[str, dict] = {}
    with bench_daemon("file_links", args.image_dir) as d:
        api = Api(d, timeout=600)
        for drv, sbx in per_driver(api, args.drivers, results):
            results[drv] = measure(api, sbx.id)
        api.close()
    emit(args.out, BEGIN, END, render(results, args.drivers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
