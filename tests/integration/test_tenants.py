"""One owner cannot see or change what every owner shares: operations on the whole daemon
are the admin key's (docs/api.md names them), and /metrics shows a key that is not the
admin's only its own owner's sandboxes."""
from __future__ import annotations

import re

import httpx
import pytest

from helpers import Api, assert_error


@pytest.fixture
def owners(api, daemon):
    """A full key of another owner, a read key of that owner and a trial key;
    their clients, closed (their sandboxes deleted) at teardown."""
    made: list[Api] = []

    def client(key: str) -> Api:
        c = Api(daemon, key=key)
        made.append(c)
        return c

    r = api.post("/v1/keys", json={"name": "tenant-b", "owner": "tenant-b"})
    assert r.status_code == 201, r.text
    full = client(r.json()["key"])
    r = full.post("/v1/keys", json={"name": "tenant-b-read", "access": "read"})
    assert r.status_code == 201, r.text
    read = client(r.json()["key"])
    r = httpx.post(daemon.base_url + "/v1/trial", timeout=30)
    assert r.status_code == 201, r.text
    trial = client(r.json()["key"])
    yield {"full": full, "read": read, "trial": trial}
    for c in made:
        c.close()


def test_image_builds_are_the_admin_keys(api, owners):
    # A rebuild of a built-in image changes every owner's sandboxes: a full key of another
    # owner and a trial key are refused before anything runs, and a read key as before.
    for name, c in owners.items():
        err = assert_error(c.post("/v1/images/default:build"), 403, "forbidden")
        if name != "read":
            assert "admin" in err["message"], err
    # The admin key passes the check (an unknown recipe then answers 404, nothing is built).
    assert_error(api.post("/v1/images/nosuch:build"), 404, "not_found")
    for c in owners.values():
        assert_error(c.post("/v1/images/nosuch:build"), 403, "forbidden")


def _gauge(text: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r'^runtime_sandboxes\{state="(\w+)"\} (\d+)$', text, re.M)}


def test_metrics_show_a_key_its_owners_sandboxes_only(api, owners, any_driver):
    mine = api.create_sandbox(driver=any_driver, timeoutSeconds=300)
    assert mine.run("echo ok") == "ok\n"
    full = owners["full"]
    theirs = full.create_sandbox(driver=any_driver, timeoutSeconds=300)
    admin_view = api.get("/metrics")
    assert admin_view.status_code == 200, admin_view.text
    assert "runtime_http_requests_total" in admin_view.text and "runtime_execs_total" in admin_view.text
    assert _gauge(admin_view.text)["running"] >= 2, admin_view.text
    for name in ("full", "read"):
        r = owners[name].get("/metrics")
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain"), r.headers
        gauge = _gauge(r.text)
        assert gauge["running"] == 1 and gauge["stopped"] == 0 and gauge["failed"] == 0, r.text
        for daemon_wide in ("runtime_http_requests_total", "runtime_execs_total", "runtime_sandboxes_created_total",
                            "runtime_exec_duration_seconds"):
            assert daemon_wide not in r.text, f"{name} key sees {daemon_wide}:\n{r.text}"
    r = owners["trial"].get("/metrics")
    assert r.status_code == 200 and _gauge(r.text) == {"running": 0, "stopped": 0, "failed": 0}, r.text
    assert full.post(f"/v1/sandboxes/{theirs.id}:stop").status_code == 200
    gauge = _gauge(owners["read"].get("/metrics").text)
    assert gauge["running"] == 0 and gauge["stopped"] == 1, gauge


def _begin(sbx, path: str, size: int) -> httpx.Response:
    return sbx.api.post(f"/v1/sandboxes/{sbx.id}/uploads",
                        json={"path": path, "size": size, "sha256": "0" * 64})


def test_one_owners_uploads_never_refuse_anothers(api, owners, any_driver):
    # Owner A at its own bounds (--max-uploads-per-owner 16, --max-upload-mib-per-owner 1024):
    # its next upload is refused naming its own bound, and owner B's uploads go on.
    a = [api.create_sandbox(driver=any_driver, timeoutSeconds=300) for _ in range(3)]
    b = owners["full"].create_sandbox(driver=any_driver, timeoutSeconds=300)
    # The bytes: one upload declaring 1 GiB (its staging file is sparse) takes A's share.
    r = _begin(a[0], "/workspace/big", 1024 << 20)
    assert r.status_code == 200, r.text
    big = r.json()["uploadId"]
    err = assert_error(_begin(a[1], "/workspace/one", 1), 429, "rate_limited")
    assert "one owner" in err["message"] and "max-upload-mib-per-owner" in err["message"], err
    r = _begin(b, "/workspace/one", 1)
    assert r.status_code == 200, r.text
    assert b.api.post(f"/v1/sandboxes/{b.id}/uploads/{r.json()['uploadId']}:abort", json={}).status_code == 200
    assert a[0].api.post(f"/v1/sandboxes/{a[0].id}/uploads/{big}:abort", json={}).status_code == 200
    # The count: 16 uploads over two sandboxes (8 each, the sandbox's own bound), then a 17th in a third.
    ids = []
    for s in a[:2]:
        for i in range(8):
            r = _begin(s, f"/workspace/f{i}", 1)
            assert r.status_code == 200, r.text
            ids.append((s, r.json()["uploadId"]))
    err = assert_error(_begin(a[2], "/workspace/f", 1), 429, "rate_limited")
    assert "one owner" in err["message"], err
    r = _begin(b, "/workspace/two", 1)
    assert r.status_code == 200, r.text
    for s, uid in ids:
        assert s.api.post(f"/v1/sandboxes/{s.id}/uploads/{uid}:abort", json={}).status_code == 200
    assert _begin(a[2], "/workspace/f", 1).status_code == 200
