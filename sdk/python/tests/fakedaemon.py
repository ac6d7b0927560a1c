"""A small in-memory stand-in for the daemon's HTTP API, served through httpx.MockTransport,
for the SDK's own unit tests (argument mapping, error mapping, streaming, the tools' text).
The integration tests in tests/integration drive the real daemon.

Named apart from conftest.py so that test modules can import it whatever other conftest.py a
wider pytest run has loaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import httpx

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

KEY = "rt_" + "a" * 40


def api_error(status: int, code: str, message: str, hint: Optional[str] = None) -> httpx.Response:
    return httpx.Response(
        status,
        json={"error": {"code": code, "status": status, "message": message, "hint": hint, "requestId": "req_1"}},
        headers={"X-Request-Id": "req_1"},
    )


class FakeDaemon:
    """Records every request; answers from ``routes`` ((method, path) -> handler) or with a
    plain running sandbox."""

    def __init__(self) -> None:
        self.requests: List[httpx.Request] = []
        self.routes: Dict[Tuple[str, str], Callable[[httpx.Request], httpx.Response]] = {}
        self.sandbox: Dict[str, Any] = {"id": "sbx_1", "state": "running", "driver": "namespace"}

    def on(self, method: str, path: str, handler: Any) -> None:
        if not callable(handler):
            value = handler
            handler = lambda req: value  # noqa: E731
        self.routes[(method, path)] = handler

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return api_error(401, "unauthorized", "unknown key")
        h = self.routes.get((request.method, request.url.path))
        if h is not None:
            return h(request)
        if request.method == "POST" and request.url.path == "/v1/sandboxes":
            return httpx.Response(201, json=self.sandbox)
        if request.method == "GET" and request.url.path == "/v1/sandboxes/sbx_1":
            return httpx.Response(200, json=self.sandbox)
        if request.method == "DELETE" and request.url.path == "/v1/sandboxes/sbx_1":
            return httpx.Response(200, json={"id": "sbx_1", "state": "deleted"})
        return api_error(404, "not_found", f"no route {request.url.path}")

    def last_json(self) -> Any:
        return json.loads(self.requests[-1].content)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)
