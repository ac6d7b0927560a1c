"""The published Python client (withruntime on the package index) in a virtual environment of
its own, for conformance tests: runtimed aims to be a drop-in server for it.

Its package name is our SDK's, so it is never imported by the suite's own interpreter: scripts
run in the venv's interpreter, isolated (-I: no PYTHONPATH, no user site, not the script's
directory), from a directory outside the checkout, with RUNTIME_API_URL and RUNTIME_API_KEY of
the daemon under test. The venv is made once under a fixed cache path and reused while its
recorded requirements match; it is built in a sibling directory and renamed into place, so
concurrent runs never see half of one.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

PUBLISHED_VERSION = "0.35.0"
DEFAULT_DIR = "/var/cache/runtime/published-client"
MARKER = "runtime-conformance.json"


def requirements() -> list[str]:
    """The published client, and the agent framework at the versions the suite itself runs, so
    the two clients are compared under the same llama-index."""
    reqs = [f"withruntime=={PUBLISHED_VERSION}"]
    for dist in ("llama-index-core", "llama-index-llms-openai"):
        try:
            reqs.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            reqs.append(dist)
    return reqs


class PublishedClientUnavailable(Exception):
    pass


def ensure_venv(base: Path | None = None, timeout: float = 900) -> Path:
    """The venv's directory, made if missing or stale. Raises PublishedClientUnavailable
    (with pip's own words) when the package index cannot be reached."""
    base = Path(base or os.environ.get("RUNTIME_TEST_PUBLISHED_CLIENT_DIR", DEFAULT_DIR))
    want = requirements()
    marker = base / MARKER
    if marker.exists():
        try:
            if json.loads(marker.read_text()).get("requirements") == want and (base / "bin" / "python").exists():
                return base
        except (OSError, ValueError):
            pass
    base.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=base.name + ".building-", dir=base.parent))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(work)], check=True, capture_output=True, timeout=300)
        pip = subprocess.run([str(work / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                              "-q", *want], capture_output=True, text=True, timeout=timeout)
        if pip.returncode != 0:
            raise PublishedClientUnavailable(f"pip install {' '.join(want)} failed:\n{pip.stderr[-2000:]}")
        (work / MARKER).write_text(json.dumps({"requirements": want}))
        stale = None
        if base.exists():
            stale = base.with_name(base.name + f".stale-{os.getpid()}")
            os.rename(base, stale)
        try:
            os.rename(work, base)
        except OSError:
            # Another run put one in place first: use it.
            shutil.rmtree(work, ignore_errors=True)
        if stale:
            shutil.rmtree(stale, ignore_errors=True)
        return base
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


@dataclass
class PublishedClient:
    venv: Path
    version: str

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, daemon, script: str, *, env: dict[str, str] | None = None, timeout: float = 300,
            args: list[str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Runs `script` (dedented Python source) in the venv against `daemon`."""
        full_env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "OPENAI_API_KEY") and not k.startswith("RUNTIME_")}
        full_env.update({"RUNTIME_API_URL": daemon.base_url, "RUNTIME_API_KEY": daemon.api_key or ""})
        full_env.update(env or {})
        with tempfile.TemporaryDirectory(prefix="published-client-") as d:
            path = Path(d) / "script.py"
            path.write_text(textwrap.dedent(script))
            r = subprocess.run([str(self.python), "-I", str(path), *(args or [])], env=full_env, cwd=d,
                               capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"published-client script failed ({r.returncode}):\n"
                                 f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-6000:]}")
        return r

    def run_json(self, daemon, script: str, **kw):
        """Runs a script whose last stdout line is JSON; returns it parsed."""
        out = self.run(daemon, script, **kw).stdout.strip().splitlines()
        assert out, "the script printed nothing"
        return json.loads(out[-1])


def published_client(venv: Path) -> PublishedClient:
    """Checks that the venv holds the published client, and not ours, and says which."""
    probe = subprocess.run([str(venv / "bin" / "python"), "-I", "-c",
                            "import json, withruntime; print(json.dumps([withruntime.__file__, "
                            "getattr(withruntime, '__version__', None)]))"],
                           capture_output=True, text=True, timeout=60, cwd="/")
    if probe.returncode != 0:
        raise PublishedClientUnavailable(f"the venv cannot import withruntime: {probe.stderr[-1000:]}")
    where, version = json.loads(probe.stdout)
    assert str(venv) in where, f"withruntime in the venv comes from {where}"
    return PublishedClient(venv, version or PUBLISHED_VERSION)
