"""The dashboard (docs/dashboard.md): the daemon serves its page, script and style sheet under a
strict Content-Security-Policy, and a real headless Chromium signs in with a key and reads what the
API shows that key. A read-only key sees a sandbox, the command it ran, a chart of its CPU and the
spending chart, and no button that changes anything; a full key stops the sandbox from the page.
Hostile sandbox names, labels, file names, key names and command lines show as text, never as
markup. The key never appears in a URL or the daemon's log."""
from __future__ import annotations

import os
import re
import time
import uuid

import httpx
import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import REPO, Api, wait_until
from helpers import browser

DASHBOARD = REPO / "src" / "dashboard"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@pytest.fixture(scope="module")
def dash(build_dir, image_dir, tmp_path_factory):
    """A daemon of this module that reads its sandboxes' metrics every second."""
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("dashboard") / "state",
                      f"runtime-test-{os.getpid()}-dash",
                      extra_args=["--sandbox-metrics-interval-seconds", "1"])
    yield d
    _finish_daemon(d)


def _keys(d, access: str = "read", name: str | None = None) -> tuple[str, str, str]:
    """A new owner's full key and a second key of it with `access`: (owner, full, other)."""
    owner = f"dash-{uuid.uuid4().hex[:8]}"
    with Api(d) as admin:
        r = admin.post("/v1/keys", json={"name": "agent", "owner": owner, "access": "full"})
        assert r.status_code == 201, r.text
        full = r.json()["key"]
    with Api(d, key=full) as c:
        r = c.post("/v1/keys", json={"name": name or "viewer", "access": access})
        assert r.status_code == 201, r.text
        return owner, full, r.json()["key"]


# ---------------------------------------------------------------------------
# What the daemon serves (no browser needed)


def test_files_served_with_a_strict_policy(dash):
    with httpx.Client(base_url=dash.base_url, timeout=30) as h:
        r = h.get("/dashboard")
        assert r.status_code == 308 and r.headers["location"] == "/dashboard/"
        for path, ctype in (("/dashboard/", "text/html"), ("/dashboard/app.js", "text/javascript"),
                            ("/dashboard/app.css", "text/css")):
            r = h.get(path)  # no key: the files hold no data
            assert r.status_code == 200, (path, r.text[:200])
            assert r.headers["content-type"].startswith(ctype), r.headers
            assert r.headers["content-security-policy"] == CSP
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["referrer-policy"] == "no-referrer"
            assert r.headers["cache-control"] == "no-store"
            name = "index.html" if path.endswith("/") else path.rsplit("/", 1)[1]
            assert r.content == (DASHBOARD / name).read_bytes(), f"{path} is not src/dashboard/{name}"
        assert h.post("/dashboard/").status_code == 405
        for path in ("/dashboard/x.js", "/dashboard/index.html", "/dashboard/%2e%2e/v1/keys", "/dashboard/app.js/",
                     "/dashboard//"):
            assert h.get(path).status_code == 404, path
        # The data behind it still needs a key.
        assert h.get("/v1/sandboxes").status_code == 401


def test_the_page_builds_no_markup_from_strings():
    """Every node is made with createElement and textContent: no API value can become markup.
    The page has no inline script, handler or style for the policy to have to allow."""
    js = (DASHBOARD / "app.js").read_text()
    for word in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setTimeout(\"", "setInterval(\"", "javascript:"):
        assert word not in js, f"app.js uses {word}"
    html = (DASHBOARD / "index.html").read_text()
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert re.search(r'\bsrc="/dashboard/app\.js"', tag), tag
    assert not re.search(r"<script\b[^>]*>\s*[^<\s]", html), "index.html has an inline script"
    assert not re.search(r"\son[a-z]+\s*=", html, re.I), "index.html has an inline handler"
    assert not re.search(r"\sstyle\s*=", html, re.I), "index.html has an inline style"
    assert "localStorage" not in js, "the key is kept for the tab only (sessionStorage)"


# ---------------------------------------------------------------------------
# In a real browser

needs_browser = pytest.mark.skipif(browser.skip_reason() is not None, reason=browser.skip_reason() or "")


@pytest.fixture
def chrome(tmp_path):
    drv = browser.start(tmp_path / "profile")
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


def _sign_in(drv, d, key: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    drv.get(d.base_url + "/dashboard/")
    box = _wait_for(drv, "input[type=password]")
    box.send_keys(key + Keys.ENTER)
    _wait_for(drv, "[data-testid=whoami]")
    assert not drv.find_elements(By.CSS_SELECTOR, "input[type=password]")


def _wait_for(drv, css: str, timeout: float = 30.0, text: str | None = None):
    """The first element matching css (whose text contains `text`), once the page shows it."""
    from selenium.webdriver.common.by import By

    def find():
        for e in drv.find_elements(By.CSS_SELECTOR, css):
            try:
                if text is None or text in e.text:
                    return e
            except Exception:  # replaced by a refresh meanwhile: look again
                return None
        return None
    return wait_until(find, timeout, what=f"{css!r}" + (f" with {text!r}" if text else "") +
                      f" on {drv.current_url}")


def _go(drv, d, route: str) -> None:
    drv.get(f"{d.base_url}/dashboard/#/{route}")


def _no_key_in_sight(drv, d, *keys: str) -> None:
    for k in keys:
        assert k not in drv.current_url
        assert k not in drv.title
        assert k not in drv.find_element("css selector", "html").get_attribute("outerHTML")
        assert k.encode() not in d.log_path.read_bytes(), "a key is in the daemon's log"


@needs_browser
def test_a_read_key_sees_a_sandbox_its_command_its_cpu_and_spending(dash, chrome):
    from selenium.webdriver.common.by import By
    owner, full, reader = _keys(dash)
    with Api(dash, key=full) as c:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=300, name="web-crawler",
                               labels={"team": "research"})
        r = c.post(f"/v1/sandboxes/{sbx.id}:exec",
                   json={"command": "python3 -c 'sum(range(3000000))' && echo crawled-42"})
        assert r.status_code == 200 and r.json()["exitCode"] == 0, r.text
        c.post(f"/v1/sandboxes/{sbx.id}:exec", json={"command": "false"})
        wait_until(lambda: c.get(f"/v1/sandboxes/{sbx.id}/metrics", params={"range": "15m"}).json()["points"],
                   30, what="a reading of the sandbox")

        _sign_in(chrome, dash, reader)
        who = chrome.find_element(By.CSS_SELECTOR, "[data-testid=whoami]").text
        assert owner in who and "read" in who, who
        row = _wait_for(chrome, f"[data-testid=sandbox-row][data-id='{sbx.id}']")
        assert "web-crawler" in row.text and "running" in row.text and "namespace" in row.text, row.text
        assert "team=research" in row.text, row.text

        _go(chrome, dash, f"sandboxes/{sbx.id}")
        cmd = _wait_for(chrome, "[data-testid=command-row]", text="crawled-42")
        assert re.search(r"(^|\s)0(\s|$)", cmd.text), f"exit code 0 not shown: {cmd.text!r}"
        failed = _wait_for(chrome, "[data-testid=command-row]", text="false")
        assert re.search(r"(^|\s)1(\s|$)", failed.text), failed.text
        chart = _wait_for(chrome, "[data-testid=cpu-chart] svg")
        assert chart.find_elements(By.CSS_SELECTOR, "polyline, circle"), "the CPU chart has no data drawn"
        assert not chrome.find_elements(By.CSS_SELECTOR, "[data-testid=stop-button]")
        assert not chrome.find_elements(By.CSS_SELECTOR, "[data-testid=delete-button]")

        _go(chrome, dash, "spending")
        bars = _wait_for(chrome, "[data-testid=spending-chart] svg")
        wait_until(lambda: bars.find_elements(By.CSS_SELECTOR, "rect"), 15, what="a bar of spending")
        assert "agent" in chrome.find_element(By.CSS_SELECTOR, "[data-testid=spending-chart]").text

        # Keys: a read key may not list them, and the page says so instead of failing.
        _go(chrome, dash, "keys")
        _wait_for(chrome, "h1", text="Keys")
        _wait_for(chrome, "main, body", text="read-only key")

        _no_key_in_sight(chrome, dash, reader, full)
        assert browser.console_problems(chrome) == []
        # The read key's view changed nothing.
        assert c.get(f"/v1/sandboxes/{sbx.id}").json()["state"] == "running"


@needs_browser
def test_a_full_key_stops_a_sandbox_from_the_page(dash, chrome):
    _, full, _ = _keys(dash)
    with Api(dash, key=full) as c:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=300, name="to-stop")
        _sign_in(chrome, dash, full)
        _go(chrome, dash, f"sandboxes/{sbx.id}")
        _wait_for(chrome, "[data-testid=stop-button]").click()
        wait_until(lambda: c.get(f"/v1/sandboxes/{sbx.id}").json()["state"] == "stopped", 60,
                   what="the sandbox stopped from the page")
        stops = c.get("/v1/audit", params={"sandboxId": sbx.id, "action": "sandbox.stop"}).json()["events"]
        assert len(stops) == 1 and stops[0]["status"] == 200, stops
        # The page follows: the sandbox shows as stopped, and the stop button is gone.
        _wait_for(chrome, "main, body", text="stopped")
        from selenium.webdriver.common.by import By
        wait_until(lambda: not chrome.find_elements(By.CSS_SELECTOR, "[data-testid=stop-button]"), 15,
                   what="the stop button gone once stopped")
        assert browser.console_problems(chrome) == []


HOSTILE = [
    "<img src=x onerror=alert(1)>",
    '"><svg onload=alert(2)>',
    "<script>alert(3)</script>",
    "javascript:alert(4)",
]


@needs_browser
def test_hostile_names_labels_files_and_commands_are_text(dash, chrome):
    from selenium.webdriver.common.by import By
    _, full, _ = _keys(dash, access="read", name=HOSTILE[0])
    with Api(dash, key=full) as c:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=300, name=HOSTILE[0],
                               labels={"x": HOSTILE[1], "y": HOSTILE[2]})
        for i, h in enumerate(HOSTILE):
            r = c.put(f"/v1/sandboxes/{sbx.id}/files/content", params={"path": f"/workspace/{i}{h.replace('/', '_')}"},
                      content=b"boo")
            assert r.status_code == 200, r.text
        r = c.post(f"/v1/sandboxes/{sbx.id}:exec", json={"argv": ["echo", *HOSTILE]})
        assert r.status_code == 200, r.text
        c.post(f"/v1/sandboxes/{sbx.id}/processes", json={"argv": ["echo", HOSTILE[1]]})

        _sign_in(chrome, dash, full)
        pages = [("sandboxes", f"[data-testid=sandbox-row][data-id='{sbx.id}']", "onerror=alert(1)"),
                 (f"sandboxes/{sbx.id}", "[data-testid=command-row]", "<script>alert(3)</script>"),
                 (f"sandboxes/{sbx.id}", "[data-testid=file-row]", "onerror=alert(1)"),
                 (f"sandboxes/{sbx.id}", "[data-testid=process-row]", "<svg onload=alert(2)>"),
                 ("keys", "main, body", "<img src=x onerror=alert(1)>"),
                 ("events", "main, body", "sandbox.created")]
        for route, css, text in pages:
            _go(chrome, dash, route)
            _wait_for(chrome, css, text=text)
            # No markup of theirs in the page: no image, no inline script, no handler attribute,
            # no javascript: link; and no dialog opened (selenium would have raised).
            made = chrome.execute_script("""
                const bad = [];
                for (const e of document.querySelectorAll('*')) {
                  if (['IMG', 'IFRAME', 'OBJECT', 'EMBED'].includes(e.tagName)) bad.push(e.tagName);
                  if (e.tagName === 'SCRIPT' && !e.src) bad.push('inline script');
                  for (const a of e.attributes)
                    if (/^on/i.test(a.name) || /^\\s*javascript:/i.test(a.value)) bad.push(e.tagName + ' ' + a.name);
                }
                return bad;""")
            assert made == [], (route, made)
        labels = chrome.execute_script("return document.body.innerText")
        assert HOSTILE[0] in labels
        assert browser.console_problems(chrome) == []
