"""The browser and the desktop of a sandbox (docs/computer-use.md), on the `desktop` image.

The published client (withruntime 0.35.0) starts Chromium with sbx.browser.start() and reads its
cdpUrl; Playwright's connect_over_cdp, in the suite's own interpreter, drives that browser through
the daemon's preview listener: it opens a page served inside the sandbox, reads its title and
takes a screenshot. The browser is a process of the sandbox, so a page of a host outside the
sandbox's allow-list fails at the egress proxy; a page that crashes its renderer fails on its own
and leaves the browser and the sandbox running. The cdpUrl is refused without its token and with
a wrong one. On the desktop the client starts Xvfb and the window manager, launches an xterm,
types a command into it and reads the screen: the screenshot shows the window. Hostile input
(points off the screen, unknown key names, unknown actions, overlong text, a window id that is
no number) gets 400s, and a sandbox of an image without Chromium a 409 naming the image to use.
The TypeScript SDK drives the same routes from Node (sdk/js/test/computer.test.mjs)."""
from __future__ import annotations

import base64
import io
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from helpers import Api, free_port, skip_unless_driver, vnc_greeting, wait_until

sys.path.insert(0, str(Path(__file__).parent))
from conftest import _finish_daemon, _start_daemon  # noqa: E402
from test_js_sdk import NODE, _env, js_build, run_node  # noqa: E402,F401 - js_build: the fixture that builds sdk/js

DRIVERS = ["namespace", "gvisor"]

PAGE = b"<!doctype html><title>served in the sandbox</title><body style='background:#0a0'>hello</body>"


@pytest.fixture(scope="module")
def cdaemon(build_dir, image_dir, tmp_path_factory):
    """A daemon with a preview listener: the browser's DevTools and the live view are served
    there."""
    state = tmp_path_factory.mktemp("computer") / "state"
    port = free_port()
    d = _start_daemon(build_dir, image_dir, state, f"runtime-test-{os.getpid()}-computer",
                      extra_args=["--preview-listen", f"127.0.0.1:{port}"])
    d.preview_port = port
    yield d
    _finish_daemon(d)


@pytest.fixture
def capi(cdaemon):
    c = Api(cdaemon)
    yield c
    problems = c.delete_all()
    c.close()
    assert cdaemon.alive(), "runtimed died during the test"
    assert not problems, problems


@pytest.fixture(params=DRIVERS)
def cdriver(request, cdaemon) -> str:
    skip_unless_driver(cdaemon, request.param)
    return request.param


def playwright_sync():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (tests/requirements.txt)")
    return sync_playwright


def serve_page(sbx) -> None:
    sbx.put_file("/workspace/site/index.html", PAGE).raise_for_status()
    r = sbx.api.post(f"/v1/sandboxes/{sbx.id}/processes",
                     json={"command": "cd /workspace/site && exec python3 -m http.server 8000 --bind 127.0.0.1"})
    assert r.status_code in (200, 201, 202), r.text
    probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 2).close()'"
    wait_until(lambda: sbx.exec(probe)["exitCode"] == 0, 60, 0.2, what="the page's server")


def connect(p, cdp: str):
    """connect_over_cdp to the cdpUrl. Its host name (9222-sbx-HEX.localhost) reaches loopback in
    browsers and curl, but this machine's resolver knows no *.localhost names: connect to
    127.0.0.1 and send the name as the Host, which is what picks the preview."""
    parts = urlsplit(cdp)
    at = urlunsplit((parts.scheme, f"127.0.0.1:{parts.port}", parts.path, parts.query, ""))
    return p.chromium.connect_over_cdp(at, headers={"Host": parts.netloc}, timeout=30000)


def test_browser_through_playwright(published_client, cdaemon, capi, cdriver, desktop_image):
    sbx = capi.create_sandbox(driver=cdriver, image=desktop_image, memoryMiB=2048,
                              network={"internet": True, "allow": ["allowed.example"]})
    serve_page(sbx)
    got = published_client.run_json(cdaemon, """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
started = sbx.browser.start(width=1024, height=700)
again = sbx.browser.get()
print(json.dumps({"started": started, "again": again}))
""", args=[sbx.id])
    started, again = got["started"], got["again"]
    assert started["running"] is True and again["running"] is True, got
    cdp = started["cdpUrl"]
    parts = urlsplit(cdp)
    assert parts.scheme == "ws" and parts.hostname.startswith("9222-sbx-"), cdp
    assert parts.port == cdaemon.preview_port and "runtime_preview_token=" in parts.query, cdp
    assert parts.path.startswith("/devtools/browser/"), cdp

    with playwright_sync()() as p:
        browser = connect(p, cdp)
        ctx = browser.contexts[0] if browser.contexts else browser.new_context()
        page = ctx.new_page()
        page.goto("http://127.0.0.1:8000/", timeout=30000)
        assert page.title() == "served in the sandbox"
        png = page.screenshot()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
        from PIL import Image
        img = Image.open(io.BytesIO(png)).convert("RGB")
        assert img.getpixel((img.width // 2, img.height // 2)) == (0, 0xaa, 0), "the page's green"

        # Egress: the browser is a process of the sandbox; a host off its allow-list is refused
        # at the proxy, never reached.
        # Plain HTTP gets the proxy's refusal as the answer; HTTPS a tunnel that never opens.
        # On a page of their own: a failed navigation's error page commits late under gVisor and
        # would cut short the next navigation of the same page.
        outside = ctx.new_page()
        refused = outside.goto("http://denied.example/", timeout=30000)
        assert refused is not None and refused.status == 403, refused and refused.status
        with pytest.raises(Exception) as tunnel:
            outside.goto("https://denied.example/", timeout=30000)
        assert "ERR_TUNNEL_CONNECTION_FAILED" in str(tunnel.value), tunnel.value
        log = capi.get(f"/v1/sandboxes/{sbx.id}/egress").json()
        assert "denied.example" in json.dumps(log), log

        # A page that crashes its renderer: that page fails, the browser and the sandbox go on.
        crashing = ctx.new_page()
        with pytest.raises(Exception):
            crashing.goto("chrome://crash", timeout=15000)
        page.goto("http://127.0.0.1:8000/", timeout=30000)
        assert page.title() == "served in the sandbox"
        browser.close()

    assert sbx.exec("echo alive")["stdout"] == "alive\n"
    st = capi.get(f"/v1/sandboxes/{sbx.id}/browser").json()
    assert st["running"] is True, st
    stopped = published_client.run_json(cdaemon, """
import json, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
print(json.dumps({"stopped": sbx.browser.stop(), "after": sbx.browser.get()}))
""", args=[sbx.id])
    assert stopped["stopped"] is True and stopped["after"]["running"] is False, stopped
    assert stopped["after"]["cdpUrl"] is None


def test_cdp_url_needs_its_token(cdaemon, capi, desktop_image):
    sbx = capi.create_sandbox(image=desktop_image, memoryMiB=2048)
    # Three starts at once: one Chromium, and each answer names it.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: capi.post(f"/v1/sandboxes/{sbx.id}/browser:start", json={}), range(3)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert len({urlsplit(a.json()["cdpUrl"]).path for a in answers}) == 1, [a.json() for a in answers]
    mains = sbx.exec("ps -eo args | grep -- '--remote-debugging-port=9223' | grep -v -e '--type=' -e grep | wc -l")
    assert mains["stdout"].strip() == "1", mains
    r = answers[0]
    cdp = urlsplit(r.json()["cdpUrl"])
    host = cdp.netloc
    base = f"http://127.0.0.1:{cdaemon.preview_port}"
    # The listener checks a token once per connection: each probe on a connection of its own.
    token = dict(kv.split("=", 1) for kv in cdp.query.split("&"))["runtime_preview_token"]

    def probe(headers: dict) -> httpx.Response:
        with httpx.Client(timeout=15) as c:
            return c.get(f"{base}/json/version", headers={"Host": host, **headers})

    # The DevTools' own answer, reached with the token, names the browser.
    ok = probe({"x-runtime-preview-token": token})
    assert ok.status_code == 200 and "webSocketDebuggerUrl" in ok.json(), ok.text
    # Chromium names its WebSocket at the Host it was asked by: the listener's, not 127.0.0.1:9222.
    assert urlsplit(ok.json()["webSocketDebuggerUrl"]).netloc == host, ok.json()
    assert probe({}).status_code == 401
    assert probe({"x-runtime-preview-token": "1.00"}).status_code == 403
    # A token of this sandbox's DevTools opens no other port of it.
    other_port = host.replace("9222-", "8000-", 1)
    with httpx.Client(timeout=15) as c:
        r = c.get(f"{base}/", headers={"Host": other_port, "x-runtime-preview-token": token})
        assert r.status_code in (403, 404), r.text
    # Chromium itself killed: the browser reads as not running, and a start brings it back.
    assert sbx.exec("kill -9 $(cat /tmp/.runtime-browser/pid)")["exitCode"] == 0
    wait_until(lambda: capi.get(f"/v1/sandboxes/{sbx.id}/browser").json()["running"] is False, 20, 0.3,
               what="the browser read as stopped")
    again = capi.post(f"/v1/sandboxes/{sbx.id}/browser:start", json={})
    assert again.status_code == 200 and again.json()["running"] is True, again.text
    assert urlsplit(again.json()["cdpUrl"]).path != cdp.path, "a new browser"
    assert sbx.exec("echo fine")["stdout"] == "fine\n"
    # Another owner's key sees no browser of this sandbox, and starts none.
    k = capi.post("/v1/keys", json={"name": "computer-other", "owner": "computer-other"})
    assert k.status_code == 201, k.text
    with Api(cdaemon, key=k.json()["key"]) as other:
        for resp in (other.get(f"/v1/sandboxes/{sbx.id}/browser"),
                     other.post(f"/v1/sandboxes/{sbx.id}/browser:start", json={}),
                     other.post(f"/v1/sandboxes/{sbx.id}/desktop:act", json={"action": "cursor"})):
            assert resp.status_code == 404, resp.text


def test_browser_needs_the_desktop_image(cdaemon, capi):
    sbx = capi.create_sandbox()
    r = capi.post(f"/v1/sandboxes/{sbx.id}/browser:start", json={"headless": True})
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert "chromium" in err["message"] and '"desktop"' in err["hint"], err
    r = capi.post(f"/v1/sandboxes/{sbx.id}/desktop:start", json={})
    assert r.status_code == 409 and '"desktop"' in r.json()["error"]["hint"], r.text
    # No browser: running false. A sandbox that is not running: its 409, not "running": false.
    assert capi.get(f"/v1/sandboxes/{sbx.id}/browser").json() == {"running": False, "cdpUrl": None,
                                                                   "streamUrl": None}
    assert capi.post(f"/v1/sandboxes/{sbx.id}:stop", json={}).status_code == 200
    r = capi.get(f"/v1/sandboxes/{sbx.id}/browser")
    assert r.status_code == 409 and "running" not in r.json(), r.text


def test_desktop_window_and_typing(published_client, cdaemon, capi, cdriver, desktop_image):
    sbx = capi.create_sandbox(driver=cdriver, image=desktop_image, memoryMiB=2048)
    got = published_client.run_json(cdaemon, """
import base64, json, sys, time
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
started = sbx.desktop.start(width=800, height=600)
empty = sbx.desktop.screenshot()
sbx.desktop.launch(["xterm", "-geometry", "60x15+40+40", "-bg", "white", "-fg", "black", "-title", "typed-here"])
deadline = time.time() + 30
windows = []
while time.time() < deadline:
    windows = [w for w in sbx.desktop.windows() if w["title"] == "typed-here"]
    if windows:
        break
    time.sleep(0.3)
sbx.desktop.focus(windows[0]["id"])
sbx.desktop.click(200, 120)
sbx.desktop.type("echo typed-by-xdotool > /tmp/typed.txt")
sbx.desktop.press("Return")
sbx.desktop.move(300, 200)
cursor = sbx.desktop.cursor()
shot = sbx.desktop.screenshot()
jpeg = sbx.desktop.screenshot(format="jpeg", quality=50)
print(json.dumps({"started": started, "windows": windows, "cursor": cursor,
                  "empty": base64.b64encode(empty).decode(), "shot": base64.b64encode(shot).decode(),
                  "jpeg": base64.b64encode(jpeg[:4]).decode()}))
""", args=[sbx.id])
    assert got["started"]["running"] is True and got["started"]["width"] == 800, got["started"]
    assert got["windows"] and got["windows"][0]["width"] > 100, got["windows"]
    assert got["cursor"] == {"x": 300, "y": 200}
    assert base64.b64decode(got["jpeg"])[:3] == b"\xff\xd8\xff"
    from PIL import Image
    empty = Image.open(io.BytesIO(base64.b64decode(got["empty"]))).convert("RGB")
    shot = Image.open(io.BytesIO(base64.b64decode(got["shot"]))).convert("RGB")
    assert shot.size == (800, 600) and empty.size == (800, 600)
    # The xterm's white background where the window was put, none before it.
    assert shot.getpixel((100, 100)) == (255, 255, 255), shot.getpixel((100, 100))
    assert empty.getpixel((100, 100)) != (255, 255, 255)
    wait_until(lambda: sbx.exec("cat /tmp/typed.txt 2>/dev/null")["stdout"] == "typed-by-xdotool\n", 20, 0.3,
               what="the typed command's file")
    # The audit trail names each action and what a launch started, never the typed text.
    def acts():
        got = capi.get("/v1/audit", params={"sandboxId": sbx.id, "action": "desktop.act", "limit": 100}).json()
        return [e.get("detail") or {} for e in got["events"]]
    wait_until(lambda: {"action": "launch", "target": "xterm"} in acts(), 20, 0.3, what="the launch's record")
    assert "typed-by-xdotool" not in json.dumps(acts())
    r = capi.post(f"/v1/sandboxes/{sbx.id}/desktop:stop", json={})
    assert r.status_code == 200 and r.json()["stopped"] is True, r.text
    r = capi.get(f"/v1/sandboxes/{sbx.id}/desktop/screenshot")
    assert r.status_code == 409 and "desktop:start" in r.json()["error"]["hint"], r.text


def test_desktop_refuses_hostile_input(cdaemon, capi, desktop_image):
    sbx = capi.create_sandbox(image=desktop_image, memoryMiB=2048)
    base = f"/v1/sandboxes/{sbx.id}/desktop"
    r = capi.post(f"{base}:act", json={"action": "move", "x": 10, "y": 10})
    assert r.status_code == 409, r.text  # not started yet
    assert capi.post(f"{base}:start", json={"width": 10, "height": 10}).status_code == 400
    assert capi.post(f"{base}:start", json={"width": 99999}).status_code == 400
    assert capi.post(f"{base}:start", json={"depth": 24}).status_code == 400
    r = capi.post(f"{base}:start", json={"width": 640, "height": 480})
    assert r.status_code == 200, r.text

    def act(body, status=400, needle=None):
        resp = capi.post(f"{base}:act", json=body)
        assert resp.status_code == status, (body, resp.status_code, resp.text)
        if needle:
            assert needle in resp.text, resp.text
        return resp

    act({"action": "click", "x": 640, "y": 10}, needle="off the screen")
    act({"action": "move", "x": 10, "y": 480}, needle="off the screen")
    act({"action": "move", "x": -1, "y": 0})
    act({"action": "move", "x": 1})
    act({"action": "drag", "from": [0, 0], "to": [9999, 0]}, needle="off the screen")
    act({"action": "drag", "from": [0, 0], "to": "far"})
    act({"action": "key", "keys": "ctrl+nosuchkey"}, needle="nosuchkey")
    act({"action": "key", "keys": "Return; reboot"})
    act({"action": "key", "keys": "$(id)"})
    act({"action": "type", "text": "x" * 5000})
    act({"action": "type", "text": "x" * 4000, "delayMs": 1000})
    act({"action": "scroll", "dy": 100000})
    act({"action": "click", "button": "fourth"})
    act({"action": "focus", "windowId": "0x1; id"})
    act({"action": "focus", "windowId": "a[$(id)]"})
    act({"action": "focus", "windowId": "0x7fffffff"}, status=404)
    act({"action": "open", "url": "javascript:alert(1)"})
    act({"action": "launch", "argv": []})
    act({"action": "launch", "argv": ["no-such-program-here"]}, status=409)
    act({"action": "teleport"}, needle="unknown action")
    act({"action": "move", "x": 1, "y": 1, "extra": True}, needle="unknown field")
    assert capi.get(f"{base}/screenshot", params={"format": "bmp"}).status_code == 400
    assert capi.get(f"{base}/screenshot", params={"quality": "101", "format": "jpeg"}).status_code == 400
    assert capi.get(f"{base}/screenshot", params={"x": "1"}).status_code == 400
    # A keys string that would be a shell's word splitting or globbing reaches xdotool as names.
    act({"action": "key", "keys": "shift+a BackSpace"}, status=200)
    act({"action": "scroll", "dy": 3, "dx": -2, "x": 5, "y": 5}, status=200)
    act({"action": "drag", "from": [1, 1], "to": [100, 100]}, status=200)
    act({"action": "click", "button": "right", "double": True}, status=200)
    act({"action": "mouseDown"}, status=200)
    act({"action": "mouseUp"}, status=200)
    assert sbx.exec("echo fine")["exitCode"] == 0


def test_read_key_cannot_drive_the_desktop(cdaemon, capi, desktop_image):
    sbx = capi.create_sandbox(image=desktop_image)
    r = capi.post("/v1/keys", json={"name": "reader", "access": "read"})
    assert r.status_code == 201, r.text
    with Api(cdaemon, key=r.json()["key"]) as reader:
        assert reader.post(f"/v1/sandboxes/{sbx.id}/desktop:start", json={}).status_code == 403
        assert reader.get(f"/v1/sandboxes/{sbx.id}/browser").status_code == 403
        assert reader.get(f"/v1/sandboxes/{sbx.id}/desktop/screenshot").status_code == 403


@pytest.mark.microvm_subset
def test_microvm_refuses_browser_and_desktop(cdaemon, capi):
    """The microVM is not offered: a clear 501 naming the drivers to use, before anything runs."""
    skip_unless_driver(cdaemon, "microvm")
    sbx = capi.create_sandbox(driver="microvm")
    for path in ("browser:start", "desktop:start"):
        r = capi.post(f"/v1/sandboxes/{sbx.id}/{path}", json={})
        assert r.status_code == 501, r.text
        err = r.json()["error"]
        assert err["code"] == "not_implemented" and "microVM" in err["message"], err
        assert '"namespace"' in err["hint"] and '"desktop"' in err["hint"], err


def test_desktop_recordings(published_client, cdaemon, capi, desktop_image):
    """The screen to MP4 with the published client: one at a time, a stop that answers once the
    file is whole, maxSeconds that ends a recording by itself, the video's bytes, a delete."""
    sbx = capi.create_sandbox(image=desktop_image, memoryMiB=2048)
    got = published_client.run_json(cdaemon, """
import base64, json, sys, time
from withruntime import Sandbox
from withruntime._errors import RuntimeError as ApiError
sbx = Sandbox.connect(sys.argv[1])
sbx.desktop.start(width=640, height=480)
sbx.desktop.launch(["xterm"])
rec = sbx.desktop.recordings.start(fps=5, max_seconds=60, max_mib=5)
try:
    sbx.desktop.recordings.start()
    second = None
except ApiError as e:
    second = [e.status, e.code]
time.sleep(2)
sbx.desktop.type("moving pixels")
time.sleep(1)
stopped = sbx.desktop.recordings.stop(rec["id"])
listed = sbx.desktop.recordings.list()
video = sbx.desktop.recordings.download(rec["id"])
short = sbx.desktop.recordings.start(max_seconds=1)
time.sleep(4)
ended = sbx.desktop.recordings.get(short["id"])
deleted = sbx.desktop.recordings.delete(rec["id"])
try:
    sbx.desktop.recordings.get(rec["id"])
    gone = None
except ApiError as e:
    gone = [e.status, e.code]
print(json.dumps({"rec": rec, "second": second, "stopped": stopped, "listed": listed,
                  "video": base64.b64encode(video[:16]).decode(), "size": len(video),
                  "ended": ended, "deleted": deleted, "gone": gone}))
""", args=[sbx.id])
    assert got["rec"]["id"].startswith("rec_") and got["rec"]["state"] == "recording", got["rec"]
    assert got["rec"]["maxMiB"] == 5 and got["rec"]["fps"] == 5
    assert got["second"] == [409, "conflict"], got["second"]
    assert got["stopped"]["state"] == "done" and got["stopped"]["sizeBytes"] == got["size"] > 1000, got["stopped"]
    assert got["size"] <= 5 << 20
    assert base64.b64decode(got["video"])[4:8] == b"ftyp", "an MP4"
    assert {r["id"] for r in got["listed"]} == {got["rec"]["id"]}
    assert got["ended"]["state"] == "done", "maxSeconds ended it"
    assert got["deleted"] is True and got["gone"] == [404, "not_found"], got
    base = f"/v1/sandboxes/{sbx.id}/desktop/recordings"
    assert capi.post(base, json={"fps": 0}).status_code == 400
    assert capi.post(base, json={"maxMiB": 1 << 20}).status_code == 400
    assert capi.post(base, json={"codec": "gif"}).status_code == 400
    assert capi.get(f"{base}/rec_../video").status_code == 404
    assert capi.get(f"{base}/rec_0123456789abcdef0123/video").status_code == 404


def test_live_view(cdaemon, capi, desktop_image):
    """The desktop's streamUrl: noVNC's page through the preview listener with its token, and its
    WebSocket reaching x11vnc (the RFB greeting comes back)."""
    sbx = capi.create_sandbox(image=desktop_image, memoryMiB=2048)
    r = capi.post(f"/v1/sandboxes/{sbx.id}/desktop:start", json={"width": 640, "height": 480})
    assert r.status_code == 200, r.text
    stream = urlsplit(r.json()["streamUrl"])
    assert stream.hostname.startswith("6080-sbx-") and stream.path == "/vnc.html", stream
    token = dict(kv.split("=", 1) for kv in stream.query.split("&"))["runtime_preview_token"]
    base = f"http://127.0.0.1:{cdaemon.preview_port}"

    def page(headers):
        with httpx.Client(timeout=15) as c:
            return c.get(f"{base}/vnc.html", headers={"Host": stream.netloc, **headers})

    wait_until(lambda: page({"x-runtime-preview-token": token}).status_code == 200, 30, 0.3,
               what="noVNC's page")
    assert "noVNC" in page({"x-runtime-preview-token": token}).text
    assert page({}).status_code == 401
    got = vnc_greeting(cdaemon.preview_port, stream.netloc, token)
    assert got.startswith(b"HTTP/1.1 101"), got[:200]
    assert b"RFB 00" in got, got[:300]


def test_our_sdk_has_the_same_calls(cdaemon, capi, desktop_image, monkeypatch):
    """Our SDK's sbx.browser and sbx.desktop, blocking and awaitable, with the published client's
    names, against the real daemon."""
    import asyncio
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
    from withruntime import AsyncSandbox, Sandbox
    from withruntime.errors import APIError
    for k, v in cdaemon.env().items():
        monkeypatch.setenv(k, v)
    sid = capi.create_sandbox(image=desktop_image, memoryMiB=2048).id
    sbx = Sandbox.connect(sid)
    started = sbx.desktop.start(width=640, height=480)
    assert started["width"] == 640 and started["streamUrl"], started
    from PIL import Image
    assert Image.open(io.BytesIO(sbx.desktop.screenshot())).size == (640, 480)
    assert sbx.desktop.screenshot(format="jpeg", quality=40)[:3] == b"\xff\xd8\xff"
    assert sbx.desktop.launch(["xterm"])["pid"] > 0
    sbx.desktop.move(20, 30)
    assert sbx.desktop.cursor() == {"x": 20, "y": 30}
    with pytest.raises(APIError) as off:
        sbx.desktop.click(640, 0)
    assert off.value.status == 400
    browser = sbx.browser.start()
    assert browser["cdpUrl"].startswith("ws://9222-sbx-") and sbx.browser.get()["running"] is True
    assert sbx.browser.stop() is True

    async def awaited():
        a = await AsyncSandbox.connect(sid)
        windows = await a.desktop.windows()
        recs = await a.desktop.recordings.list()
        stopped = await a.desktop.stop()
        return windows, recs, stopped

    windows, recs, stopped = asyncio.run(awaited())
    assert isinstance(windows, list) and recs == [] and stopped["stopped"] is True


@pytest.mark.driver_independent  # the TypeScript SDK's calls; the browser per driver is above
def test_ts_sdk_browser_and_desktop(js_build, cdaemon, capi, cdriver, desktop_image):
    """The TypeScript SDK's sbx.browser and sbx.desktop (sdk/js/test/computer.test.mjs) from Node
    against this daemon: screenshots decoded, an xterm typed into and seen, a recording listed
    and downloaded, the cdpUrl driven over its WebSocket, hostile input refused."""
    if NODE is None:
        pytest.skip("node is not installed (scripts/install-deps.sh)")
    run_node("computer.test.mjs", _env(cdaemon, cdriver, RUNTIME_TEST_DESKTOP_IMAGE=desktop_image), 900)


def test_cdp_url_under_another_preview_domain(build_dir, image_dir, tmp_path, desktop_image):
    """Behind --preview-domain, the Host the listener passes on (9222-sbx-HEX.preview.example) is
    no localhost name, which Chromium's DevTools refuses; the relay in front of it puts localhost
    in its place, and Playwright drives the browser as under the default domain."""
    port = free_port()
    d = _start_daemon(build_dir, image_dir, tmp_path / "state", f"runtime-test-{os.getpid()}-computer-domain",
                      extra_args=["--preview-listen", f"127.0.0.1:{port}", "--preview-domain", "preview.example"])
    try:
        with Api(d) as api:
            sbx = api.create_sandbox(image=desktop_image, memoryMiB=2048)
            sbx.put_file("/workspace/site/index.html", PAGE).raise_for_status()
            r = api.post(f"/v1/sandboxes/{sbx.id}/browser:start", json={})
            assert r.status_code == 200, r.text
            cdp = r.json()["cdpUrl"]
            assert urlsplit(cdp).hostname.endswith(".preview.example"), cdp
            with playwright_sync()() as p:
                browser = connect(p, cdp)
                page = browser.contexts[0].new_page()
                page.goto("file:///workspace/site/index.html", timeout=30000)
                assert page.title() == "served in the sandbox"
                browser.close()
            api.delete_all()
    finally:
        _finish_daemon(d)
