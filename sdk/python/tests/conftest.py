"""Fixtures of the SDK's unit tests; the stand-in daemon is in fakedaemon.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakedaemon import KEY, FakeDaemon  # noqa: E402


@pytest.fixture
def fake() -> FakeDaemon:
    return FakeDaemon()


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RUNTIME_API_KEY", KEY)
    monkeypatch.setenv("RUNTIME_BASE_URL", "http://127.0.0.1:7878")
    monkeypatch.setenv("RUNTIME_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture
def sbx(fake: FakeDaemon) -> Any:
    from withruntime import Sandbox

    s = Sandbox.create(_transport=fake.transport())
    yield s
    s.close()
