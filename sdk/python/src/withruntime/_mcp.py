"""``runtime.mcp`` and ``sbx.mcp``: the catalog of MCP servers and the servers running inside a
sandbox (docs/mcp.md, "Inside a sandbox"), with the published client's names. Written once as
generators of calls (_drive.py); the blocking and awaitable classes are in sandbox.py and
async_sandbox.py. Private."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ._drive import Call
from ._models import sandbox_path

# A start answers once each server runs or failed: the daemon waits up to 40 s for them.
START_TIMEOUT_SECONDS = 120.0


class McpOps:
    """``runtime.mcp``: the catalog of the MCP servers a sandbox can run."""

    def catalog(self) -> List[Dict[str, Any]]:
        """Each server a start may name: ``[{id, description, transport, package, secrets,
        inImage, image}]``; ``secrets`` are the environment names it takes secrets in."""
        out = yield Call(self._http.request, "GET", "/v1/mcp/catalog")
        return list(out["data"])


class SandboxMcpOps:
    """``sbx.mcp``: catalog servers run inside the sandbox behind one gateway, each at a URL an
    MCP client connects to with the answer's ``headers``."""

    def _path(self) -> str:
        return sandbox_path(self._sbx.id, "/mcp")

    def start(self, servers: Sequence[Mapping[str, Any]], *, port: Optional[int] = None,
              replace: bool = False, public: bool = False) -> Dict[str, Any]:
        """Starts the gateway with ``servers`` (``[{"id": "filesystem"}, {"id": "github",
        "secrets": {"GITHUB_PERSONAL_ACCESS_TOKEN": "GITHUB_TOKEN"}}]``, 1 to 8) on ``port`` of
        the sandbox's loopback (8811). Answers ``{running, port, public, servers: [{id, status,
        url, transport, error, restarts}], headers}`` once each server runs or failed; one still
        starting reads ``installing``. Servers running already are a ``ConflictError`` unless
        ``replace=True``, which keeps those that stay (their sessions too) and starts and ends
        the others. ``public=True`` (URLs guarded by the header alone) is not offered by
        this daemon: it answers ``501 not_implemented``."""
        body: Dict[str, Any] = {"servers": [dict(s) for s in servers]}
        if port is not None:
            body["port"] = port
        if replace:
            body["replace"] = True
        if public:
            body["public"] = True
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "POST", SandboxMcpOps._path(self),
                                         json_body=body, timeout=START_TIMEOUT_SECONDS)
        return out

    def get(self) -> Dict[str, Any]:
        """The servers' state, and fresh URLs and ``headers`` (a new preview token each time);
        ``{"running": False, "servers": [], ...}`` when none was started."""
        out: Dict[str, Any] = yield Call(self._sbx._http.request, "GET", SandboxMcpOps._path(self))
        return out

    def ready(self, *, timeout: float = 600, interval: float = 2) -> Dict[str, Any]:
        """Reads the state every ``interval`` seconds until no server is ``installing``, or for
        ``timeout`` seconds; answers the last state read (check each server's ``status``)."""
        deadline = time.monotonic() + timeout
        while True:
            state = yield from SandboxMcpOps.get(self)
            if not state.get("running") or all(s.get("status") != "installing" for s in state.get("servers", [])):
                return state
            if time.monotonic() >= deadline:
                return state
            yield Call(self._sleep, interval)

    def stop(self) -> bool:
        """Ends the gateway and every server; False when none ran."""
        out = yield Call(self._sbx._http.request, "DELETE", SandboxMcpOps._path(self),
                         timeout=START_TIMEOUT_SECONDS)
        return bool(out["stopped"])
