"""Guard rails across hosts that share one PostgreSQL database (docs/fleet.md): a key's daily
spending limit holds for creates spread over three hosts at once. The hosts run on loopback, each
with its own state directory; the suite's PostgreSQL (helpers/postgres.py)."""
from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api


@pytest.fixture
def three_hosts(build_dir, image_dir, tmp_path, postgres):
    db = f"rt_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {db}")
    hosts = []
    try:
        for i, name in enumerate(("h1", "h2", "h3")):
            state = tmp_path / name
            if hosts:
                # Keys are the database's: the first host's admin key is every host's.
                state.mkdir()
                (state / "admin.key").write_text((hosts[0].state_dir / "admin.key").read_text())
            hosts.append(_start_daemon(build_dir, image_dir, state, f"runtime-test-{os.getpid()}-fl{i}",
                                       extra_args=["--database", postgres.url(db), "--host-id", name,
                                                   "--max-sandboxes-per-key", "100"]))
        yield hosts, db
    finally:
        for h in reversed(hosts):
            _finish_daemon(h)


def test_a_daily_limit_holds_across_hosts(three_hosts, postgres):
    hosts, db = three_hosts
    admin = Api(hosts[0])
    try:
        # What one lease of this shape reserves, measured on a key of its own.
        r = admin.post("/v1/keys", json={"name": "probe", "owner": "probe"})
        assert r.status_code == 201, r.text
        with Api(hosts[1], key=r.json()["key"]) as probe:
            sbx = probe.create_sandbox(driver="namespace", timeoutSeconds=60, vcpu=1, memoryMiB=512)
            lease = int(postgres.psql(f"SELECT amount_micros FROM reservations WHERE sandbox_id = '{sbx.id}'",
                                      db))
        assert lease > 0
        # A key whose day fits twenty such leases (and half of another).
        limit = 20 * lease + lease // 2
        r = admin.post("/v1/keys", json={"name": "capped", "owner": "capped", "dailyLimitMicros": limit})
        assert r.status_code == 201, r.text
        key = r.json()["key"]
        key_id = r.json()["id"]

        def create(i: int) -> int:
            with Api(hosts[i % 3], key=key) as c:
                return c.post("/v1/sandboxes", json={"driver": "namespace", "timeoutSeconds": 60, "vcpu": 1,
                                                     "memoryMiB": 512}).status_code
        with ThreadPoolExecutor(25) as pool:
            codes = list(pool.map(create, range(50)))
        made = codes.count(201)
        assert set(codes) <= {201, 402}, codes
        # Reserved before anything runs, in one serializable transaction per create: never past
        # the limit, and every create that fit was made.
        assert made == 20, codes
        held = int(postgres.psql(f"SELECT coalesce(sum(amount_micros), 0) FROM reservations "
                                 f"WHERE key_id = '{key_id}' AND settled_at IS NULL", db))
        assert held <= limit, (held, limit)
        spread = postgres.psql(f"SELECT host_id, count(*) FROM sandboxes s JOIN keys k ON k.id = s.key_id "
                               f"WHERE k.id = '{key_id}' GROUP BY host_id", db)
        assert len(spread.split()) == 3, spread  # the creates landed on every host
    finally:
        admin.close()
