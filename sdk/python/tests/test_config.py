from __future__ import annotations

import os
from pathlib import Path

import pytest

from withruntime._config import default_state_dir, resolve_api_key, resolve_endpoint
from withruntime.errors import ConfigurationError


def test_default_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNTIME_BASE_URL")
    ep = resolve_endpoint()
    assert ep.url == "http://127.0.0.1:7878" and ep.uds is None


def test_address_from_env_and_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_BASE_URL", "http://127.0.0.1:9999/")
    assert resolve_endpoint().url == "http://127.0.0.1:9999"
    assert resolve_endpoint("http://localhost:1").url == "http://localhost:1"


def test_unix_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_BASE_URL", "unix:/run/runtime/runtimed.sock")
    ep = resolve_endpoint()
    assert ep.uds == "/run/runtime/runtimed.sock"
    assert ep.display == "unix:/run/runtime/runtimed.sock"
    with pytest.raises(ConfigurationError):
        resolve_endpoint("unix:")
    with pytest.raises(ConfigurationError):
        resolve_endpoint("ftp://x")


def test_key_from_argument_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_api_key("rt_arg") == "rt_arg"
    monkeypatch.setenv("RUNTIME_API_KEY", "rt_env")
    assert resolve_api_key() == "rt_env"


def test_key_from_admin_key_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RUNTIME_API_KEY")
    monkeypatch.setenv("RUNTIME_STATE_DIR", str(tmp_path))
    (tmp_path / "admin.key").write_text("rt_" + "b" * 40 + "\n")
    assert resolve_api_key() == "rt_" + "b" * 40


def test_missing_key_is_clear(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RUNTIME_API_KEY")
    monkeypatch.setenv("RUNTIME_STATE_DIR", str(tmp_path))
    with pytest.raises(ConfigurationError) as ei:
        resolve_api_key()
    assert "RUNTIME_API_KEY" in str(ei.value) and str(tmp_path / "admin.key") in str(ei.value)


def test_garbage_key_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RUNTIME_API_KEY")
    monkeypatch.setenv("RUNTIME_STATE_DIR", str(tmp_path))
    (tmp_path / "admin.key").write_bytes(b"x" * 100000)
    with pytest.raises(ConfigurationError):
        resolve_api_key()
    (tmp_path / "admin.key").write_text("two words")
    with pytest.raises(ConfigurationError):
        resolve_api_key()


def test_state_dir_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RUNTIME_STATE_DIR")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert default_state_dir() == Path("/var/lib/runtime")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_state_dir() == tmp_path / "runtime"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir() == Path.home() / ".local/state/runtime"
