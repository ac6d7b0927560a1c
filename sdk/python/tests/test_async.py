from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from fakedaemon import FakeDaemon, api_error
from withruntime import AsyncSandbox, Sandbox
from withruntime.errors import ConflictError, NotFoundError


def async_transport(fake: FakeDaemon) -> httpx.MockTransport:
    return httpx.MockTransport(fake)


def public_names(cls: type) -> set:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_same_names_as_the_sync_client() -> None:
    from withruntime import AsyncFiles, Files

    assert public_names(Sandbox) == public_names(AsyncSandbox)
    assert public_names(Files) == public_names(AsyncFiles)


def test_async_with_create_deletes(fake) -> None:
    async def body() -> None:
        async with AsyncSandbox.create(timeout_seconds=60, memory_mib=256, _transport=async_transport(fake)) as sbx:
            assert sbx.id == "sbx_1"
            assert json.loads(fake.requests[0].content) == {"timeoutSeconds": 60, "memoryMiB": 256}
        assert (fake.requests[-1].method, fake.requests[-1].url.path) == ("DELETE", "/v1/sandboxes/sbx_1")

    asyncio.run(body())


def test_await_create_then_async_with(fake) -> None:
    async def body() -> None:
        sbx = await AsyncSandbox.create(keep=True, _transport=async_transport(fake))
        async with sbx:
            pass
        assert all(r.method != "DELETE" for r in fake.requests)

    asyncio.run(body())


def test_unknown_field_is_type_error_before_any_request(fake) -> None:
    async def body() -> None:
        with pytest.raises(TypeError, match="did you mean 'disk_mib'"):
            AsyncSandbox.create(disk_mb=1, _transport=async_transport(fake))
        assert not fake.requests

    asyncio.run(body())


def test_async_exec_and_stream(fake) -> None:
    async def body() -> None:
        events = [{"type": "start", "pid": 1}, {"type": "stdout", "data": "a"}, {"type": "stderr", "data": "b"},
                  {"type": "exit", "exitCode": 137, "timedOut": True, "durationMs": 1000}]
        body = "".join(json.dumps(e) + "\n" for e in events).encode()
        fake.on("POST", "/v1/sandboxes/sbx_1:exec", httpx.Response(200, content=body))
        sbx = await AsyncSandbox.connect("sbx_1", _transport=async_transport(fake))
        got = []

        async def on_err(d: str) -> None:
            got.append(("err", d))

        r = await sbx.exec(["sleep", "9"], timeout_seconds=1, on_stdout=lambda d: got.append(("out", d)),
                           on_stderr=on_err)
        assert got == [("out", "a"), ("err", "b")]
        assert r.timed_out and r.exit_code == 137 and not r.ok
        fake.on("POST", "/v1/sandboxes/sbx_1:exec", api_error(409, "conflict", "not running"))
        with pytest.raises(ConflictError):
            await sbx.exec("true")
        await sbx.close()

    asyncio.run(body())


def test_async_files(fake) -> None:
    async def body() -> None:
        fake.on("GET", "/v1/sandboxes/sbx_1/files/content", httpx.Response(200, content="ü".encode()))
        fake.on("PUT", "/v1/sandboxes/sbx_1/files/content",
                httpx.Response(200, json={"path": "/workspace/x", "size": 2}))
        fake.on("GET", "/v1/sandboxes/sbx_1/files/stat", api_error(404, "not_found", "no such file"))
        fake.on("GET", "/v1/sandboxes/sbx_1/files/list", httpx.Response(200, json={"path": "/w", "entries": []}))
        sbx = await AsyncSandbox.connect("sbx_1", _transport=async_transport(fake))
        assert await sbx.files.read_text("x") == "ü"
        assert (await sbx.files.write("x", b"hi")).size == 2
        assert not await sbx.files.exists("x")
        with pytest.raises(NotFoundError):
            await sbx.files.stat("x")
        assert list(await sbx.files.list()) == []
        await sbx.close()

    asyncio.run(body())


def test_async_big_write_goes_out_in_slices(fake) -> None:
    n = 2 * 1024 * 1024 + 3
    data = bytes(range(256)) * (n // 256) + b"y" * (n % 256)
    chunks: list = []

    async def recording(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            async for c in request.stream:  # type: ignore[union-attr]
                chunks.append(bytes(c))
            request._content = b"".join(chunks)
        return fake(request)

    fake.on("PUT", "/v1/sandboxes/sbx_1/files/content",
            lambda r: httpx.Response(200, json={"path": "/workspace/b", "size": len(r.content)}))

    async def body() -> None:
        class Recording(httpx.AsyncBaseTransport):  # MockTransport reads the body before its handler
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                return await recording(request)

        sbx = await AsyncSandbox.connect("sbx_1", _transport=Recording())
        w = await sbx.files.write("b", bytearray(data))
        req = fake.requests[-1]
        assert req.headers["content-length"] == str(n) and "transfer-encoding" not in req.headers
        assert req.content == data and w.size == n
        assert [len(c) for c in chunks] == [1024 * 1024, 1024 * 1024, 3]
        await sbx.close()

    asyncio.run(body())
