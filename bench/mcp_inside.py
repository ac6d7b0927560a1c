#!/usr/bin/env python3
"""MCP servers inside a sandbox: from the start to the first tool's answer, beside an exec of the
same read, in one run.

    sudo python3 bench/mcp_inside.py                  # writes its section of docs/benchmarks.md
    sudo python3 bench/mcp_inside.py --quick --out -  # fewer rounds, print the section

A daemon of this tree's build with a preview listener. Per driver and round, a new sandbox of the
default image (made before the clock starts) gets a file in /workspace; then `POST .../mcp`
starts the filesystem server (the answer comes when it runs), and the official MCP SDK connects
to its URL through the preview listener, initializes and calls `read_text_file` on the file: the
figure is the start's answer, and the start to that first tool answer. Beside it, an exec of
`cat` on the same file: what the same read costs without MCP. Needs root, a built tree, and the
`mcp` package.
"""
from __future__ import annotations

import asyncio
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from urllib.parse import urlsplit

import httpx

from _harness import bench_daemon, options, pct, prepare
from helpers import Api, daemon_info, free_port
from sections import emit

BEGIN = "<!-- mcp inside benchmark: begin (bench/mcp_inside.py) -->"
END = "<!-- mcp inside benchmark: end -->"


async def first_answer(url: str, host: str, headers: dict) -> str:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    client = httpx.AsyncClient(headers={"Host": host, **headers}, timeout=httpx.Timeout(60, read=120))
    try:
        async with streamable_http_client(url, http_client=client) as (read, write, _):
            async with ClientSession(read, write) as s:
                await s.initialize()
                res = await s.call_tool("read_text_file", {"path": "/workspace/bench.txt"})
                return "".join(c.text for c in res.content if getattr(c, "text", None))
    finally:
        await client.aclose()


def one_round(api: Api, driver: str, preview_port: int) -> tuple[float, float, float]:
    sbx = api.create_sandbox(driver=driver, memoryMiB=1024)
    try:
        sbx.write("/workspace/bench.txt", b"measured\n")
        t = time.perf_counter()
        r = api.post(f"/v1/sandboxes/{sbx.id}/mcp", json={"servers": [{"id": "filesystem"}]}, timeout=120)
        started = (time.perf_counter() - t) * 1000
        assert r.status_code == 200 and r.json()["servers"][0]["status"] == "running", r.text
        parts = urlsplit(r.json()["servers"][0]["url"])
        text = asyncio.run(first_answer(f"http://127.0.0.1:{preview_port}{parts.path}", parts.netloc,
                                        r.json()["headers"]))
        first = (time.perf_counter() - t) * 1000
        assert "measured" in text, text
        t = time.perf_counter()
        out = sbx.exec("cat /workspace/bench.txt")
        cat = (time.perf_counter() - t) * 1000
        assert out["stdout"] == "measured\n", out
        return started, first, cat
    finally:
        api.delete(f"/v1/sandboxes/{sbx.id}")


def p50(xs) -> str:
    return f"{statistics.median(xs):.0f} ms (p90 {pct(xs, 90):.0f})" if xs else "-"


def main() -> int:
    ap = options(__doc__, "mcp inside", quick="2 rounds instead of 5")
    args = ap.parse_args()
    if (rc := prepare("mcp_inside.py")) != 0:
        return rc
    rounds = 2 if args.quick else 5
    rows = []
    port = free_port()
    with bench_daemon("mcp-inside", args.image_dir, extra_args=["--preview-listen", f"127.0.0.1:{port}"]) as d:
        available = {x["name"] for x in daemon_info(d).get("drivers", []) if x.get("available")}
        api = Api(d, timeout=600)
        for driver in [x for x in args.drivers.split(",") if x in available and x != "microvm"]:
            got = [one_round(api, driver, port) for _ in range(rounds)]
            rows.append(f"| {driver} | {p50([g[0] for g in got])} | {p50([g[1] for g in got])} | "
                        f"{p50([g[2] for g in got])} |")
    section = "\n".join([
        BEGIN,
        "## MCP servers inside a sandbox",
        "",
        f"`sudo python3 bench/mcp_inside.py --image-dir DIR{' --quick' if args.quick else ''}` (DIR: the default "
        "image built with this recipe, which has the MCP servers) "
        f"({datetime.now(timezone.utc):%Y-%m-%d}, {platform.node()}, {rounds} rounds per driver): the "
        "filesystem server started with `POST .../mcp` (its answer), and from the start to the first "
        "`read_text_file` answer through the preview listener (the MCP SDK's initialize and call), "
        "beside an exec of `cat` on the same file.",
        "",
        "| Driver | start answered | start to first tool answer | exec of `cat` |",
        "| --- | --- | --- | --- |",
        *rows,
        END,
    ])
    emit(args.out, BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
