"""Rules of the suite itself, checked on its source.

An xfail hides whatever fails inside it, so each one is strict (it fails the
run once the limit it documents is gone) and says why, on the line that
applies it, so that a grep of tests/ for the marker's calls without
strict=True finds nothing.
conftest.py also fails any test that ran under a looser xfail marker.
"""
from __future__ import annotations

import re

from helpers import REPO

XFAIL_CALL = "xfail" + "("  # spelled apart so that this file is not a hit of its own rule


def _test_sources():
    for p in sorted((REPO / "tests").rglob("*")):
        if p.is_file() and p.suffix in (".py", ".c", ".h", ".ini", ".cfg", ".toml"):
            yield p


def test_every_xfail_is_strict_with_a_reason():
    loose = []
    for p in _test_sources():
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if XFAIL_CALL in line and not ("strict=True" in line and re.search(r"reason=\S", line)):
                loose.append(f"{p.relative_to(REPO)}:{n}: {line.strip()}")
    assert not loose, "xfail without strict=True and a reason on its line:\n" + "\n".join(loose)


def test_pytest_ini_makes_xfails_strict_and_reports_durations():
    ini = (REPO / "pytest.ini").read_text()
    assert re.search(r"^xfail_strict\s*=\s*true\s*$", ini, re.M), ini
    assert re.search(r"^addopts\s*=.*--durations=\d+", ini, re.M), ini


def test_test_modules_have_unique_names():
    # pytest imports test files by their base name (rootdir-relative imports, no packages):
    # two files of one name stop the whole run at collection.
    seen: dict[str, str] = {}
    clash = []
    for root in ("tests", "sdk/python/tests"):
        for p in sorted((REPO / root).rglob("test_*.py")):
            rel = str(p.relative_to(REPO))
            if p.name in seen:
                clash.append(f"{seen[p.name]} and {rel}")
            seen.setdefault(p.name, rel)
    assert not clash, "test files of the same name:\n" + "\n".join(clash)
