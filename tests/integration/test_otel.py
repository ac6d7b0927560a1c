"""OpenTelemetry export (docs/api.md, "OpenTelemetry"): the published client's runtime.otel calls
against a daemon that allows loopback collectors; an owner's events arrive as OTLP logs and its
sandboxes' readings as OTLP metrics (OTLP's JSON over HTTP) at a collector the test runs on
loopback, with the export's headers, which are never answered back; a collector that is down holds
the export's place and what it missed arrives once it is back; endpoints, headers and signals a
client may not set are refused; another owner's export is not found."""
from __future__ import annotations

import json
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, free_port, wait_until


class Collector:
    """An OTLP/HTTP receiver on loopback: records each POST's path, headers and JSON body."""

    def __init__(self, port: int = 0):
        self.seen: list[dict] = []
        self.status = 200
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                       "body": json.loads(body)})
                    status = outer.status
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/otlp"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def logs(self) -> list[dict]:
        """Every log record received, with its attributes as a dict."""
        out = []
        with self.lock:
            for s in self.seen:
                if not s["path"].endswith("/v1/logs"):
                    continue
                for rl in s["body"]["resourceLogs"]:
                    for sl in rl["scopeLogs"]:
                        for rec in sl["logRecords"]:
                            attrs = {a["key"]: a["value"]["stringValue"] for a in rec["attributes"]}
                            out.append({**rec, "attrs": attrs, "resource": rl["resource"]})
        return out

    def metric_names(self) -> dict[str, list]:
        out: dict[str, list] = {}
        with self.lock:
            for s in self.seen:
                if not s["path"].endswith("/v1/metrics"):
                    continue
                for rm in s["body"]["resourceMetrics"]:
                    for sm in rm["scopeMetrics"]:
                        for m in sm["metrics"]:
                            points = (m.get("gauge") or m.get("sum"))["dataPoints"]
                            out.setdefault(m["name"], []).extend(points)
        return out

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def exporting(request, build_dir, image_dir, tmp_path_factory):
    """A daemon that allows loopback collectors and pushes every second, on each store."""
    args = ["--webhook-allow-cidr", "127.0.0.0/8", "--otel-interval-seconds", "1",
            "--sandbox-metrics-interval-seconds", "1"]
    if request.param == "postgresql":
        pg = request.getfixturevalue("postgres")
        db = f"rt_{uuid.uuid4().hex[:12]}"
        pg.psql(f"CREATE DATABASE {db}")
        args += ["--database", pg.url(db)]
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("otel") / "state",
                      f"runtime-test-{os.getpid()}-otel-{request.param}", extra_args=args)
    yield d
    _finish_daemon(d)


def _owner_key(d, owner: str) -> str:
    with Api(d) as admin:
        r = admin.post("/v1/keys", json={"name": owner, "owner": owner})
        assert r.status_code in (200, 201), r.text
        return r.json()["key"]


def test_events_and_metrics_reach_the_collector(exporting, published_client):
    owner = f"otel-{uuid.uuid4().hex[:8]}"
    key = _owner_key(exporting, owner)
    col = Collector()
    try:
        made = published_client.run_json(exporting, f"""
import json
from withruntime import Runtime
rt = Runtime()
x = rt.otel.create(endpoint={col.url!r}, headers={{"Authorization": "Bearer otlp-T0KEN-42"}})
print(json.dumps({{"made": x, "list": rt.otel.list(), "get": rt.otel.get(x["id"])}}))
""", env={"RUNTIME_API_KEY": key})
        x = made["made"]
        assert x["id"].startswith("otx_") and x["endpoint"] == col.url and x["enabled"] is True
        assert x["headerNames"] == ["Authorization"] and x["signals"] == ["logs", "metrics"]
        assert "otlp-T0KEN-42" not in json.dumps(made)  # the header's value is never answered back
        assert [e["id"] for e in made["list"]["data"]] == [x["id"]] and made["get"]["id"] == x["id"]

        def mine(name: str) -> list:
            return [p for p in col.metric_names().get(name, [])
                    if p["attributes"][0]["value"]["stringValue"] == sbx.id]

        with Api(exporting, key=key) as c:
            sbx = c.create_sandbox(driver="namespace", timeoutSeconds=120)
            sbx.run("head -c 8388608 /dev/zero > /workspace/blob")
            # Running: its readings after the file was written reach the collector.
            wait_until(lambda: any(int(p["asInt"]) >= 8 << 20 for p in mine("runtime.sandbox.disk.usage")) and
                       mine("runtime.sandbox.cpu.usage"), timeout=60, interval=0.25,
                       what="the sandbox's metrics at the collector")
            assert c.post(f"/v1/sandboxes/{sbx.id}:stop", json={}).status_code == 200

        def arrived():
            kinds = {(r["attrs"]["event.name"], r["attrs"]["runtime.resource.id"]) for r in col.logs()}
            return {("sandbox.created", sbx.id), ("sandbox.stopped", sbx.id)} <= kinds
        wait_until(arrived, timeout=60, interval=0.25, what="the sandbox's events at the collector")
        logs = [r for r in col.logs() if r["attrs"]["runtime.resource.id"] == sbx.id]
        created = next(r for r in logs if r["attrs"]["event.name"] == "sandbox.created")
        assert created["body"] == {"stringValue": "sandbox.created"} and created["timeUnixNano"].isdigit()
        assert created["attrs"]["runtime.event.id"].startswith("evt_") and created["attrs"]["runtime.key.id"]
        res = {a["key"]: a["value"]["stringValue"] for a in created["resource"]["attributes"]}
        assert res["service.name"] == "runtimed" and res["runtime.owner"] == owner
        # Events are pushed once each, in their order.
        ids = [r["attrs"]["runtime.event.id"] for r in col.logs()]
        assert len(ids) == len(set(ids)), ids
        mem = mine("runtime.sandbox.memory.usage")
        assert mem and all(int(p["asInt"]) > 0 and p["timeUnixNano"].isdigit() for p in mem)
        assert all(p["asDouble"] >= 0 for p in mine("runtime.sandbox.cpu.usage"))
        rx = mine("runtime.sandbox.network.receive")
        assert rx and all(int(p["startTimeUnixNano"]) < int(p["timeUnixNano"]) for p in rx)
        # The export's headers go with every push; the collector sees JSON.
        with col.lock:
            assert all(s["headers"]["authorization"] == "Bearer otlp-T0KEN-42" and
                       s["headers"]["content-type"] == "application/json" for s in col.seen)

        with Api(exporting, key=key) as c:
            got = c.get(f"/v1/otel-exports/{x['id']}").json()
            assert got["sentLogs"] >= 2 and got["sentPoints"] >= 1 and got["lastStatus"] == 200, got
            assert got["lastError"] is None and got["lastPushAt"]
            # Disabled: nothing more is pushed; deleted: gone.
            off = c.post(f"/v1/otel-exports/{x['id']}:update", json={"enabled": False}).json()
            assert off["enabled"] is False and off["headerNames"] == ["Authorization"]
            assert c.post(f"/v1/otel-exports/{x['id']}:delete", json={}).json() == {"id": x["id"], "deleted": True}
            assert_error(c.get(f"/v1/otel-exports/{x['id']}"), 404, "not_found")
    finally:
        col.close()


def test_a_collector_that_is_down_holds_the_place(exporting):
    key = _owner_key(exporting, f"otel-{uuid.uuid4().hex[:8]}")
    port = free_port()
    with Api(exporting, key=key) as c:
        r = c.post("/v1/otel-exports", json={"endpoint": f"http://127.0.0.1:{port}/", "signals": ["logs"]})
        assert r.status_code == 201, r.text
        x = r.json()
        sbx = c.create_sandbox(driver="namespace", timeoutSeconds=60)
        # Nobody listens: the push fails, and says so (once the event is a few seconds old: what
        # is younger waits for another host's older writes). A flush while the daemon's own push
        # is in flight is a 409.
        def failed():
            r = c.post(f"/v1/otel-exports/{x['id']}:flush", json={})
            assert r.status_code in (200, 409), r.text
            return r.status_code == 200 and r.json()["lastError"] and r.json()
        flushed = wait_until(failed, timeout=30, interval=0.5, what="a failed push")
        assert "127.0.0.1" in flushed["lastError"] or "onnect" in flushed["lastError"], flushed
        assert flushed["sentLogs"] == 0 and flushed["lastStatus"] is None, flushed
        col = Collector(port)
        try:
            # Back: what it missed arrives, once.
            wait_until(lambda: any(r["attrs"]["runtime.resource.id"] == sbx.id for r in col.logs()), timeout=30,
                       interval=0.25, what="the missed event at the collector once it is back")
            got = c.get(f"/v1/otel-exports/{x['id']}").json()
            assert got["lastError"] is None and got["sentLogs"] >= 1 and got["dropped"] == 0, got
            assert all(s["path"] == "/v1/logs" for s in col.seen)  # signals: logs only
        finally:
            col.close()


def test_otel_refusals_and_owners(exporting):
    key, other = _owner_key(exporting, f"otel-{uuid.uuid4().hex[:8]}"), _owner_key(exporting, f"otel-{uuid.uuid4().hex[:8]}")
    with Api(exporting, key=key) as c, Api(exporting, key=other) as o:
        url = "http://127.0.0.1:9/"
        for body, field in (({}, "endpoint"),
                            ({"endpoint": "http://169.254.169.254/"}, "169.254.169.254"),
                            ({"endpoint": "ftp://127.0.0.1/"}, "http"),
                            ({"endpoint": "http://user:pw@127.0.0.1/"}, "password"),
                            ({"endpoint": url, "headers": {"X-A": "a\r\nInjected: 1"}}, "headers"),
                            ({"endpoint": url, "headers": {"Content-Length": "1"}}, "headers"),
                            ({"endpoint": url, "headers": {"Bad Name": "x"}}, "headers"),
                            ({"endpoint": url, "headers": {"X-A": 1}}, "headers"),
                            ({"endpoint": url, "headers": ["X-A"]}, "headers"),
                            ({"endpoint": url, "headers": {f"X-{i}": "v" for i in range(17)}}, "headers"),
                            ({"endpoint": url, "signals": ["traces"]}, "signals"),
                            ({"endpoint": url, "signals": []}, "signals"),
                            ({"endpoint": url, "enabled": False}, "enabled"),
                            ({"endpoint": url, "what": 1}, "what")):
            assert_error(c.post("/v1/otel-exports", json=body), 400, "invalid_request", mentions=field)
        made = [c.post("/v1/otel-exports", json={"endpoint": url, "signals": ["metrics"]}) for _ in range(5)]
        assert all(r.status_code == 201 for r in made), [r.text for r in made]
        assert_error(c.post("/v1/otel-exports", json={"endpoint": url}), 409, "limit_exceeded")
        first = made[0].json()["id"]
        # Another owner: nothing of it, and nothing it can change.
        assert o.get("/v1/otel-exports").json()["data"] == []
        assert_error(o.get(f"/v1/otel-exports/{first}"), 404)
        assert_error(o.post(f"/v1/otel-exports/{first}:update", json={"enabled": False}), 404)
        assert_error(o.post(f"/v1/otel-exports/{first}:flush", json={}), 404)
        assert_error(o.delete(f"/v1/otel-exports/{first}"), 404)
        assert_error(c.get("/v1/otel-exports/otx_nothex"), 404)
        for r in made:
            assert c.delete(f"/v1/otel-exports/{r.json()['id']}").status_code == 200
