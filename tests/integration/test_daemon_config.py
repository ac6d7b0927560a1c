"""runtimed --config FILE (docs/runtimed.md): the file's settings take effect
(where it listens and keeps its state, its limits and prices), a flag wins
over the file, and a bad file is refused at once, naming the file and the
line, with exit status 2. The docs list every option --help prints."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from conftest import _finish_daemon, _need_root
from helpers import REPO, Daemon, DaemonError, assert_error, tail, wait_until

import pytest


class ConfiguredDaemon(Daemon):
    """A runtimed whose command line is `--config FILE` and the flags a test
    adds: where it listens, its state, images and cgroup come from the file."""

    def __init__(self, build_dir: Path, image_dir: Path, state_dir: Path, cgroup_parent: str,
                 settings: list[str], flags: list[str]):
        super().__init__(build_dir, image_dir, state_dir, cgroup_parent)
        self.flags = flags
        self.config_path = state_dir.parent / "runtimed.conf"
        self.config_path.write_text("\n".join([
            "# runtimed's settings for this test",
            f"listen = 127.0.0.1:{self.port}",
            f"state-dir = {state_dir}    # a comment after a value",
            f"image-dir = {image_dir}",
            f"cgroup-parent = {cgroup_parent}",
            "",
            *settings,
        ]) + "\n")

    def argv(self) -> list[str]:
        return [str(self.build_dir / "runtimed"), "--config", str(self.config_path), *self.flags]


def test_settings_from_the_file_take_effect(build_dir, image_dir, tmp_path):
    _need_root()
    state = tmp_path / "state"
    d = ConfiguredDaemon(build_dir, image_dir, state, f"runtime-test-{os.getpid()}-config",
                         settings=["max-vcpu = 3",
                                   "max-memory-mib = 1024",
                                   "price-vcpu-hour-micros = 1234",
                                   "max-sandboxes-per-key = 7"],
                         flags=["--max-memory-mib", "2048"])
    try:
        # start() waits for /healthz on the file's port and for the admin key
        # in the file's state directory.
        d.start()
    except DaemonError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        assert (state / "admin.key").exists() and (state / "runtime.db").exists()
        # The server answers before the line is logged: wait for it, not for a guess.
        wait_until(lambda: f"listening on http://127.0.0.1:{d.port}" in tail(d.log_path), 10,
                   what="the log's listening line")
        with d.client() as c:
            info = c.get("/v1/info").json()
            assert info["limits"]["maxVcpu"] == 3, info["limits"]
            assert info["limits"]["priceVcpuHourMicros"] == 1234, info["limits"]
            assert info["limits"]["maxSandboxesPerKey"] == 7, info["limits"]
            # The flag, not the file.
            assert info["limits"]["maxMemoryMiB"] == 2048, info["limits"]
            # The file's limit holds for a create: 4 vCPUs are past it.
            assert_error(c.post("/v1/sandboxes", json={"vcpu": 4}), 400, "invalid_request", mentions="vcpu")
            assert_error(c.post("/v1/sandboxes", json={"memoryMiB": 4096}), 400, "invalid_request",
                         mentions="memoryMiB")
    finally:
        _finish_daemon(d)


def _refused(build_dir: Path, args: list[str]) -> subprocess.CompletedProcess:
    r = subprocess.run([str(build_dir / "runtimed"), *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (args, r.returncode, r.stdout[-500:], r.stderr[-500:])
    return r


@pytest.mark.parametrize("lines, where, why", [
    (["listen = 127.0.0.1:1", "max-cpus = 4"], 2, "unknown key 'max-cpus'"),
    (["# the limit", "", "max-vcpu = four"], 3, "max-vcpu wants a number 1..1024, not 'four'"),
    (["max-memory-mib = 63"], 1, "max-memory-mib wants a number 64..16777216, not '63'"),
    (["heartbeat-timeout-ms = 600001"], 1, "heartbeat-timeout-ms wants a number 1000..600000"),
    (["driver = qemu"], 1, "driver names no driver 'qemu'"),
    (["max-vcpu 4"], 1, "'max-vcpu 4' is not `key = value`"),
    (["max-vcpu = 2", "max-vcpu = 3"], 2, "max-vcpu is set again (first on line 1)"),
    (["doctor = yes"], 1, "doctor is given on the command line only"),
    (["listen = 127.0.0.1:1", "# " + "x" * 4096], 2, "the line is longer than 4096 bytes"),
])
def test_bad_config_file_refused(build_dir, tmp_path, lines, where, why):
    """Refused before anything starts: nothing is made in the file's state
    directory, and the message names the file, the line and what is wrong."""
    state = tmp_path / "state"
    conf = tmp_path / "runtimed.conf"
    conf.write_text("\n".join(lines) + f"\nstate-dir = {state}\n")
    r = _refused(build_dir, ["--config", str(conf)])
    assert f"runtimed: {conf}:{where}: {why}" in r.stderr, r.stderr
    assert not state.exists()


def test_bad_value_refused_even_when_a_flag_overrides_it(build_dir, tmp_path):
    conf = tmp_path / "runtimed.conf"
    conf.write_text("max-vcpu = many\n")
    r = _refused(build_dir, ["--max-vcpu", "4", "--config", str(conf)])
    assert f"{conf}:1: max-vcpu wants a number" in r.stderr, r.stderr


def test_missing_config_file_refused(build_dir, tmp_path):
    missing = tmp_path / "absent.conf"
    r = _refused(build_dir, ["--config", str(missing)])
    assert f"cannot read the config file {missing}: No such file or directory" in r.stderr, r.stderr
    r = _refused(build_dir, ["--config", str(tmp_path)])
    assert "is not a regular file" in r.stderr, r.stderr


def test_docs_list_every_option(build_dir):
    """docs/runtimed.md has a row for every option --help prints (both come
    from the one table, the docs by hand)."""
    out = subprocess.run([str(build_dir / "runtimed"), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out
    names = re.findall(r"^  --([a-z][a-z0-9-]*)", out.stdout, re.M)
    assert {"listen", "config", "max-vcpu", "egress-test-upstream", "version"} <= set(names), names
    doc = (REPO / "docs" / "runtimed.md").read_text()
    missing = [n for n in names if f"| `{n}` |" not in doc]
    assert not missing, f"docs/runtimed.md has no row for {missing}"
    rows = set(re.findall(r"^\| `([a-z][a-z0-9-]*)` \|", doc, re.M))
    assert rows <= set(names), f"docs/runtimed.md lists options runtimed does not have: {rows - set(names)}"
