from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

import withruntime
from withruntime import errors as E
from withruntime.errors import error_from_response

CASES = [
    (400, "invalid_request", E.InvalidRequestError),
    (401, "unauthorized", E.AuthenticationError),
    (402, "spending_limit_reached", E.SpendingLimitError),
    (403, "forbidden", E.PermissionDeniedError),
    (404, "not_found", E.NotFoundError),
    (409, "budget_exceeded", E.BudgetExceededError),
    (409, "conflict", E.ConflictError),
    (413, "payload_too_large", E.PayloadTooLargeError),
    (429, "rate_limited", E.RateLimitError),
    (500, "internal", E.InternalServerError),
    (503, "unavailable", E.UnavailableError),
]


@pytest.mark.parametrize("status,code,cls", CASES)
def test_every_code_maps_to_its_class(status: int, code: str, cls: type) -> None:
    body = {"error": {"code": code, "status": status, "message": "m", "hint": "h", "requestId": "req_9"}}
    err = error_from_response(status, body)
    assert type(err) is cls
    assert isinstance(err, E.APIError)
    assert (err.code, err.status, err.message, err.hint, err.request_id) == (code, status, "m", "h", "req_9")


def test_spending_limit_is_distinct() -> None:
    assert not issubclass(E.SpendingLimitError, E.PermissionDeniedError)
    assert not issubclass(E.SpendingLimitError, E.RateLimitError)
    assert issubclass(E.BudgetExceededError, E.ConflictError)


@pytest.mark.parametrize("status,cls", [(400, E.InvalidRequestError), (404, E.NotFoundError),
                                        (405, E.InvalidRequestError), (502, E.InternalServerError),
                                        (418, E.APIError)])
def test_status_decides_without_the_error_shape(status: int, cls: type) -> None:
    err = error_from_response(status, None, request_id="req_h", raw_text="<html>bad gateway</html>")
    assert type(err) is cls
    assert err.status == status
    assert err.request_id == "req_h"
    assert "bad gateway" in err.message


def test_str_reads_well() -> None:
    err = error_from_response(
        404,
        {"error": {"code": "not_found", "status": 404, "message": "no sandbox sbx_123",
                   "hint": "list your sandboxes with GET /v1/sandboxes", "requestId": "req_5f1c"}},
    )
    assert str(err) == (
        "[404 not_found] no sandbox sbx_123\n"
        "  hint: list your sandboxes with GET /v1/sandboxes\n"
        "  request id: req_5f1c"
    )
    assert "NotFoundError" in repr(err)


def test_hostile_message_is_bounded() -> None:
    err = error_from_response(400, {"error": {"code": "invalid_request", "message": "x" * 10**6}})
    assert len(str(err)) < 3000


def test_errors_raise_from_the_client(fake, sbx) -> None:
    from fakedaemon import api_error

    fake.on("GET", "/v1/sandboxes/sbx_1/files/stat", api_error(403, "forbidden", "permission denied"))
    with pytest.raises(E.PermissionDeniedError) as ei:
        sbx.files.stat("/root/x")
    assert ei.value.request_id == "req_1"
    fake.on("POST", "/v1/sandboxes/sbx_1:exec", api_error(409, "conflict", "sandbox is not running"))
    with pytest.raises(E.ConflictError):
        sbx.exec("true")


def test_wrong_key_is_authentication_error(fake) -> None:
    with pytest.raises(E.AuthenticationError):
        withruntime.Sandbox.create(api_key="rt_wrong", _transport=fake.transport())


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_no_daemon_is_one_clear_connection_error() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(E.APIConnectionError) as ei:
        withruntime.Sandbox.create(base_url=url)
    assert url in str(ei.value)
    assert "runtimed running" in str(ei.value)
    assert ei.value.__cause__ is None and ei.value.__suppress_context__


def test_no_daemon_on_a_unix_socket(tmp_path) -> None:
    path = tmp_path / "nothing.sock"
    with pytest.raises(E.APIConnectionError) as ei:
        withruntime.Sandbox.connect("sbx_1", base_url=f"unix:{path}")
    assert f"unix:{path}" in str(ei.value)


def test_async_no_daemon() -> None:
    async def body() -> None:
        url = f"http://127.0.0.1:{_closed_port()}"
        with pytest.raises(E.APIConnectionError) as ei:
            await withruntime.AsyncSandbox.create(base_url=url)
        assert url in str(ei.value)

    asyncio.run(body())


def test_timeout_is_a_connection_error_subclass(fake) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    fake.on("POST", "/v1/sandboxes", slow)
    with pytest.raises(E.APITimeoutError) as ei:
        withruntime.Sandbox.create(_transport=fake.transport())
    assert isinstance(ei.value, E.APIConnectionError)
    assert "127.0.0.1:7878" in str(ei.value)
