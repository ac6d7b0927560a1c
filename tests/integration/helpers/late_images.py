"""The desktop and analysis images, and the packaging test's Debian root and
package, made beside the other tests.

On a new machine each of them is minutes of mmdebstrap or debootstrap, pip
or a compile, and the tests that need them used to wait for that in line. The
suite now starts one background job at low priority as soon as the default
image is ready: it builds the images that are missing or stale
(runtime-image-build, the same command the fixtures run), debootstraps the
packaging test's root and builds the package (`make deb`, the same call the
packaging test makes). The modules that need them run last (conftest.py),
so the job has the rest of the run to finish in.

The job only warms caches; it never decides a result. Every fixture still
runs its own build afterwards: runtime-image-build holds a lock per image,
so a fixture that comes while the job builds that image waits for it (the
job's priority is raised first) and then finds the image current, or, if the
job failed, builds it again and reports the failure itself. The Debian root
and the package have locks of their own (debian_root and package below).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.prebuild import raise_group, stop_group

NICE = 15
IMAGES = ("desktop", "analysis")
SUITE = "bookworm"
PACKAGING_CACHE = Path(os.environ.get("RUNTIME_PACKAGING_CACHE", "/var/cache/runtime/packaging"))
REPO = Path(__file__).resolve().parents[3]
# What the package is made from; a change to any of these makes a new .deb.
PACKAGE_INPUTS = ("Makefile", "VERSION", "debian", "packaging", "src", "images", "scripts/install-runsc.sh",
                  "scripts/runsc")
PACKAGE_TOOLS = ("dpkg-buildpackage", "dh", "git")


def _mirror() -> str:
    mirror = "http://deb.debian.org/debian"
    for f in Path("/etc/apt/sources.list.d").glob("*.sources"):
        for line in f.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    return mirror


def debian_root(cache: Path = PACKAGING_CACHE, timeout: float = 1800) -> Path:
    """debootstrap's minbase of bookworm under `cache`, made once, under a
    lock: the background job and the packaging test may both ask."""
    root = cache / f"{SUITE}-root"
    if (root / "usr/bin/apt-get").exists():
        return root
    if shutil.which("debootstrap") is None:
        raise FileNotFoundError("debootstrap is not installed")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{SUITE}-root.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "usr/bin/apt-get").exists():
            return root
        tmp = cache / f"{SUITE}-root.new"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", SUITE, str(tmp), _mirror()],
                       check=True, capture_output=True, timeout=timeout)
        tmp.rename(root)
    return root


def inputs_hash(repo: Path = REPO) -> str:
    """The hash of the files the package is made from (tracked and untracked, not ignored)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *PACKAGE_INPUTS],
                           cwd=repo, capture_output=True, check=True).stdout.split(b"\0")
    h = hashlib.sha256()
    for name in sorted(f for f in files if f):
        p = repo / os.fsdecode(name)
        if p.is_file():
            h.update(name + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _cached_package(cache: Path, digest: str) -> Path | None:
    found = sorted((cache / "deb" / digest).glob("runtime_*.deb"))
    return found[0] if found else None


def package(cache: Path = PACKAGING_CACHE, repo: Path = REPO, timeout: float = 1800) -> Path:
    """runtime_*.deb, built by `make deb` (dpkg-buildpackage, in a clean copy of
    the tree) unless the cache holds one of the same inputs; made once, under a
    lock: the background job and the packaging test may both ask. A failed
    build raises CalledProcessError with its output."""
    digest = inputs_hash(repo)
    if (found := _cached_package(cache, digest)) is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".deb.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (found := _cached_package(cache, digest)) is not None:
            return found
        build = cache / "deb-build"
        shutil.rmtree(build, ignore_errors=True)
        subprocess.run(["make", f"DEB_OUT={build}", "DEB_JOBS=2", "deb"], cwd=repo, check=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        made = sorted(build.glob("*.deb"))
        if not any(f.name.startswith("runtime_") for f in made):
            raise FileNotFoundError(f"make deb made no runtime_*.deb in {build}")
        out = cache / "deb" / digest
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in made:
            shutil.copy2(f, tmp / f.name)
        tmp.rename(out)
        shutil.rmtree(build, ignore_errors=True)
        return _cached_package(cache, digest)


class LateImages:
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self, tool: Path, image_dir: Path, log_path: Path, debian: bool) -> None:
        """Starts the job for what is missing; nothing when all is there."""
        if self.proc is not None or os.geteuid() != 0:
            return
        steps = []
        if shutil.which("mmdebstrap") is not None:
            steps += [(name, shlex.join([str(tool), str(image_dir), name])) for name in IMAGES
                      if subprocess.run([str(tool), "--check", str(image_dir), name]).returncode != 0]
        if debian and shutil.which("debootstrap") is not None \
                and not (PACKAGING_CACHE / f"{SUITE}-root/usr/bin/apt-get").exists():
            # As a module of the tests' package, so that its imports resolve.
            steps.append(("debian-root", f"cd {shlex.quote(str(Path(__file__).resolve().parents[1]))} && "
                                         f"{shlex.join([sys.executable, '-m', 'helpers.late_images', 'debian-root'])}"))
        if debian and all(shutil.which(t) for t in PACKAGE_TOOLS) \
                and _cached_package(PACKAGING_CACHE, inputs_hash()) is None:
            steps.append(("deb", f"cd {shlex.quote(str(Path(__file__).resolve().parents[1]))} && "
                                 f"{shlex.join([sys.executable, '-m', 'helpers.late_images', 'deb'])}"))
        if not steps:
            return
        # Each step on its own: one that fails leaves the next to run.
        script = "; ".join(f"( {cmd} ) || echo \"failed ($?): {name}\"" for name, cmd in steps)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(["nice", "-n", str(NICE), "sh", "-c", script],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def hurry(self) -> None:
        """A test now waits for the job: it runs at normal priority from here on."""
        raise_group(self.proc)

    def stop(self) -> None:
        stop_group(self.proc, 60)


# The suite's one job (conftest.py starts it; the tests that wait hurry it).
JOB = LateImages()


if __name__ == "__main__" and sys.argv[1:] == ["debian-root"]:
    print(debian_root())
elif __name__ == "__main__" and sys.argv[1:] == ["deb"]:
    try:
        print(package())
    except subprocess.CalledProcessError as e:
        sys.exit(f"make deb failed ({e.returncode}):\n{(e.stdout or b'')[-4000:].decode(errors='replace')}")
