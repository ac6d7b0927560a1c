"""sbx.network.set(...), the egress log and Secrets, sync and async, against the stand-in daemon."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from fakedaemon import FakeDaemon, api_error
from withruntime import AsyncNetwork, AsyncSandbox, AsyncSecrets, Network, Sandbox, Secrets
from withruntime.errors import InvalidRequestError, NotFoundError


def _network_echo(fake: FakeDaemon):
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={**fake.sandbox, "network": json.loads(req.content)})
    fake.on("PUT", "/v1/sandboxes/sbx_1/network", handler)


def test_network_is_still_a_dict(fake) -> None:
    fake.sandbox["network"] = {"internet": True, "allow": ["pypi.org"]}
    with Sandbox.create(_transport=fake.transport()) as sbx:
        assert isinstance(sbx.network, Network) and isinstance(sbx.network, dict)
        assert sbx.network["internet"] is True and sbx.network == {"internet": True, "allow": ["pypi.org"]}


def test_network_set_puts_the_policy(fake) -> None:
    _network_echo(fake)
    with Sandbox.create(_transport=fake.transport()) as sbx:
        new = sbx.network.set(internet=True, allow=["pypi.org", "*.pythonhosted.org"], deny=["evil.pypi.org"])
        req = fake.requests[-1]
        assert (req.method, req.url.path) == ("PUT", "/v1/sandboxes/sbx_1/network")
        assert json.loads(req.content) == {"internet": True, "allow": ["pypi.org", "*.pythonhosted.org"],
                                           "deny": ["evil.pypi.org"]}
        assert new["allow"] == ["pypi.org", "*.pythonhosted.org"] and sbx.network == new
        sbx.network.set(internet=False)
        assert json.loads(fake.requests[-1].content) == {"internet": False}
        sbx.network.set(allow=("api.example.com:8443",))
        assert json.loads(fake.requests[-1].content) == {"internet": True, "allow": ["api.example.com:8443"]}
        # the old spelling still works
        sbx.set_network({"internet": True})
        assert json.loads(fake.requests[-1].content) == {"internet": True}


@pytest.mark.parametrize("kw", [{}, {"internet": "yes"}, {"internet": False, "allow": ["a.org"]},
                                {"internet": True, "allow": "pypi.org"}, {"internet": True, "allow": [1]},
                                {"internet": True, "deny": [""]}, {"internet": True, "allow": ["a"] * 257}])
def test_network_set_refuses_bad_arguments_locally(fake, kw) -> None:
    with Sandbox.create(_transport=fake.transport()) as sbx:
        before = len(fake.requests)
        with pytest.raises(InvalidRequestError):
            sbx.network.set(**kw)
        assert len(fake.requests) == before


def test_network_set_passes_daemon_errors(fake) -> None:
    fake.on("PUT", "/v1/sandboxes/sbx_1/network",
            lambda req: api_error(400, "invalid_request", "allow: bad pattern"))
    with Sandbox.create(_transport=fake.transport()) as sbx:
        with pytest.raises(InvalidRequestError, match="bad pattern"):
            sbx.network.set(internet=True, allow=["x..y"])


def test_egress_log(fake) -> None:
    entries = [{"at": "2026-11-30T10:00:00Z", "host": "pypi.org", "port": 443, "kind": "connect",
                "allowed": True, "reason": "allowed", "address": "1.2.3.4", "bytesOut": 1, "bytesIn": 2,
                "intercepted": False, "secretsUsed": 0}]
    fake.on("GET", "/v1/sandboxes/sbx_1/egress", {"sandboxId": "sbx_1", "entries": entries})
    fake.routes[("GET", "/v1/sandboxes/sbx_1/egress")] = \
        lambda req: httpx.Response(200, json={"sandboxId": "sbx_1", "entries": entries})
    with Sandbox.create(_transport=fake.transport()) as sbx:
        assert sbx.egress_log(limit=5) == entries
        assert fake.requests[-1].url.params["limit"] == "5"
        with pytest.raises(InvalidRequestError):
            sbx.egress_log(limit=0)


def test_secrets(fake) -> None:
    stored = {}

    def put(req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content)
        stored.update(body)
        return httpx.Response(200, json={"name": "API_TOKEN", "hosts": body["hosts"],
                                         "placeholder": "runtime-secret-API_TOKEN-00"})
    fake.on("PUT", "/v1/egress-secrets/API_TOKEN", put)
    fake.on("GET", "/v1/egress-secrets", lambda req: httpx.Response(200, json={"secrets": [
        {"name": "API_TOKEN", "hosts": ["api.test"], "placeholder": "runtime-secret-API_TOKEN-00"}]}))
    fake.on("DELETE", "/v1/egress-secrets/API_TOKEN",
            lambda req: httpx.Response(200, json={"name": "API_TOKEN", "deleted": True}))
    with Secrets(_transport=fake.transport()) as secrets:
        got = secrets.set("API_TOKEN", "v4lue", ["api.test"])
        assert stored == {"value": "v4lue", "hosts": ["api.test"]}
        assert got["placeholder"].startswith("runtime-secret-") and "v4lue" not in json.dumps(got)
        assert [s["name"] for s in secrets.list()] == ["API_TOKEN"]
        secrets.delete("API_TOKEN")
        with pytest.raises(NotFoundError):
            secrets.get("OTHER")
        n = len(fake.requests)
        for name, value, hosts in (("1BAD", "v", ["a"]), ("A/B", "v", ["a"]), ("OK", "a\r\nX: y", ["a"]),
                                   ("OK", "", ["a"]), ("OK", "v", []), ("OK", "v", "api.test"),
                                   ("OK", "x" * 9000, ["a"])):
            with pytest.raises(InvalidRequestError):
                secrets.set(name, value, hosts)
        assert len(fake.requests) == n


def test_async_network_and_secrets(fake) -> None:
    _network_echo(fake)
    fake.on("GET", "/v1/egress-secrets", lambda req: httpx.Response(200, json={"secrets": []}))

    async def body() -> None:
        async with AsyncSandbox.create(_transport=httpx.MockTransport(fake)) as sbx:
            assert isinstance(sbx.network, AsyncNetwork)
            new = await sbx.network.set(allow=["pypi.org"])
            assert json.loads(fake.requests[-1].content) == {"internet": True, "allow": ["pypi.org"]}
            assert new == {"internet": True, "allow": ["pypi.org"]}
            with pytest.raises(InvalidRequestError):
                await sbx.network.set()
        async with AsyncSecrets(_transport=httpx.MockTransport(fake)) as secrets:
            assert await secrets.list() == []

    asyncio.run(body())


def test_same_names_sync_and_async() -> None:
    def names(cls: type) -> set:
        return {n for n in dir(cls) if not n.startswith("_")}
    assert names(Secrets) == names(AsyncSecrets)
    assert names(Network) == names(AsyncNetwork)


def test_secret_header_rules_rotate_and_pages(fake) -> None:
    pages = {None: {"secrets": [{"name": "A"}], "next": "A"}, "A": {"secrets": [{"name": "B"}], "next": None}}
    fake.on("GET", "/v1/egress-secrets", lambda req: httpx.Response(200, json=pages[req.url.params.get("after")]))
    fake.on("PUT", "/v1/egress-secrets/GH", lambda req: httpx.Response(200, json={"name": "GH"}))
    fake.on("POST", "/v1/egress-secrets/GH:rotate", lambda req: httpx.Response(200, json={"name": "GH"}))
    with Secrets(_transport=fake.transport()) as secrets:
        assert [s["name"] for s in secrets.list()] == ["A", "B"]
        assert [s["name"] for s in secrets.list(limit=1)] == ["A"]
        secrets.set("GH", value="v", hosts=["api.github.com"], header="Authorization", format="Bearer {value}",
                    rules=[{"methods": ["GET"], "paths": ["/repos/*"]}], idempotency_key="k1")
        req = fake.requests[-1]
        assert json.loads(req.content) == {"value": "v", "hosts": ["api.github.com"], "header": "Authorization",
                                           "format": "Bearer {value}",
                                           "rules": [{"methods": ["GET"], "paths": ["/repos/*"]}]}
        assert req.headers["Idempotency-Key"] == "k1"
        secrets.rotate("GH", "v2")
        assert json.loads(fake.requests[-1].content) == {"value": "v2"}
        n = len(fake.requests)
        for kw in ({"header": "Bad Header"}, {"format": "Bearer"}, {"header": "A", "format": "{value}{value}"},
                   {"format": "{value}"}, {"rules": []}, {"rules": [{"methods": ["GET"]}]}):
            with pytest.raises(InvalidRequestError):
                secrets.set("GH", value="v", hosts=["a.org"], **kw)
        for bad in ("a\tb", "caf\u00e9", ""):
            with pytest.raises(InvalidRequestError):
                secrets.rotate("GH", bad)
        with pytest.raises(InvalidRequestError):
            secrets.list(limit=0)
        assert len(fake.requests) == n


def test_network_get_off_on(fake) -> None:
    state = {"internet": True, "allow": ["pypi.org"], "deny": []}

    def put(req: httpx.Request) -> httpx.Response:
        state.clear()
        state.update({"allow": [], "deny": [], **json.loads(req.content)})
        return httpx.Response(200, json={**fake.sandbox, "network": dict(state)})
    fake.on("PUT", "/v1/sandboxes/sbx_1/network", put)
    fake.on("GET", "/v1/sandboxes/sbx_1/network", lambda req: httpx.Response(200, json=dict(state)))
    with Sandbox.create(_transport=fake.transport()) as sbx:
        assert sbx.network.get() == {"internet": True, "allow": ["pypi.org"], "deny": []}
        assert sbx.network.off()["internet"] is False
        assert json.loads(fake.requests[-1].content) == {"internet": False}
        assert sbx.network.on() == {"internet": True, "allow": [], "deny": []}


def test_metrics(fake) -> None:
    body = {"sandboxId": "sbx_1", "range": "6h", "stepSeconds": 72, "points": [], "latest": None}
    fake.routes[("GET", "/v1/sandboxes/sbx_1/metrics")] = lambda req: httpx.Response(200, json=body)
    with Sandbox.create(_transport=fake.transport()) as sbx:
        assert sbx.metrics(range="6h") == body
        assert fake.requests[-1].url.params["range"] == "6h"
        sbx.metrics()
        assert "range" not in fake.requests[-1].url.params
        n = len(fake.requests)
        with pytest.raises(InvalidRequestError):
            sbx.metrics(range="2h")
        assert len(fake.requests) == n
