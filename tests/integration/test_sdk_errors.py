"""Every error class of the SDK, raised by the real daemon where the daemon can be made to
answer that way, and a daemon that is not running."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))

from withruntime import Sandbox  # noqa: E402
from withruntime import errors as E  # noqa: E402


DRIVER: str | None = None


def pick_fast_driver(daemon) -> str | None:
    """namespace or gvisor when the daemon offers one: the daemon's default may be microvm under
    TCG here, seconds per start; the samples that run as written keep the default."""
    r = httpx.get(daemon.base_url + "/v1/info", headers={"Authorization": f"Bearer {daemon.api_key}"})
    available = {d.get("name") for d in r.json().get("drivers", []) if d.get("available")}
    return next((d for d in ("namespace", "gvisor") if d in available), None)


@pytest.fixture
def sdk_env(daemon, monkeypatch):
    global DRIVER
    DRIVER = pick_fast_driver(daemon)
    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    return daemon


def check_shape(err: E.APIError, status: int, code: str) -> None:
    assert err.status == status and err.code == code
    assert err.message and isinstance(err.message, str)
    assert err.request_id, "the daemon's request id reaches the exception"
    text = str(err)
    assert text.startswith(f"[{status} {code}] {err.message}")
    if err.hint:
        assert f"hint: {err.hint}" in text


def test_invalid_request(sdk_env):
    with pytest.raises(E.InvalidRequestError) as ei:
        Sandbox.create(driver=DRIVER, timeout_seconds=0)
    check_shape(ei.value, 400, "invalid_request")
    assert "timeoutSeconds" in ei.value.message


def test_authentication(sdk_env):
    with pytest.raises(E.AuthenticationError) as ei:
        Sandbox.create(driver=DRIVER, api_key="rt_" + "0" * 39 + "1")
    check_shape(ei.value, 401, "unauthorized")


def test_not_found(sdk_env):
    with pytest.raises(E.NotFoundError) as ei:
        Sandbox.connect("sbx_00000000000000000000")
    check_shape(ei.value, 404, "not_found")
    with Sandbox.create(driver=DRIVER, timeout_seconds=60) as sbx:
        with pytest.raises(E.NotFoundError):
            sbx.files.read("/workspace/no/such/file")


def test_conflict_on_a_stopped_sandbox(sdk_env):
    with Sandbox.create(driver=DRIVER, timeout_seconds=60) as sbx:
        sbx.stop()
        with pytest.raises(E.ConflictError) as ei:
            sbx.exec("echo hi")
        check_shape(ei.value, 409, "conflict")


def test_budget_exceeded(sdk_env):
    with pytest.raises(E.BudgetExceededError) as ei:
        Sandbox.create(driver=DRIVER, timeout_seconds=86400, max_cost_micros=1)
    check_shape(ei.value, 409, "budget_exceeded")
    assert isinstance(ei.value, E.ConflictError)


def test_unavailable_image(sdk_env):
    with pytest.raises(E.UnavailableError) as ei:
        Sandbox.create(driver=DRIVER, image="never-built")
    check_shape(ei.value, 503, "unavailable")


def test_payload_too_large(sdk_env):
    with Sandbox.create(driver=DRIVER, timeout_seconds=60) as sbx:
        with pytest.raises(E.PayloadTooLargeError) as ei:
            # An exec body over the daemon's 24 MiB limit (16 MiB of stdin
            # fits; 25 MiB does not).
            sbx.exec("cat > /dev/null", stdin="x" * (25 << 20))
        check_shape(ei.value, 413, "payload_too_large")


def _keys_supported(daemon) -> bool:
    r = httpx.get(daemon.base_url + "/v1/keys", headers={"Authorization": f"Bearer {daemon.api_key}"})
    return r.status_code == 200


def _make_key(daemon, **body) -> str:
    r = httpx.post(daemon.base_url + "/v1/keys", json=body,
                   headers={"Authorization": f"Bearer {daemon.api_key}"})
    assert r.status_code in (200, 201), r.text
    data = r.json()
    return data.get("key") or data.get("secret") or data["token"]


def test_permission_denied_for_a_read_key(sdk_env):
    if not _keys_supported(sdk_env):
        pytest.skip("this daemon has no /v1/keys route to make a read key with")
    key = _make_key(sdk_env, access="read", name="sdk-read")
    with pytest.raises(E.PermissionDeniedError) as ei:
        Sandbox.create(driver=DRIVER, api_key=key)
    check_shape(ei.value, 403, "forbidden")


def test_spending_limit_reached(sdk_env):
    if not _keys_supported(sdk_env):
        pytest.skip("this daemon has no /v1/keys route to make a key with a daily limit")
    key = _make_key(sdk_env, access="full", name="sdk-broke", dailyLimitMicros=1)
    with pytest.raises(E.SpendingLimitError) as ei:
        Sandbox.create(driver=DRIVER, api_key=key, timeout_seconds=3600)
    check_shape(ei.value, 402, "spending_limit_reached")
    assert not isinstance(ei.value, (E.PermissionDeniedError, E.RateLimitError))


@pytest.mark.slow
def test_rate_limited(sdk_env):
    made = []
    try:
        with pytest.raises(E.RateLimitError) as ei:
            for _ in range(300):  # above the daemon's --max-sandboxes-per-key (128)
                made.append(Sandbox.create(driver=DRIVER, timeout_seconds=300, memory_mib=64, keep=True))
        check_shape(ei.value, 429, "rate_limited")
    finally:
        for s in made:
            s.delete()
            s.close()


def test_daemon_not_running(fresh_daemon, monkeypatch):
    for k, v in fresh_daemon.env().items():
        monkeypatch.setenv(k, v)
    with Sandbox.create(driver=pick_fast_driver(fresh_daemon), timeout_seconds=60, keep=True) as sbx:
        sid = sbx.id
        fresh_daemon.stop()
        try:
            with pytest.raises(E.APIConnectionError) as ei:
                sbx.refresh()
            assert fresh_daemon.base_url in str(ei.value)
            assert "runtimed running" in str(ei.value)
            with pytest.raises(E.APIConnectionError):
                Sandbox.connect(sid)
        finally:
            fresh_daemon.start()
    Sandbox.connect(sid).delete()
