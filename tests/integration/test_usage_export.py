"""The usage export (docs/api.md, "GET /v1/usage/export"): an owner's settled charges one row each,
in pages the published client's usage_export follows by nextCursor, CSV (the header on the first
page only, a key's name never a formula) and JSON alike, money and quantities as decimal strings,
each row final once its sandbox is deleted, finalThrough held back by a charge still open; bad
input refused; another owner's charges never shown."""
from __future__ import annotations

import csv
import io
import uuid
from datetime import datetime, timedelta, timezone

from helpers import Api, assert_error

HOSTILE_NAME = '=HYPERLINK("http://attacker.test","open"),"x'


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner(daemon, name: str | None = None) -> tuple[str, str]:
    owner = f"exp-{uuid.uuid4().hex[:8]}"
    with Api(daemon) as admin:
        r = admin.post("/v1/keys", json={"name": name or owner, "owner": owner})
        assert r.status_code == 201, r.text
        return owner, r.json()["key"]


def test_export_pages_csv_and_json(daemon, published_client):
    start = datetime.now(timezone.utc) - timedelta(minutes=1)
    owner, key = _owner(daemon, HOSTILE_NAME)
    with Api(daemon, key=key) as c:
        made = [c.create_sandbox(driver="namespace", vcpu=1, memoryMiB=64, timeoutSeconds=120) for _ in range(4)]
        for sbx in made[:3]:
            assert c.delete(f"/v1/sandboxes/{sbx.id}").status_code == 200
        running = made[3]
        stopped = c.create_sandbox(driver="namespace", vcpu=1, memoryMiB=64, timeoutSeconds=120)
        assert c.post(f"/v1/sandboxes/{stopped.id}:stop", json={}).status_code == 200
    until = datetime.now(timezone.utc) + timedelta(minutes=1)

    got = published_client.run_json(daemon, f"""
import json
from withruntime import Runtime
rt = Runtime()
pages, cursor = [], None
while True:
    page = rt.usage_export({_iso(start)!r}, {_iso(until)!r}, cursor=cursor, limit=2)
    pages.append(page)
    cursor = page["nextCursor"]
    if cursor is None:
        break
print(json.dumps(pages))
""", env={"RUNTIME_API_KEY": key})
    assert len(got) == 2 and got[0]["hasMore"] and not got[1]["hasMore"], got
    text = "".join(p["csv"] for p in got)
    assert text.count("settledAt,") == 1 and got[0]["csv"].startswith("settledAt,product,resourceId,")
    table = list(csv.DictReader(io.StringIO(text, newline="")))
    rows = [r for p in got for r in p["rows"]]
    assert len(table) == len(rows) == 4, text
    assert {r["resourceId"] for r in rows} == {s.id for s in made[:3]} | {stopped.id}
    assert running.id not in text  # its charge is still open: nothing settled yet
    for r, line in zip(rows, table):
        assert {k: v for k, v in line.items() if k != "keyName"} == \
            {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in r.items() if k != "keyName"}, (r, line)
        # The name comes back whole in JSON, and in CSV a text that starts with a quote mark.
        assert r["keyName"] == HOSTILE_NAME and line["keyName"] == "'" + HOSTILE_NAME
        assert r["product"] == "sandbox" and r["unit"] == "second" and r["unitPriceMicros"] == "9570"
        assert r["quantity"].isdigit() and r["amountMicros"] == str(9570 * int(r["quantity"]) // 3600)
        assert r["final"] is (r["resourceId"] != stopped.id), r
    ends = [r["settledAt"] for r in rows]
    assert ends == sorted(ends)
    # An open charge holds finalThrough back to its heartbeat, before until.
    assert got[0]["finalThrough"] < _iso(until)

    # The same rows as /v1/usage sums up.
    with Api(daemon, key=key) as c:
        total = c.get("/v1/usage", params={"since": _iso(start), "until": _iso(until)}).json()
        open_micros = next(s["micros"] for s in total["sandboxes"] if s["sandboxId"] == running.id)
        assert total["totalMicros"] - open_micros == sum(int(r["amountMicros"]) for r in rows)


def test_export_refusals_and_owners(daemon):
    _, key = _owner(daemon)
    _, other = _owner(daemon)
    now = datetime.now(timezone.utc)
    since, until = _iso(now - timedelta(hours=1)), _iso(now + timedelta(minutes=1))
    with Api(daemon, key=key) as c, Api(daemon, key=other) as o:
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        assert c.delete(f"/v1/sandboxes/{sbx.id}").status_code == 200
        mine = c.get("/v1/usage/export", params={"since": since, "until": until}).json()
        assert [r["resourceId"] for r in mine["rows"]] == [sbx.id] and mine["nextCursor"] is None
        theirs = o.get("/v1/usage/export", params={"since": since, "until": until}).json()
        assert theirs["rows"] == [] and theirs["csv"].startswith("settledAt,") and sbx.id not in theirs["csv"]
        for params, field in (({"until": until}, "since"), ({"since": since}, "until"),
                              ({"since": "yesterday", "until": until}, "since"),
                              ({"since": until, "until": since}, "since"),
                              ({"since": "2020-01-01T00:00:00Z", "until": until}, "367"),
                              ({"since": since, "until": until, "limit": "0"}, "limit"),
                              ({"since": since, "until": until, "limit": "1001"}, "limit"),
                              ({"since": since, "until": until, "cursor": "1.2.sbx_x;DROP"}, "cursor"),
                              ({"since": since, "until": until, "cursor": "x" * 200}, "cursor")):
            assert_error(c.get("/v1/usage/export", params=params), 400, "invalid_request", mentions=field)
