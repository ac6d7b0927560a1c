"""`pip install ./sdk/python` gives an importable, typed package of the right version."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]


def test_install_from_source(tmp_path: Path) -> None:
    setuptools = pytest.importorskip("setuptools")
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    if (major, minor) < (70, 1):
        try:
            import wheel  # noqa: F401
        except ImportError:
            pytest.skip(f"setuptools {setuptools.__version__} cannot build a wheel without the wheel package")
    target = tmp_path / "site"
    # No build isolation and no index: the test uses the setuptools already installed and
    # never reaches for the network.
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps", "--no-index",
         "--target", str(target), str(PKG)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "withruntime" / "py.typed").is_file()
    code = ("import withruntime, withruntime.tools, importlib.metadata as m; "
            "print(withruntime.__file__); print(withruntime.__version__, m.version('withruntime'))")
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    where, versions = r.stdout.splitlines()
    assert where.startswith(str(target))
    assert versions == "0.1.0 0.1.0"


def test_version_matches_pyproject() -> None:
    import withruntime

    text = (PKG / "pyproject.toml").read_text()
    assert f'version = "{withruntime.__version__}"' in text
    assert 'dependencies = ["httpx' in text
