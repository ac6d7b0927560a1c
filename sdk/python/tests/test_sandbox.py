from __future__ import annotations

import base64
import io
import json

import httpx
import pytest

from fakedaemon import api_error
from withruntime import CommandResult, Sandbox
from withruntime.errors import ConflictError, InvalidRequestError, NotFoundError


def test_create_maps_python_names_to_the_api(fake) -> None:
    with Sandbox.create(
        timeout_seconds=900, on_lease_end="stop", vcpu=2, memory_mib=512, disk_mib=1024,
        network={"internet": True, "allow": ["pypi.org"]}, env={"A": "1"}, image="default",
        name="demo", labels={"team": "a"}, max_cost_micros=1000, max_total_cost_micros=5000,
        driver="namespace", _transport=fake.transport(),
    ) as sbx:
        body = json.loads(fake.requests[0].content)
        assert sbx.id == "sbx_1" and sbx.state == "running"
    assert body == {
        "timeoutSeconds": 900, "onLeaseEnd": "stop", "vcpu": 2, "memoryMiB": 512, "diskMiB": 1024,
        "network": {"internet": True, "allow": ["pypi.org"]}, "env": {"A": "1"}, "image": "default",
        "name": "demo", "labels": {"team": "a"}, "maxCostMicros": 1000, "maxTotalCostMicros": 5000,
        "driver": "namespace",
    }


def test_none_fields_are_left_out(fake) -> None:
    Sandbox.create(name=None, _transport=fake.transport()).close()
    assert json.loads(fake.requests[0].content) == {}


@pytest.mark.parametrize("wrong,near", [("memory_mb", "memory_mib"), ("timeoutSeconds", "timeout_seconds"),
                                        ("timeout", "timeout_seconds"), ("lables", "labels"),
                                        ("netwrok", "network")])
def test_unknown_field_suggests_the_nearest(fake, wrong: str, near: str) -> None:
    with pytest.raises(TypeError) as ei:
        Sandbox.create(**{wrong: 1}, _transport=fake.transport())
    assert f"did you mean {near!r}" in str(ei.value)
    assert not fake.requests


def test_with_block_deletes(fake) -> None:
    with Sandbox.create(_transport=fake.transport()):
        pass
    assert [(r.method, r.url.path) for r in fake.requests][-1] == ("DELETE", "/v1/sandboxes/sbx_1")


def test_keep_true_does_not_delete(fake) -> None:
    with Sandbox.create(keep=True, _transport=fake.transport()):
        pass
    assert all(r.method != "DELETE" for r in fake.requests)


def test_connect_does_not_delete(fake) -> None:
    with Sandbox.connect("sbx_1", _transport=fake.transport()) as sbx:
        assert sbx.state == "running"
    assert all(r.method != "DELETE" for r in fake.requests)


def test_already_deleted_is_fine_and_body_error_wins(fake) -> None:
    fake.on("DELETE", "/v1/sandboxes/sbx_1", api_error(404, "not_found", "gone"))
    with Sandbox.create(_transport=fake.transport()):
        pass
    fake.on("DELETE", "/v1/sandboxes/sbx_1", api_error(500, "internal", "boom"))
    with pytest.raises(KeyError):
        with Sandbox.create(_transport=fake.transport()):
            raise KeyError("the body's own error")


@pytest.mark.parametrize("bad", ["", "../keys", "sbx/../x", "a" * 200, 5, None])
def test_connect_rejects_non_ids(fake, bad) -> None:
    with pytest.raises(InvalidRequestError):
        Sandbox.connect(bad, _transport=fake.transport())
    assert not fake.requests


def test_lifecycle_routes(fake, sbx) -> None:
    fake.on("POST", "/v1/sandboxes/sbx_1:stop", httpx.Response(200, json={"id": "sbx_1", "state": "stopped"}))
    fake.on("POST", "/v1/sandboxes/sbx_1:extend",
            lambda r: httpx.Response(200, json={"id": "sbx_1", "state": "running", "leaseEndsAt": "T"}))
    assert sbx.extend(60).lease_ends_at == "T"
    assert fake.last_json() == {"seconds": 60}
    assert sbx.stop().state == "stopped"
    assert sbx.refresh().state == "running"
    with pytest.raises(InvalidRequestError):
        sbx.extend("60")  # type: ignore[arg-type]
    sbx.delete()
    assert sbx.state == "deleted"


def test_exec_string_and_argv(fake, sbx) -> None:
    answer = {"exitCode": 3, "stdout": "hi\n", "stderr": "", "timedOut": False,
              "stdoutTruncated": False, "stderrTruncated": False, "durationMs": 4}
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", httpx.Response(200, json=answer))
    r = sbx.exec("echo hi; exit 3", cwd="/tmp", env={"A": "1"}, stdin="in", timeout_seconds=2.5)
    assert r == CommandResult(3, "hi\n", "", False, False, False, 4)
    assert not r.ok
    assert fake.last_json() == {"command": "echo hi; exit 3", "cwd": "/tmp", "env": {"A": "1"},
                                "stdin": "in", "timeoutMs": 2500}
    assert fake.requests[-1].extensions["timeout"]["read"] == pytest.approx(32.5)
    sbx.exec(["printf", "%s", "a b"], stdin=b"\x00\xff")
    assert fake.last_json() == {"argv": ["printf", "%s", "a b"], "timeoutMs": 60000,
                                "stdinBase64": base64.b64encode(b"\x00\xff").decode()}


@pytest.mark.parametrize("bad", [[], [1, 2], 42, ""])
def test_exec_rejects_bad_commands(fake, sbx, bad) -> None:
    n = len(fake.requests)
    with pytest.raises(InvalidRequestError):
        sbx.exec(bad)
    assert len(fake.requests) == n


@pytest.mark.parametrize("bad", [0, -1, 86401, "10", True])
def test_exec_rejects_bad_timeouts(sbx, bad) -> None:
    with pytest.raises(InvalidRequestError):
        sbx.exec("true", timeout_seconds=bad)


def ndjson(*events: dict) -> httpx.Response:
    body = "".join(json.dumps(e) + "\n" for e in events).encode()
    return httpx.Response(200, content=body, headers={"Content-Type": "application/x-ndjson"})


def test_exec_streams_to_callbacks(fake, sbx) -> None:
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", ndjson(
        {"type": "start", "pid": 12},
        {"type": "stdout", "data": "one\n"},
        {"type": "stderr", "data": "warn\n"},
        {"type": "stdout", "data": "two\n"},
        {"type": "exit", "exitCode": 0, "timedOut": False, "durationMs": 7},
    ))
    seen = []
    r = sbx.exec("x", on_stdout=lambda d: seen.append(("out", d)), on_stderr=lambda d: seen.append(("err", d)))
    assert seen == [("out", "one\n"), ("err", "warn\n"), ("out", "two\n")]
    assert r.stdout == "one\ntwo\n" and r.stderr == "warn\n" and r.ok and r.duration_ms == 7
    assert fake.last_json()["stream"] is True


def test_streamed_output_kept_is_bounded(fake, sbx) -> None:
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", ndjson(
        *[{"type": "stdout", "data": f"line {i}\n"} for i in range(1000)],
        {"type": "exit", "exitCode": 0, "timedOut": False, "durationMs": 1},
    ))
    r = sbx.exec("x", on_stdout=lambda d: None, max_output_bytes=100)
    assert r.stdout_truncated and len(r.stdout.encode()) <= 100 and r.stdout.endswith("line 999\n")


def test_stream_error_event_raises(fake, sbx) -> None:
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", ndjson(
        {"type": "stdout", "data": "partial"},
        {"type": "error", "error": {"code": "unavailable", "status": 503, "message": "sandbox failed"}},
    ))
    from withruntime.errors import UnavailableError

    with pytest.raises(UnavailableError):
        sbx.exec("x", on_stdout=lambda d: None)


def test_stream_cut_short_raises(fake, sbx) -> None:
    from withruntime.errors import APIConnectionError

    fake.on("POST", "/v1/sandboxes/sbx_1:exec", ndjson({"type": "stdout", "data": "x"}))
    with pytest.raises(APIConnectionError, match="ended before"):
        sbx.exec("x", on_stdout=lambda d: None)


def test_stream_http_error(fake, sbx) -> None:
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", api_error(409, "conflict", "sandbox sbx_1 is not running"))
    with pytest.raises(ConflictError):
        sbx.exec("x", on_stdout=print)


def test_files_routes(fake, sbx) -> None:
    fake.on("GET", "/v1/sandboxes/sbx_1/files/content", httpx.Response(200, content=b"\x00bytes"))
    fake.on("PUT", "/v1/sandboxes/sbx_1/files/content",
            lambda r: httpx.Response(200, json={"path": "/workspace/" + r.url.params["path"], "size": len(r.content)}))
    fake.on("GET", "/v1/sandboxes/sbx_1/files/list", httpx.Response(200, json={
        "path": "/workspace", "truncated": True,
        "entries": [{"path": "/workspace/a", "name": "a", "type": "dir", "size": 0, "mode": 493, "mtime": "T"},
                    {"path": "/workspace/l", "name": "l", "type": "symlink", "size": 1, "mode": 511,
                     "mtime": "T", "target": "/"}]}))
    fake.on("GET", "/v1/sandboxes/sbx_1/files/stat",
            lambda r: api_error(404, "not_found", "no such file") if r.url.params["path"] == "nope"
            else httpx.Response(200, json={"path": "/workspace/a", "name": "a", "type": "file", "size": 3}))
    for op in ("mkdir", "rename"):
        fake.on("POST", f"/v1/sandboxes/sbx_1/files:{op}", httpx.Response(200, json={}))
    fake.on("POST", "/v1/sandboxes/sbx_1/files:remove",
            httpx.Response(200, json={"path": "/workspace/d", "removed": True, "entries": 4}))

    assert sbx.files.read("a.bin") == b"\x00bytes"
    assert fake.requests[-1].url.params["path"] == "a.bin"
    w = sbx.files.write("x.txt", "héllo", mode=0o755)
    assert (w.path, w.size) == ("/workspace/x.txt", 6)
    assert fake.requests[-1].content == "héllo".encode()
    assert fake.requests[-1].url.params["mode"] == "755"
    w = sbx.files.write("big.bin", io.BytesIO(b"z" * 3_000_000))
    assert fake.requests[-1].content == b"z" * 3_000_000 and w.size == 3_000_000
    entries = sbx.files.list("/workspace", depth=3)
    assert fake.requests[-1].url.params["depth"] == "3"
    assert entries.truncated and entries[0].is_dir and entries[1].target == "/"
    # An older daemon's spellings come back in today's shape.
    assert entries[0]["type"] == "directory" and entries[0]["mode"] == "0755" and entries[0].mode == 0o755
    assert entries[1]["symlinkTarget"] == "/"
    assert sbx.files.stat("a").is_file
    assert sbx.files.exists("a") and not sbx.files.exists("nope")
    sbx.files.mkdir("/workspace/d")
    assert fake.last_json() == {"path": "/workspace/d", "parents": True}
    assert sbx.files.remove("/workspace/d", recursive=True) is True
    assert fake.last_json() == {"path": "/workspace/d", "recursive": True}
    sbx.files.rename("a", "b")
    assert fake.last_json() == {"from": "a", "to": "b", "overwrite": False}
    sbx.files.rename("a", "b", overwrite=True)
    assert fake.last_json()["overwrite"] is True


def test_files_published_shapes(fake, sbx) -> None:
    fake.on("GET", "/v1/sandboxes/sbx_1/files/list", httpx.Response(200, json={
        "path": "/workspace", "truncated": False, "hasMore": False,
        "data": [{"path": "/workspace/a.py", "name": "a.py", "type": "file", "size": 3, "mode": "0644",
                  "modifiedAt": "2026-01-01T00:00:00Z"}]}))
    fake.on("GET", "/v1/sandboxes/sbx_1/files/stat",
            lambda r: httpx.Response(200, json={"path": r.url.params["path"], "exists": False}))
    fake.on("POST", "/v1/sandboxes/sbx_1/files:remove",
            httpx.Response(200, json={"path": "/workspace/x", "removed": False, "entries": 0}))
    found = sbx.files.glob("**/*.py")
    assert fake.requests[-1].url.params["glob"] == "**/*.py" and "depth" not in fake.requests[-1].url.params
    assert found == [{"path": "/workspace/a.py", "name": "a.py", "type": "file", "size": 3, "mode": "0644",
                      "modifiedAt": "2026-01-01T00:00:00Z"}]
    assert found[0].mode == 0o644 and found[0].mtime == "2026-01-01T00:00:00Z"
    sbx.files.list("/workspace", hidden=False, limit=5)
    assert fake.requests[-1].url.params["hidden"] == "false" and fake.requests[-1].url.params["limit"] == "5"
    st = sbx.files.stat("/workspace/x")
    assert st == {"path": "/workspace/x", "exists": False} and not st.exists
    assert not sbx.files.exists("/workspace/x")
    assert sbx.files.remove("/workspace/x") is False
    for bad in ({"limit": 0}, {"limit": 10001}, {"glob": ""}, {"depth": 11}, {"glob": "*", "depth": 33}):
        with pytest.raises(InvalidRequestError):
            sbx.files.list("/workspace", **bad)


@pytest.mark.parametrize("bad", ["", "a\x00b", "/" + "x" * 5000, 3])
def test_bad_paths_stay_local(fake, sbx, bad) -> None:
    n = len(fake.requests)
    with pytest.raises(InvalidRequestError):
        sbx.files.read(bad)
    assert len(fake.requests) == n


def test_not_found_file(fake, sbx) -> None:
    with pytest.raises(NotFoundError):
        sbx.files.read("nope")


def test_list_sandboxes(fake) -> None:
    fake.on("GET", "/v1/sandboxes", httpx.Response(200, json={"sandboxes": [{"id": "sbx_2", "state": "stopped"}]}))
    out = Sandbox.list(_transport=fake.transport())
    assert [s.id for s in out] == ["sbx_2"] and out[0].state == "stopped"


def test_big_writes_go_out_in_slices_with_their_length(fake) -> None:
    """A body over 1 MiB goes out in slices of at most 1 MiB with Content-Length (not chunked),
    whole and in order, whether it came as bytes, bytearray or memoryview."""
    chunks: list = []

    def recording(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            chunks.clear()
            for c in request.stream:  # type: ignore[union-attr]
                chunks.append(bytes(c))
            request._content = b"".join(chunks)
        return fake(request)

    n = 3 * 1024 * 1024 + 7
    data = bytes(range(256)) * (n // 256) + b"x" * (n % 256)
    fake.on("PUT", "/v1/sandboxes/sbx_1/files/content", lambda r: httpx.Response(200, json={
        "path": "/workspace/big.bin", "size": len(r.content)}))
    class Recording(httpx.BaseTransport):  # MockTransport reads the body before its handler
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return recording(request)

    with Sandbox.create(_transport=Recording()) as sbx:
        for body in (data, bytearray(data), memoryview(data)):
            w = sbx.files.write("big.bin", body)
            req = fake.requests[-1]
            assert req.headers["content-length"] == str(n)
            assert "transfer-encoding" not in req.headers
            assert req.content == data and w.size == n
            assert len(chunks) == 4 and max(map(len, chunks)) == 1024 * 1024
        # Small bodies stay one piece.
        sbx.files.write("small.bin", b"abc")
        assert fake.requests[-1].headers["content-length"] == "3" and chunks == [b"abc"]
