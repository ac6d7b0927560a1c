"""Three details of the API the published client (0.35.0) and its E2B drop-in rely on:
POST /v1/sandboxes/{id}/processes/{pid}:resize (a PTY process's size, as the terminal's resize
message sets it), GET /v1/sandboxes with order=asc|desc (createdAt to the millisecond, ties by
id, cursors stable in both orders) and POST /v1/sandboxes whose image names a snapshot (as the
E2B drop-in sends a template that is a snapshot's id)."""
from __future__ import annotations

import json
import re
import secrets

import pytest

from helpers import Api, assert_error, wait_until

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

PRELUDE = """
import json, sys
from withruntime import Runtime
rt = Runtime()
"""


@pytest.fixture
def owner(api):
    """A key of an owner of its own: its list holds only what the test made."""
    name = f"ci-surface-{secrets.token_hex(4)}"
    r = api.post("/v1/keys", json={"name": name, "owner": name})
    assert r.status_code == 201, r.text
    c = Api(api.daemon, key=r.json()["key"])
    c.key = r.json()["key"]
    yield c
    c.delete_all()
    c.close()


@pytest.fixture
def other_owner(api):
    name = f"ci-surface-other-{secrets.token_hex(4)}"
    r = api.post("/v1/keys", json={"name": name, "owner": name})
    assert r.status_code == 201, r.text
    c = Api(api.daemon, key=r.json()["key"])
    yield c
    c.delete_all()
    c.close()


# ---------------------------------------------------------------------------
# :resize


def spawn(api, sid: str, **body) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}/processes", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def stdout_of(api, sid: str, pid: str) -> str:
    r = api.get(f"/v1/sandboxes/{sid}/processes/{pid}/output", params={"cursor": 0})
    assert r.status_code == 200, r.text
    out = ""
    for line in r.text.splitlines():
        if line.strip():
            event = json.loads(line)
            if event.get("type") == "stdout":
                out += event.get("data", "")
    return out


# A terminal that says its size whenever asked, as `stty size` (rows, then columns).
SIZE_LOOP = "while :; do stty size; sleep 0.2; done"


def test_resize_a_pty_process(api, driver, other_owner):
    sbx = api.create_sandbox(driver=driver)
    proc = spawn(api, sbx.id, command=SIZE_LOOP, pty={"cols": 80, "rows": 24})
    pid = proc["id"]
    path = f"/v1/sandboxes/{sbx.id}/processes/{pid}:resize"
    wait_until(lambda: "24 80" in stdout_of(api, sbx.id, pid), 30, what="the first size")

    r = api.post(path, json={"cols": 132, "rows": 50})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == pid and r.json()["pty"] == {"cols": 132, "rows": 50}, r.json()
    # The terminal inside has the new size, and the process says so.
    wait_until(lambda: "50 132" in stdout_of(api, sbx.id, pid), 30, what="the new size inside")
    got = api.get(f"/v1/sandboxes/{sbx.id}/processes/{pid}").json()
    assert got["pty"] == {"cols": 132, "rows": 50}, got
    # The bounds of the terminal's own resize: 1 .. 1000 each.
    assert api.post(path, json={"cols": 1000, "rows": 1}).status_code == 200

    for body in ({"cols": 0, "rows": 24}, {"cols": 80, "rows": 0}, {"cols": 1001, "rows": 24},
                 {"cols": 80, "rows": 1001}, {"cols": -1, "rows": 24}, {"cols": "80", "rows": 24},
                 {"cols": 80.5, "rows": 24}, {"cols": None, "rows": 24}, {"cols": 80}, {"rows": 24}, {},
                 {"cols": 80, "rows": 24, "x": 1}):
        assert_error(api.post(path, json=body), 400, "invalid_request")
    for body in ({"cols": 2**63, "rows": 24}, [80, 24], "80x24"):
        assert_error(api.post(path, json=body), 400)
    assert_error(api.post(path, content=b"{", headers={"Content-Type": "application/json"}), 400)
    # The size is the last good one.
    assert api.get(f"/v1/sandboxes/{sbx.id}/processes/{pid}").json()["pty"] == {"cols": 1000, "rows": 1}

    # Unknown process, unknown sandbox, another owner's: 404, never which.
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}/processes/proc_{'0' * 16}:resize",
                          json={"cols": 80, "rows": 24}), 404, "not_found")
    assert_error(api.post(f"/v1/sandboxes/sbx_{'0' * 16}/processes/{pid}:resize",
                          json={"cols": 80, "rows": 24}), 404)
    assert_error(other_owner.post(path, json={"cols": 80, "rows": 24}), 404)

    # A process without a terminal, and one that ended: 409.
    plain = spawn(api, sbx.id, command="sleep 600")
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}/processes/{plain['id']}:resize",
                          json={"cols": 80, "rows": 24}), 409, "conflict", "terminal")
    done = spawn(api, sbx.id, command="true", pty={"cols": 80, "rows": 24})
    wait_until(lambda: api.get(f"/v1/sandboxes/{sbx.id}/processes/{done['id']}").json()["state"] != "running",
               30, what="the short process to end")
    assert_error(api.post(f"/v1/sandboxes/{sbx.id}/processes/{done['id']}:resize",
                          json={"cols": 80, "rows": 24}), 409, "conflict", "ended")


@pytest.mark.driver_independent
def test_resize_through_the_published_client(pub, api):
    sbx = api.create_sandbox()
    proc = spawn(api, sbx.id, command=SIZE_LOOP, pty={"cols": 80, "rows": 24})
    got = pub(PRELUDE + """
s = rt.sandboxes.get(sys.argv[1])
p = s.process(sys.argv[2])
p.resize(100, 30)
print(json.dumps(p.refresh()["pty"]))
""", sbx.id, proc["id"])
    assert got == {"cols": 100, "rows": 30}, got
    wait_until(lambda: "30 100" in stdout_of(api, sbx.id, proc["id"]), 30, what="the size inside")
    # E2B's pty.resize, by the terminal's pid.
    got = pub("""
import json
from withruntime.e2b import Sandbox, PtySize
import sys
sb = Sandbox.connect(sys.argv[1])
h = sb.pty.create(PtySize(rows=24, cols=80))
sb.pty.resize(h.pid, PtySize(rows=44, cols=144))
print(json.dumps(h.pid))
""", sbx.id)
    # The terminal E2B made is the sandbox's other PTY process.
    sizes = [p["pty"] for p in api.get(f"/v1/sandboxes/{sbx.id}/processes").json()["data"]
             if p["pty"] and p["id"] != proc["id"]]
    assert sizes == [{"cols": 144, "rows": 44}], (got, sizes)


# ---------------------------------------------------------------------------
# order=asc|desc


def listed(c, **params) -> list[dict]:
    r = c.get("/v1/sandboxes", params=params)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def walk(c, limit: int, **params) -> list[str]:
    """Every page's ids, in order, following nextCursor."""
    ids, cursor = [], None
    for _ in range(100):
        r = c.get("/v1/sandboxes", params={**params, "limit": limit, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["data"]) <= limit
        ids += [s["id"] for s in body["data"]]
        cursor = body["nextCursor"]
        assert body["hasMore"] == (cursor is not None)
        if cursor is None:
            return ids
    raise AssertionError("the pages never ended")


def test_list_order_and_pages(owner, any_driver):
    made = [owner.create_sandbox(driver=any_driver).id for _ in range(5)]
    every = listed(owner)
    assert sorted(s["id"] for s in every) == sorted(made)
    for s in every:
        assert RFC3339_MS.match(s["createdAt"]), s["createdAt"]
        assert RFC3339_MS.match(s["startedAt"]), s["startedAt"]
        assert s["createdAt"] <= s["startedAt"], s
    # Oldest first by createdAt, then id; desc is the exact reverse; asc is the default.
    asc = [s["id"] for s in every]
    assert asc == [s["id"] for s in sorted(every, key=lambda s: (s["createdAt"], s["id"]))]
    assert asc == [s["id"] for s in listed(owner, order="asc")]
    desc = [s["id"] for s in listed(owner, order="desc")]
    assert desc == asc[::-1]
    # Made one after another: the order they were made in, to the millisecond.
    assert asc == made, (asc, made)

    # Pages in either order: each sandbox once, in the order of the whole list.
    for limit in (1, 2, 3):
        assert walk(owner, limit) == asc
        assert walk(owner, limit, order="asc") == asc
        assert walk(owner, limit, order="desc") == desc

    # A page starts right after its cursor even when that sandbox went meanwhile.
    for order in ("asc", "desc"):
        whole = [s["id"] for s in listed(owner, order=order)]
        first = owner.get("/v1/sandboxes", params={"order": order, "limit": 2}).json()
        assert [s["id"] for s in first["data"]] == whole[:2]
        assert owner.delete(f"/v1/sandboxes/{whole[1]}").status_code == 200
        rest = owner.get("/v1/sandboxes", params={"order": order, "limit": 100,
                                                  "cursor": first["nextCursor"]}).json()
        assert [s["id"] for s in rest["data"]] == whole[2:], rest

    for bad in ("newest", "oldest", "ASC", "Desc", "", "asc,desc", "desc ", "1", "a" * 300):
        assert_error(owner.get("/v1/sandboxes", params={"order": bad}), 400, "invalid_request", "order")
    assert_error(owner.get("/v1/sandboxes", params=[("order", "asc"), ("cursor", "x.sbx_1")]), 400)
    assert_error(owner.get("/v1/sandboxes", params={"cursor": "-5." + asc[0]}), 400)
    assert_error(owner.get("/v1/sandboxes", params={"cursor": "99999999999999999999." + asc[0]}), 400)


@pytest.mark.driver_independent
def test_list_order_through_the_published_client(pub, owner):
    made = [owner.create_sandbox().id for _ in range(4)]
    asc = [s["id"] for s in listed(owner)]
    desc = [s["id"] for s in listed(owner, order="desc")]
    assert sorted(asc) == sorted(made)
    got = pub(PRELUDE + """
from withruntime.e2b import Sandbox
native = [s.id for s in rt.sandboxes.list(limit=3)]
def every(order):
    p, out = Sandbox.list(order=order, limit=3), []
    while p.has_next:
        out += [i.sandbox_id for i in p.next_items()]
    return out
print(json.dumps({"native": native, "desc": every("desc"), "asc": every("asc")}))
""", env={"RUNTIME_API_KEY": owner.key})
    # The client's own pages, and E2B's newest first (sorted on its side by createdAt): no ties.
    assert got["native"] == asc, got  # a Page walks every page
    assert got["desc"] == desc, got
    assert got["asc"] == asc, got


# ---------------------------------------------------------------------------
# image: a snapshot's id


def snapshot_of(api, sid: str) -> str:
    r = api.post(f"/v1/sandboxes/{sid}:snapshot", json={"mode": "disk"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_create_with_image_naming_a_snapshot(api, driver, other_owner):
    src = api.create_sandbox(driver=driver)
    src.exec("echo from-snapshot > /workspace/kept.txt")
    snap = snapshot_of(api, src.id)
    copy = api.create_sandbox(image=snap)
    assert copy["driver"] == driver and copy["image"] == src["image"], copy
    assert copy.exec("cat /workspace/kept.txt")["stdout"] == "from-snapshot\n"
    # The same as a create with snapshot: its fields are the snapshot's, others are refused.
    assert_error(api.post("/v1/sandboxes", json={"image": snap, "diskMiB": 1}), 400, "invalid_request")
    assert_error(api.post("/v1/sandboxes", json={"image": snap, "snapshot": "snp_" + "0" * 20}), 400,
                 "invalid_request")
    both = api.create_sandbox(image=snap, snapshot=snap)
    assert both.exec("cat /workspace/kept.txt")["stdout"] == "from-snapshot\n"

    # Another owner's snapshot is as unknown as one that never was.
    theirs = assert_error(other_owner.post("/v1/sandboxes", json={"image": snap}), 404, "not_found")
    unknown = assert_error(api.post("/v1/sandboxes", json={"image": "snp_" + "0" * 20}), 404, "not_found")
    assert theirs["message"].replace(snap, "X") == unknown["message"].replace("snp_" + "0" * 20, "X")
    assert not other_owner.get("/v1/sandboxes").json()["data"]
    # Not a snapshot's id: 400, not a 503 for an image that was never built.
    for bad in ("snp_", "snp_xyz", "snp_" + "0" * 19, "snp_" + "0" * 21, "snp_" + "A" * 20, "snp_" + "g" * 20):
        assert_error(api.post("/v1/sandboxes", json={"image": bad}), 400, "invalid_request")
    assert_error(api.post("/v1/sandboxes", json={"image": "snp_\u0000" + "0" * 19}), 400)


@pytest.mark.driver_independent
def test_e2b_template_that_is_a_snapshot(pub, api, other_owner):
    src = api.create_sandbox()
    src.exec("echo e2b > /workspace/t.txt")
    snap = snapshot_of(api, src.id)
    got = pub("""
import json, sys
from withruntime.e2b import Sandbox
sb = Sandbox.create(sys.argv[1])
print(json.dumps(sb.sandbox_id))
""", snap)
    api.created.append(got)
    assert api.exec(got, command="cat /workspace/t.txt")["stdout"] == "e2b\n"
    # Another owner's template that is this snapshot: not found.
    r = pub("""
import json, sys
from withruntime.e2b import Sandbox
try:
    Sandbox.create(sys.argv[1])
    print(json.dumps("made"))
except Exception as e:
    print(json.dumps(type(e).__name__))
""", snap, env={"RUNTIME_API_KEY": other_owner.headers["Authorization"].split(" ", 1)[1]})
    assert r != "made", r
    assert not other_owner.get("/v1/sandboxes").json()["data"]
