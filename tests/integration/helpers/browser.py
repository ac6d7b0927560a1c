"""A real headless Chromium (Debian's chromium and chromium-driver) driven over WebDriver by
selenium, for the dashboard's tests and its screenshots. The browser reaches loopback only: every
other address goes to a proxy at a port where nothing listens."""
from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

# What keeps the browser quiet and on loopback: no sync, no component or safe-browsing updates,
# no first-run pages; a proxy nobody answers for anything that is not loopback.
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
    "--disable-domain-reliability", "--disable-client-side-phishing-detection",
    "--proxy-server=http://127.0.0.1:9", "--window-size=1280,900",
)


def skip_reason() -> str | None:
    """Why no browser test can run here (None: they can)."""
    for p in (CHROMIUM, CHROMEDRIVER):
        if not Path(p).exists():
            return f"{p} is missing (Debian's chromium and chromium-driver; scripts/install-deps.sh installs them)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is missing (tests/requirements.txt)"
    return None


def start(profile_dir: Path, width: int = 1280, height: int = 900):
    """A new headless Chromium with its own profile; the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--window-size={width},{height}")
    opts.add_argument(f"--user-data-dir={profile_dir}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    shutil.rmtree(profile_dir, ignore_errors=True)
    profile_dir.mkdir(parents=True)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def console_problems(drv) -> list[str]:
    """The browser console's script errors and policy violations since the last call."""
    bad = []
    for e in drv.get_log("browser"):
        msg = e.get("message", "")
        if "Content Security Policy" in msg or "Uncaught" in msg or "TypeError" in msg or \
                "ReferenceError" in msg or "SyntaxError" in msg:
            bad.append(msg)
    return bad
