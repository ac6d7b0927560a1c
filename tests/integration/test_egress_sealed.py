"""Egress secrets are sealed at rest (docs/egress.md, "Secrets at rest"): the database keeps a
value sealed with a key that is not in it (the state directory's secrets.key, or
--secrets-key-file), bound to its owner and name; a copy of the database alone opens nothing, and a
sealed value moved to another row does not open there."""
from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from helpers import Api, Daemon, DaemonError


def test_values_are_sealed_in_the_database(fresh_daemon):
    value = "tok-" + os.urandom(8).hex()
    with Api(fresh_daemon) as c:
        r = c.put("/v1/egress-secrets/TOKEN", json={"value": value, "hosts": ["api.example.com"]})
        assert r.status_code in (200, 201), r.text
        r = c.post("/v1/egress-secrets/TOKEN:rotate", json={"value": value + "-2"})
        assert r.status_code == 200, r.text
    key = fresh_daemon.state_dir / "secrets.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert len(key.read_text().strip()) == 64
    db = sqlite3.connect(fresh_daemon.state_dir / "runtime.db")
    try:
        (stored,) = db.execute("SELECT value FROM egress_secrets WHERE name = 'TOKEN'").fetchone()
    finally:
        db.close()
    assert stored.startswith("sealed:v1:"), stored
    assert value not in stored
    # The API never shows it either.
    with Api(fresh_daemon) as c:
        assert value not in c.get("/v1/egress-secrets/TOKEN").text


def test_a_key_file_is_checked(build_dir, image_dir, tmp_path):
    bad = tmp_path / "secrets.key"
    bad.write_text("00" * 32 + "\n")
    os.chmod(bad, 0o644)  # readable by others: refused
    short = tmp_path / "short.key"
    short.write_text("abcd\n")
    os.chmod(short, 0o600)
    for path, words in ((bad, "mode 0600"), (short, "64 hex digits"), (tmp_path / "none.key", "cannot be read")):
        d = Daemon(build_dir, image_dir, tmp_path / f"state-{path.stem}", f"runtime-test-{os.getpid()}-seal",
                   ["--secrets-key-file", str(path)])
        try:
            with pytest.raises(DaemonError):
                d.start()
        finally:
            d.release_layer_pool()
        assert words in d.log_path.read_text(), d.log_path.read_text()[-2000:]
