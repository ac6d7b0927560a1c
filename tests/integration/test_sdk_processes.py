"""Our SDK's process calls against the real daemon (on namespace; on every driver with
RUNTIME_TEST_ALL=1, like the other tests of a client): exec_stream with process
ids, spawn returning a Process (output, write, kill, wait), processes(), and exec's published
names (check=, timeout_ms=, idempotency_key=, user=), sync and async."""
from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))

from withruntime import AsyncProcess, AsyncSandbox, CommandError, Process, Sandbox  # noqa: E402
from withruntime.errors import InvalidRequestError  # noqa: E402


# A client's calls, whose answers do not depend on the driver: by default on namespace only
# (conftest.py, driver_independent); each driver's own behaviour is checked by the tests of it.
pytestmark = pytest.mark.driver_independent


@pytest.fixture
def sdk(daemon, monkeypatch):
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    return daemon


@pytest.fixture
def sbx(sdk, sandbox):
    with Sandbox.connect(sandbox.id) as s:
        yield s


def test_exec_stream_has_process_ids(sbx):
    events = list(sbx.exec_stream("echo a; echo b >&2", timeout_ms=30_000))
    assert events[0]["type"] == "start" and events[0]["process_id"].startswith("proc_")
    assert [e["data"] for e in events if e["type"] == "stdout"] == ["a\n"]
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0
    seen = []
    r = sbx.exec("echo x", on_stdout=seen.append)
    assert r.process_id and r.process_id.startswith("proc_") and seen == ["x\n"]


def test_exec_published_names(sbx):
    with pytest.raises(CommandError) as e:
        sbx.exec("echo bad >&2; exit 2", check=True)
    assert e.value.result.exit_code == 2 and "bad" in e.value.result.stderr
    r = sbx.exec("sleep 10", timeout_ms=500)
    assert r.timed_out
    with pytest.raises(CommandError):
        sbx.exec("sleep 10", timeout_ms=500, check=True)
    assert sbx.exec("id -u", user="root").stdout == "0\n"
    with pytest.raises(InvalidRequestError):
        sbx.exec("true", user="nobody")
    key = f"sdk-once-{uuid.uuid4().hex}"  # keys are the owner's, across its sandboxes
    first = [e for e in sbx.exec_stream("echo $RANDOM", idempotency_key=key)]
    again = [e for e in sbx.exec_stream("echo $RANDOM", idempotency_key=key)]
    assert first[0]["processId"] == again[0]["processId"]
    assert [e.get("data") for e in first if e["type"] == "stdout"] == \
        [e.get("data") for e in again if e["type"] == "stdout"]


def test_spawn_write_kill_wait(sbx):
    p = sbx.spawn("echo one; sleep 0.5; echo two")
    assert isinstance(p, Process) and p.state == "running"
    assert p.id in [x["id"] for x in sbx.processes()]
    r = p.wait()
    assert (r.exit_code, r.stdout, r.process_id, p.state) == (0, "one\ntwo\n", p.id, "exited")
    again = list(sbx.process(p.id).output(follow=False))
    assert "".join(e["data"] for e in again if e["type"] == "stdout") == "one\ntwo\n"
    assert again[-1]["type"] == "exit"
    cat = sbx.spawn("cat; echo end", stdin="pipe")
    cat.write("to ")
    cat.write(b"cat", eof=True)
    assert cat.wait().stdout == "to catend\n"
    sleeper = sbx.spawn("sleep 1000")
    sleeper.kill("KILL")
    w = sleeper.wait()
    assert w.exit_code == 137 and sleeper.state == "killed"


def test_async(sdk, sandbox):
    async def run():
        async with await AsyncSandbox.connect(sandbox.id) as s:
            p = await s.spawn("cat", stdin="pipe")
            assert isinstance(p, AsyncProcess)
            await p.write("async", eof=True)
            r = await p.wait()
            events = [e async for e in s.exec_stream(["echo", "streamed"])]
            listed = await s.processes()
            with pytest.raises(CommandError):
                await s.exec("exit 3", check=True, timeout_ms=10_000)
            return r.stdout, events, listed, p.id
    out, events, listed, pid = asyncio.run(run())
    assert out == "async"
    assert events[0]["type"] == "start" and events[-1]["exit_code"] == 0
    assert pid in [x["id"] for x in listed]
