"""Our SDK's file watches and sandbox sessions against the real daemon, with the published
client's names: sbx.files.watch / files.watches, sbx.sessions.create/list/revoke and
Sandbox.from_session (blocking and asyncio)."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))

from withruntime import AsyncSandbox, Sandbox  # noqa: E402
from withruntime.errors import APIError, InvalidRequestError  # noqa: E402


@pytest.fixture
def sdk_env(daemon, monkeypatch):
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    return daemon


def test_watch_and_session(sdk_env, api, sandbox):
    sbx = Sandbox.connect(sandbox.id)
    sbx.exec("mkdir -p /workspace/sdkw")
    w = sbx.files.watch("/workspace/sdkw", recursive=True)
    assert w.id in [x["id"] for x in sbx.files.watches.list()]
    sbx.files.write("/workspace/sdkw/a.txt", "a")
    seen = []
    for event in w.events():
        seen.append(event)
        if event["path"] == "/workspace/sdkw/a.txt":
            break
    assert seen[-1]["type"] == "create"
    assert w.stop() is True

    made = sbx.sessions.create(ttl_seconds=300, origins=["https://app.example.com"], name="sdk")
    assert made["token"].startswith("rtsess_")
    s = Sandbox.from_session(made["token"], sbx.id)
    assert s.exec("echo via-session").stdout == "via-session\n"
    with pytest.raises(APIError) as e:
        s.stop()
    assert e.value.status == 403
    assert made["id"] in [x["id"] for x in sbx.sessions.list()]
    assert sbx.sessions.revoke(made["id"])["state"] == "revoked"
    with pytest.raises(APIError) as e:
        s.exec("true")
    assert e.value.status == 401
    with pytest.raises(InvalidRequestError):
        Sandbox.from_session("rt_" + "0" * 40, sbx.id)


def test_async_watch_and_session(sdk_env, api, sandbox):
    async def main():
        sbx = await AsyncSandbox.connect(sandbox.id)
        w = await sbx.files.watch("/workspace")
        await sbx.files.write("/workspace/async.txt", "x")
        got = []
        async for event in w.events():
            got.append(event)
            if event["path"] == "/workspace/async.txt":
                break
        assert await w.stop() is True
        made = await sbx.sessions.create()
        s = AsyncSandbox.from_session(made["token"], sbx.id)
        out = (await s.exec("echo a")).stdout
        await sbx.sessions.revoke(made["id"])
        return got, out

    got, out = asyncio.run(main())
    assert got[-1]["path"] == "/workspace/async.txt"
    assert out == "a\n"
