"""The default image and its microVM parts, made beside the first tests.

On a new machine the default image is minutes of mmdebstrap and pip, and
nearly every integration test needs it. The suite starts building it as soon
as the release build is done (then the microVM's parts from it, when the run
has microVM items), at normal priority since the run waits for it, and runs
first the items that need no image: the release lane's C unit tests, but
the drivers'. The image_dir fixture waits for this job and then checks the
image as before; if the job failed, the fixture builds again and reports the
failure itself. The job only warms the cache; it never decides a result.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from helpers.prebuild import stop_group, wait_group


class FirstImage:
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self, build: Path, image_dir: Path, log_path: Path, microvm: bool) -> None:
        """Starts the job when the default image is missing or stale and can be built here."""
        tool = build / "runtime-image-build"
        if self.proc is not None or os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
            return
        if subprocess.run([str(tool), "--check", str(image_dir), "default"]).returncode == 0:
            return
        image_dir.mkdir(parents=True, exist_ok=True)
        steps = [[str(tool), str(image_dir), "default"]]
        mvm = build / "runtime-microvm-build"
        if microvm and mvm.exists():
            steps.append([str(mvm), str(image_dir), "default"])
        script = " && ".join(shlex.join(s) for s in steps)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(["sh", "-c", script], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait(self, timeout: float = 1800) -> None:
        """Waits for the job; its result is not read here (the caller checks the image)."""
        wait_group(self.proc, timeout, 60)

    def stop(self) -> None:
        stop_group(self.proc, 60)


# The suite's one job (conftest.py starts it in build_dir; image_dir waits).
JOB = FirstImage()
