#!/usr/bin/env python3
"""Browser and desktop: a browser's start to its first page (POST .../browser:start, Playwright's
connect_over_cdp through the preview listener, a page served inside the sandbox loaded), a
desktop's start (Xvfb and openbox up), and a screenshot's latency through the API against its
floor, the same ffmpeg x11grab capture run by a plain exec in the same sandbox, interleaved in one
run; per driver, on the `desktop` image.

    sudo python3 bench/computer_use.py                       # writes its section of docs/benchmarks.md
    sudo python3 bench/computer_use.py --out -               # print the section
    sudo python3 bench/computer_use.py --drivers namespace   # only these drivers

Needs root, a built tree (it runs `make`), the `desktop` image, httpx and playwright.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from urllib.parse import urlsplit, urlunsplit

from _harness import bench_daemon, options, pct, per_driver, prepare
from helpers import Api, free_port, wait_until
from sections import emit

BEGIN = "<!-- computer use benchmark: begin (bench/computer_use.py) -->"
END = "<!-- computer use benchmark: end -->"
STARTS = 5
SHOTS = 30
GRAB = ("ffmpeg -nostdin -loglevel error -f x11grab -i :99 -frames:v 1 -c:v png -f image2pipe - "
        "| base64 -w0 >/dev/null")


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def measure(api: Api, sid: str) -> dict:
    from playwright.sync_api import sync_playwright
    base = f"/v1/sandboxes/{sid}"
    api.put_file(sid, "/workspace/site/index.html", b"<title>first</title>ok").raise_for_status()
    api.post(f"{base}/processes", json={"command": "cd /workspace/site && exec python3 -m http.server 8000"})
    probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 2).close()'"
    wait_until(lambda: api.exec(sid, command=probe)["exitCode"] == 0, 60, 0.2, what="the page's server")
    first_page, desktop = [], []
    with sync_playwright() as p:
        for _ in range(STARTS):
            t0 = time.perf_counter()
            r = api.post(f"{base}/browser:start", json={})
            r.raise_for_status()
            cdp = urlsplit(r.json()["cdpUrl"])
            at = urlunsplit((cdp.scheme, f"127.0.0.1:{cdp.port}", cdp.path, cdp.query, ""))
            browser = p.chromium.connect_over_cdp(at, headers={"Host": cdp.netloc}, timeout=60000)
            page = browser.contexts[0].new_page()
            page.goto("http://127.0.0.1:8000/")
            assert page.title() == "first"
            first_page.append(ms(t0))
            browser.close()
            api.post(f"{base}/browser:stop", json={}).raise_for_status()
    for _ in range(STARTS):
        t0 = time.perf_counter()
        api.post(f"{base}/desktop:start", json={}).raise_for_status()
        desktop.append(ms(t0))
        api.post(f"{base}/desktop:stop", json={}).raise_for_status()
    api.post(f"{base}/desktop:start", json={}).raise_for_status()
    shots, floor = [], []
    for i in range(SHOTS):
        for way in (("api", "exec") if i % 2 == 0 else ("exec", "api")):
            t0 = time.perf_counter()
            if way == "api":
                r = api.get(f"{base}/desktop/screenshot")
                r.raise_for_status()
                shots.append(ms(t0))
            else:
                assert api.exec(sid, command=GRAB)["exitCode"] == 0
                floor.append(ms(t0))
    return {"first_page": first_page, "desktop": desktop, "shots": shots, "floor": floor}


def render(results: dict, drivers: str) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, "", "## Browser and desktop: starts and screenshots", "",
             f"`sudo python3 bench/computer_use.py --drivers {drivers}` ({when}, {platform.node()}, "
             f"{os.cpu_count()} cores, shared with other builds and tests while it ran). The `desktop` image, "
             f"a 1280x800 screen. Browser: {STARTS} rounds of POST browser:start, Playwright's connect_over_cdp "
             "through the preview listener and a page served inside the sandbox loaded, then browser:stop. "
             f"Desktop: {STARTS} rounds of desktop:start (Xvfb and openbox up). Screenshot: {SHOTS} PNGs through "
             "GET desktop/screenshot against the floor, the same ffmpeg x11grab capture by a plain exec, "
             "interleaved. Medians, and the 99th percentile of the screenshots.", "",
             "| driver | browser start to first page (ms) | desktop start (ms) | screenshot via the API, p50 / p99 (ms) "
             "| the same capture by exec, p50 / p99 (ms) |",
             "| --- | --- | --- | --- | --- |"]
    for drv, r in results.items():
        if "error" in r:
            lines.append(f"| {drv} | {r['error']} | | | |")
            continue
        lines.append(f"| {drv} | {statistics.median(r['first_page']):.0f} | {statistics.median(r['desktop']):.0f} "
                     f"| {statistics.median(r['shots']):.0f} / {pct(r['shots'], 99):.0f} "
                     f"| {statistics.median(r['floor']):.0f} / {pct(r['floor'], 99):.0f} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = options(__doc__, "computer use")
    ap.set_defaults(drivers="namespace,gvisor")
    args = ap.parse_args()
    if (rc := prepare("computer_use.py")) != 0:
        return rc
    results: dict = {}
    port = free_port()
    with bench_daemon("computer-use", args.image_dir, extra_args=["--preview-listen", f"127.0.0.1:{port}"]) as d:
        api = Api(d, timeout=180)
        try:
            for drv, sbx in per_driver(api, args.drivers, results, image="desktop", memoryMiB=2048):
                try:
                    results[drv] = measure(api, sbx.id)
                except Exception as e:  # a driver's failure is its row, not the run's end
                    results[drv] = {"error": f"{type(e).__name__}: {str(e)[:100]}"}
        finally:
            api.close()
    emit(args.out, BEGIN, END, render(results, args.drivers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
