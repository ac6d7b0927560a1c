#!/usr/bin/env python3
"""The screenshots of docs/dashboard.md, taken from the real thing: starts runtimed from build/ with a
state directory of its own, makes an owner with a few sandboxes (commands run, a file written, one
stopped), a snapshot and a webhook, and saves the dashboard's main pages as
docs/images/dashboard-<page>.png from a headless Chromium (Debian's chromium and chromium-driver,
driven by selenium).

    sudo python3 scripts/dashboard-screenshots.py [--image-dir /var/cache/runtime/images]

The daemon, its sandboxes and its state directory are gone when it ends."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from helpers import Api, Daemon, wait_until  # noqa: E402
from helpers import browser  # noqa: E402

PAGES = [
    ("sandboxes", "sandboxes", "[data-testid=sandbox-row]"),
    ("sandbox", "sandboxes/{sid}", "[data-testid=cpu-chart] svg"),
    ("spending", "spending", "[data-testid=spending-chart] svg"),
    ("events", "events", "[data-testid=event-row]"),
    ("webhooks", "webhooks/{hook}", "[data-testid=delivery-row]"),
    ("keys", "keys", "[data-testid=key-row]"),
]


def populate(d: Daemon) -> tuple[str, str, str]:
    """An owner `acme` with work to show; its full key, the sandbox and the webhook to show."""
    with Api(d) as admin:
        r = admin.post("/v1/keys", json={"name": "agent-prod", "owner": "acme", "access": "full",
                                         "dailyLimitMicros": 500_000})
        key = r.json()["key"]
    c = Api(d, key=key)
    c.post("/v1/keys", json={"name": "dashboard-viewer", "access": "read"})
    # A receiver that is not there: its deliveries show their failures and retries.
    r = c.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hooks/runtime", "events": ["sandbox."]})
    assert r.status_code == 201, r.text
    hook = r.json()["id"]
    crawler = c.create_sandbox(driver="namespace", timeoutSeconds=1800, name="web-crawler",
                               labels={"team": "research", "task": "crawl"})
    c.post(f"/v1/sandboxes/{crawler.id}:exec", json={"command": "pip --version"})
    c.put(f"/v1/sandboxes/{crawler.id}/files/content", params={"path": "/workspace/report.md"},
          content=b"# findings\n")
    c.post(f"/v1/sandboxes/{crawler.id}:exec", json={"command": "ls /workspace && wc -c report.md"})
    c.post(f"/v1/sandboxes/{crawler.id}/processes",
           json={"command": "python3 -c 'import time\nend = time.time() + 20\nwhile time.time() < end: pass'"})
    c.post(f"/v1/sandboxes/{crawler.id}:exec", json={"command": "test -f /workspace/missing"})
    analyst = c.create_sandbox(driver="namespace", timeoutSeconds=900, name="data-analyst",
                               labels={"team": "finance"})
    c.post(f"/v1/sandboxes/{analyst.id}:exec", json={"command": "python3 -c 'print(6 * 7)'"})
    c.post(f"/v1/sandboxes/{analyst.id}:snapshot", json={"name": "analyst-ready"})
    scratch = c.create_sandbox(driver="namespace", timeoutSeconds=300, name="scratch")
    c.post(f"/v1/sandboxes/{scratch.id}:stop", json={})
    # A minute of readings for the charts.
    wait_until(lambda: len(c.get(f"/v1/sandboxes/{crawler.id}/metrics", params={"range": "15m"})
                       .json()["points"]) >= 20, 90, interval=1, what="readings for the charts")
    return key, crawler.id, hook


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image-dir", default=os.environ.get("RUNTIME_TEST_IMAGE_DIR", "/var/cache/runtime/images"))
    ap.add_argument("--out", default=str(REPO / "docs" / "images"))
    args = ap.parse_args()
    why = browser.skip_reason()
    if why:
        print(why, file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(REPO / "build", Path(args.image_dir), Path(tmp) / "state", f"runtime-shots-{os.getpid()}",
                   extra_args=["--sandbox-metrics-interval-seconds", "2", "--webhook-allow-cidr", "127.0.0.0/8"])
        d.start()
        drv = None
        key = None
        try:
            key, sid, hook = populate(d)
            drv = browser.start(Path(tmp) / "profile", 1280, 860)
            drv.get(d.base_url + "/dashboard/")
            from selenium.webdriver.common.by import By
            from selenium.webdriver.common.keys import Keys
            wait_until(lambda: drv.find_elements(By.CSS_SELECTOR, "input[type=password]"), 30)
            drv.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(key + Keys.ENTER)
            wait_until(lambda: drv.find_elements(By.CSS_SELECTOR, "[data-testid=whoami]"), 30)
            for name, route, ready in PAGES:
                drv.get(f"{d.base_url}/dashboard/#/{route.format(sid=sid, hook=hook)}")
                wait_until(lambda: drv.find_elements(By.CSS_SELECTOR, ready), 30, what=f"{name} page")
                time.sleep(1.5)  # the page's other sections answer too
                height = drv.execute_script("return document.documentElement.scrollHeight")
                drv.set_window_size(1280, max(860, min(int(height) + 40, 2400)))
                time.sleep(0.5)
                drv.save_screenshot(str(out / f"dashboard-{name}.png"))
                drv.set_window_size(1280, 860)
                print(f"dashboard-{name}.png")
        finally:
            if drv is not None:
                drv.quit()
            if key:
                with Api(d, key=key) as c:
                    c.delete_all()
            d.stop()
            d.release_layer_pool()
    return 0


if __name__ == "__main__":
    sys.exit(main())
