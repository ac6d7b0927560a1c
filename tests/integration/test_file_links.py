"""Signed file links (docs/api.md, "File links"): POST .../files:link makes a URL that downloads or
uploads one path of one sandbox with no API key, until it expires; a one-time link serves once,
even to two clients at once; a link changed anywhere (its path by one byte, its signature, an
argument added, another sandbox's id, another method) is refused, as is every link made before
a revoke_links; a link to a deleted sandbox says so, while a forged one cannot tell a deleted or
missing sandbox from a live one. Driven over plain HTTP, through the published client's own
calls (download_url, upload_url, revoke_links, its E2B drop-in's download_url) and through our
SDK's calls of the same names; and through the other host of a fleet."""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import sys
import tarfile
import threading
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import pytest

from conftest import _finish_daemon, _start_daemon
from helpers import Api, assert_error, error_of, wait_until
from test_fleet_forward import _on_a, pair  # noqa: F401  (the fleet's two hosts, a fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))


def link(api: Api, sid: str, path: str, **fields) -> dict:
    r = api.post(f"/v1/sandboxes/{sid}/files:link", json={"path": path, **fields})
    assert r.status_code == 201, r.text
    return r.json()


def with_args(url: str, change) -> str:
    """The URL with its query arguments passed through change (a list of pairs in, one out)."""
    u = urlsplit(url)
    return urlunsplit(u._replace(query=urlencode(change(parse_qsl(u.query, keep_blank_values=True)))))


def set_arg(url: str, name: str, value: str) -> str:
    return with_args(url, lambda q: [(k, value if k == name else v) for k, v in q])


def no_key() -> httpx.Client:
    """A client with no key at all: what someone handed the URL has."""
    return httpx.Client(timeout=60)


def refused_as_invalid(r: httpx.Response) -> dict:
    assert_error(r, 403, "forbidden")
    return error_of(r)


def test_download_and_upload_with_no_key(api, driver):
    sbx = api.create_sandbox(driver=driver)
    blob = os.urandom(300_000)
    sbx.write("/workspace/out/data.bin", blob)
    sbx.run("mkdir -p /workspace/tree/sub && echo one > /workspace/tree/a.txt && echo two > /workspace/tree/sub/b.txt")
    down = link(api, sbx.id, "/workspace/out/data.bin", filename="data.bin")
    assert down["method"] == "GET" and down["path"] == "/workspace/out/data.bin" and down["id"].startswith("lnk_")
    assert down["expiresInSeconds"] == 3600 and down["oneTime"] is False and down["url"].startswith(api.daemon.base_url)
    up = link(api, sbx.id, "uploaded/new.txt", method="upload", expiresInSeconds=120)
    assert up["method"] == "PUT" and up["path"] == "/workspace/uploaded/new.txt" and up["maxBytes"] > 0
    tree = link(api, sbx.id, "/workspace/tree", archive=True)
    with no_key() as c:
        r = c.get(down["url"])
        assert r.status_code == 200, r.text
        assert hashlib.sha256(r.content).hexdigest() == hashlib.sha256(blob).hexdigest()
        assert r.headers["content-disposition"] == 'attachment; filename="data.bin"'
        # Used again (not one-time): it serves again.
        assert c.get(down["url"]).content == blob
        r = c.put(up["url"], content=b"written through a link\n")
        assert r.status_code == 200, r.text
        assert r.json() == {"path": "/workspace/uploaded/new.txt", "size": 23}
        r = c.get(tree["url"])
        assert r.status_code == 200 and r.headers["content-type"] == "application/gzip", r.text
        names = tarfile.open(fileobj=io.BytesIO(gzip.decompress(r.content))).getnames()
        assert {"./a.txt", "./sub/b.txt"} <= set(names), names
        # The file routes still want a key without a signature.
        assert_error(c.get(f"{api.daemon.base_url}/v1/sandboxes/{sbx.id}/files/content",
                           params={"path": "/workspace/out/data.bin"}), 401, "unauthorized")
    assert sbx.read("/workspace/uploaded/new.txt") == b"written through a link\n"
    # The owner of what a link wrote is the sandbox's own user, as for a write with a key.
    assert sbx.run("stat -c %U /workspace/uploaded/new.txt").strip() == "sandbox"


def test_bounds_of_a_link(api, driver):
    sbx = api.create_sandbox(driver=driver)
    # An upload's bound: past it, 413, and the file is not written.
    up = link(api, sbx.id, "/workspace/small.bin", method="PUT", maxBytes=1000)
    assert up["maxBytes"] == 1000
    with no_key() as c:
        r = c.put(up["url"], content=os.urandom(5000))
        assert_error(r, 413, "payload_too_large")
        assert "maxBytes" in error_of(r)["message"]
        assert c.put(up["url"], content=b"x" * 1000).status_code == 200
    assert sbx.read("/workspace/small.bin") == b"x" * 1000
    # What a link may be: bounds said, and fields that do not fit its method refused.
    for fields, field in (({"expiresInSeconds": 0}, "expiresInSeconds"),
                          ({"expiresInSeconds": 7 * 86400 + 1}, "expiresInSeconds"),
                          ({"method": "DELETE"}, "method"), ({"method": "PUT", "filename": "x"}, "filename"),
                          ({"method": "PUT", "archive": True}, "archive"), ({"maxBytes": 10}, "maxBytes"),
                          ({"filename": 'a"b'}, "filename"), ({"user": "root"}, "user"),
                          ({"method": "PUT", "maxBytes": 10 ** 15}, "maxBytes")):
        r = api.post(f"/v1/sandboxes/{sbx.id}/files:link", json={"path": "/workspace/x", **fields})
        assert_error(r, 400, "invalid_request")
        assert field in error_of(r)["message"], (fields, r.text)
    assert link(api, sbx.id, "/workspace/x", expiresInSeconds=7 * 86400)["expiresInSeconds"] == 7 * 86400


def test_expired_link(api, driver):
    sbx = api.create_sandbox(driver=driver)
    sbx.write("/workspace/f.txt", b"soon gone")
    short = link(api, sbx.id, "/workspace/f.txt", expiresInSeconds=1)
    with no_key() as c:
        assert c.get(short["url"]).content == b"soon gone"
        time.sleep(2.2)
        r = c.get(short["url"])
        assert_error(r, 410, "link_expired")
        # Its expiry moved on is a changed link, not a longer one.
        later = set_arg(short["url"], "expires", str(int(time.time()) + 3600))
        refused_as_invalid(c.get(later))


def test_one_time_link_serves_once_even_at_once(api, driver):
    sbx = api.create_sandbox(driver=driver)
    sbx.write("/workspace/once.txt", b"only once")
    once = link(api, sbx.id, "/workspace/once.txt", oneTime=True)
    assert once["oneTime"] is True
    with no_key() as c:
        assert c.get(once["url"]).content == b"only once"
        assert_error(c.get(once["url"]), 410, "link_used")
    # Two clients at once, many times over: exactly one of each pair is served.
    for _ in range(5):
        pair = link(api, sbx.id, "/workspace/once.txt", oneTime=True)
        start = threading.Barrier(2)
        got: list[httpx.Response] = []

        def use():
            with no_key() as c:
                start.wait()
                got.append(c.get(pair["url"]))

        threads = [threading.Thread(target=use) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = sorted(r.status_code for r in got)
        assert statuses == [200, 410], [r.text for r in got]
        assert [r.content for r in got if r.status_code == 200] == [b"only once"]
    # A one-time upload writes once.
    up = link(api, sbx.id, "/workspace/up-once.txt", method="PUT", oneTime=True)
    with no_key() as c:
        assert c.put(up["url"], content=b"first").status_code == 200
        assert_error(c.put(up["url"], content=b"second"), 410, "link_used")
    assert sbx.read("/workspace/up-once.txt") == b"first"


def test_changed_links_are_refused_alike(api, driver):
    sbx = api.create_sandbox(driver=driver)
    sbx.write("/workspace/report.csv", b"a,b\n")
    sbx.write("/workspace/report.csw", b"the neighbour\n")
    down = link(api, sbx.id, "/workspace/report.csv")
    up = link(api, sbx.id, "/workspace/report.csv", method="PUT")
    sig = dict(parse_qsl(urlsplit(down["url"]).query))["sig"]
    changed = {
        "path by one byte": set_arg(down["url"], "path", "/workspace/report.csw"),
        "path's last byte cut": set_arg(down["url"], "path", "/workspace/report.cs"),
        "signature": set_arg(down["url"], "sig", ("0" if sig[0] != "0" else "1") + sig[1:]),
        "signature cut": set_arg(down["url"], "sig", sig[:-2]),
        "id": set_arg(down["url"], "id", "lnk_0000000000000000"),
        "an argument added": with_args(down["url"], lambda q: q + [("user", "root")]),
        "an argument twice": with_args(down["url"], lambda q: q + [("path", "/workspace/report.csw")]),
        "made one-time": with_args(down["url"], lambda q: q + [("once", "1")]),
        "no signature": with_args(down["url"], lambda q: [(k, v) for k, v in q if k != "sig"] + [("sig", "")]),
        "the archive route": down["url"].replace("/files/content?", "/files/archive?"),
    }
    with no_key() as c:
        answers = {what: refused_as_invalid(c.get(url)) for what, url in changed.items()}
        # A download link used to upload, an upload link to download.
        answers["PUT with a download link"] = refused_as_invalid(c.put(down["url"], content=b"overwritten"))
        answers["GET with an upload link"] = refused_as_invalid(c.get(up["url"]))
        # One answer for all: nothing says which part was wrong.
        assert len({(a["code"], a["message"]) for a in answers.values()}) == 1, answers
    assert sbx.read("/workspace/report.csv") == b"a,b\n"
    assert sbx.read("/workspace/report.csw") == b"the neighbour\n"


def test_revoke_ends_earlier_links(api, driver):
    sbx = api.create_sandbox(driver=driver)
    sbx.write("/workspace/r.txt", b"before")
    before = [link(api, sbx.id, "/workspace/r.txt"), link(api, sbx.id, "/workspace/r.txt", method="PUT")]
    r = api.post(f"/v1/sandboxes/{sbx.id}/files:revoke-links")
    assert r.status_code == 200 and r.json()["revoked"] is True, r.text
    after = link(api, sbx.id, "/workspace/r.txt")
    with no_key() as c:
        refused_as_invalid(c.get(before[0]["url"]))
        refused_as_invalid(c.put(before[1]["url"], content=b"late"))
        assert c.get(after["url"]).content == b"before"
    # A link is its sandbox owner's, not the key's that made it: revoking that key ends no link.
    made = api.post("/v1/keys", json={"name": "links-maker"}).json()
    with Api(api.daemon, key=made["key"]) as maker:
        kept = link(maker, sbx.id, "/workspace/r.txt")
    assert api.delete(f"/v1/keys/{made['id']}").status_code in (200, 204)
    with no_key() as c:
        assert c.get(kept["url"]).content == b"before"
    # Revoking is the owner's: a read key may not, another owner's key finds no sandbox.
    rk = api.post("/v1/keys", json={"name": "links-read", "access": "read"}).json()["key"]
    with Api(api.daemon, key=rk) as reader:
        assert_error(reader.post(f"/v1/sandboxes/{sbx.id}/files:revoke-links"), 403, "forbidden")
        assert_error(reader.post(f"/v1/sandboxes/{sbx.id}/files:link", json={"path": "/workspace/r.txt"}), 403,
                     "forbidden")


def test_links_of_another_sandbox_and_of_a_deleted_one(api, driver):
    a = api.create_sandbox(driver=driver)
    b = api.create_sandbox(driver=driver)
    a.write("/workspace/f.txt", b"of a")
    b.write("/workspace/f.txt", b"of b")
    down = link(api, a.id, "/workspace/f.txt")
    up = link(api, a.id, "/workspace/f.txt", method="PUT")
    # B never made a link, and has a secret of its own once it does: A's links fail on B either way.
    other_owner_key = api.post("/v1/keys", json={"name": "links-other", "owner": "links-other-owner"}).json()["key"]
    with no_key() as c:
        refused_as_invalid(c.get(down["url"].replace(a.id, b.id)))
        link(api, b.id, "/workspace/other.txt")
        refused_as_invalid(c.get(down["url"].replace(a.id, b.id)))
        refused_as_invalid(c.put(up["url"].replace(a.id, b.id), content=b"into b"))
        forged_missing = refused_as_invalid(c.get(down["url"].replace(a.id, "sbx_" + "0" * 20)))
    assert b.read("/workspace/f.txt") == b"of b"
    # Another owner's key cannot make a link to A: not found, as for every route.
    with Api(api.daemon, key=other_owner_key) as other:
        assert_error(other.post(f"/v1/sandboxes/{a.id}/files:link", json={"path": "/workspace/f.txt"}), 404,
                     "not_found")
        other.delete_all()
    # Deleted: its links say so (the holder of a good link learns nothing new); a forged link to it
    # is refused as one to a sandbox that never was.
    assert api.delete(f"/v1/sandboxes/{a.id}").status_code in (200, 204)
    with no_key() as c:
        assert_error(c.get(down["url"]), 404, "not_found")
        assert_error(c.put(up["url"], content=b"x"), 404, "not_found")
        forged_deleted = refused_as_invalid(c.get(set_arg(down["url"], "path", "/workspace/g.txt")))
    assert forged_deleted == {**forged_missing, "requestId": forged_deleted["requestId"]}
    assert_error(api.post(f"/v1/sandboxes/{a.id}/files:link", json={"path": "/workspace/f.txt"}), 404, "not_found")
    assert_error(api.post(f"/v1/sandboxes/{a.id}/files:revoke-links"), 404, "not_found")


def test_the_published_clients_calls(pub, api, driver):
    sbx = api.create_sandbox(driver=driver)
    sbx.write("/workspace/pub.txt", b"for the published client")
    got = pub("""
import json, sys, urllib.request, urllib.error
from withruntime import Sandbox
from withruntime.e2b import Sandbox as E2B
sbx = Sandbox.connect(sys.argv[1])
def fetch(url, data=None, method=None):
    req = urllib.request.Request(url, data=data, method=method)  # no key: none is sent
    try:
        with urllib.request.urlopen(req) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, json.loads(e.read())["error"]["code"]]
down = sbx.files.download_url("/workspace/pub.txt", expires_in_seconds=600, filename="pub.txt")
up = sbx.files.upload_url("/workspace/from-pub.txt", expires_in_seconds=600, max_bytes=100)
out = {"down": down, "get": fetch(down["url"]), "put": fetch(up["url"], b"uploaded by link", "PUT")}
out["read"] = sbx.files.read("/workspace/from-pub.txt").decode()
e2b = E2B.connect(sys.argv[1])
out["e2b"] = fetch(e2b.download_url("/workspace/pub.txt"))
out["revoke"] = sbx.files.revoke_links()
out["after"] = [fetch(down["url"]), fetch(up["url"], b"again", "PUT")]
print(json.dumps(out))
""", sbx.id)
    assert got["down"]["expiresInSeconds"] == 600 and got["down"]["method"] == "GET", got
    assert got["get"] == [200, "for the published client"]
    assert got["put"][0] == 200, got
    assert got["read"] == "uploaded by link"
    assert got["e2b"] == [200, "for the published client"]
    assert got["revoke"]["revoked"] is True
    assert got["after"] == [[403, "forbidden"], [403, "forbidden"]]


def test_our_sdk_calls(api, driver, daemon, monkeypatch):
    from withruntime import Sandbox

    for k, v in daemon.env().items():
        monkeypatch.setenv(k, v)
    sbx = api.create_sandbox(driver=driver)
    with Sandbox.connect(sbx.id) as s:
        s.files.write("/workspace/sdk.txt", "from our SDK")
        down = s.files.download_url("/workspace/sdk.txt", one_time=True, expires_in_seconds=60)
        up = s.files.upload_url("/workspace/sdk-up.txt", max_bytes=64)
        with no_key() as c:
            assert c.get(down["url"]).text == "from our SDK"
            assert_error(c.get(down["url"]), 410, "link_used")
            assert c.put(up["url"], content=b"up").status_code == 200
        assert s.files.read_text("/workspace/sdk-up.txt") == "up"
        assert s.files.revoke_links()["revoked"] is True
    with no_key() as c:
        refused_as_invalid(c.put(up["url"], content=b"late"))


def test_links_through_the_other_host(pair):  # noqa: F811
    """A link made on one host and opened on the other, which does not run the sandbox: it is
    forwarded like every route of a sandbox, and a one-time link is spent once, by its owner
    host, whichever host was asked."""
    a, b = pair
    with Api(a) as on_a, Api(b, key=a.api_key) as via_b:
        sbx = _on_a(pair, on_a, driver="namespace", timeoutSeconds=300)
        on_a.put_file(sbx.id, "/workspace/f.txt", b"on host a")
        made_on_b = link(via_b, sbx.id, "/workspace/f.txt", oneTime=True)
        assert made_on_b["url"].startswith(b.base_url), made_on_b["url"]
        up = link(on_a, sbx.id, "/workspace/g.txt", method="PUT")
        with no_key() as c:
            r = c.get(made_on_b["url"])
            assert r.status_code == 200 and r.content == b"on host a", r.text
            assert_error(c.get(made_on_b["url"].replace(b.base_url, a.base_url)), 410, "link_used")
            r = c.put(up["url"].replace(a.base_url, b.base_url), content=b"via b")
            assert r.status_code == 200, r.text
            refused_as_invalid(c.get(set_arg(made_on_b["url"], "path", "/workspace/g.txt")))
        assert on_a.get_file(sbx.id, "/workspace/g.txt").content == b"via b"
        # Revoked on one host, refused on both.
        assert via_b.post(f"/v1/sandboxes/{sbx.id}/files:revoke-links").status_code == 200
        with no_key() as c:
            refused_as_invalid(c.put(up["url"], content=b"late"))
            refused_as_invalid(c.put(up["url"].replace(a.base_url, b.base_url), content=b"late"))


def test_a_paused_sandbox_is_woken_unless_the_link_says_not(api, driver):
    sbx = api.create_sandbox(driver=driver)
    sbx.write("/workspace/w.txt", b"awake")
    sleepy = link(api, sbx.id, "/workspace/w.txt", wake=False)
    waking = link(api, sbx.id, "/workspace/w.txt")
    assert (sleepy["wake"], waking["wake"]) == (False, True)
    r = api.post(f"/v1/sandboxes/{sbx.id}:pause")
    assert r.status_code == 200, r.text
    api.wait_state(sbx.id, "paused")
    with no_key() as c:
        assert_error(c.get(sleepy["url"]), 409, "conflict")
        assert api.sandbox(sbx.id)["state"] == "paused"
        r = c.get(waking["url"])
        assert r.status_code == 200 and r.content == b"awake", r.text
    assert api.sandbox(sbx.id)["state"] == "running"


@pytest.fixture(scope="module")
def bounded(build_dir, image_dir, tmp_path_factory):
    """A daemon whose owners may have 2 requests in progress."""
    d = _start_daemon(build_dir, image_dir, tmp_path_factory.mktemp("links-bounded") / "state",
                      f"runtime-test-{os.getpid()}-links", extra_args=["--max-requests-per-owner", "2"])
    yield d
    _finish_daemon(d)


def test_a_links_requests_count_against_its_owners_bound(bounded):
    with Api(bounded) as api:
        sbx = api.create_sandbox(timeoutSeconds=300)
        # More than the kernel's socket buffers hold: a download the client does not read stays in
        # progress.
        sbx.exec("head -c 100000000 /dev/zero > /workspace/big")
        big = link(api, sbx.id, "/workspace/big")
        small = link(api, sbx.id, "/workspace/small.txt", method="PUT")
        held = [no_key() for _ in range(2)]
        streams, readers = [], []
        try:
            for c in held:
                s = c.stream("GET", big["url"])
                streams.append(s)
                r = s.__enter__()
                assert r.status_code == 200
                # Kept: a reader dropped would close its response.
                readers.append(r.iter_raw(65536))
                next(readers[-1])
            with no_key() as c:
                r = c.put(small["url"], content=b"one too many")
                assert_error(r, 429, "rate_limited")
                assert "max-requests-per-owner" in error_of(r)["message"]
            # The owner's own key shares the bound with its links.
            assert_error(api.get(f"/v1/sandboxes/{sbx.id}"), 429, "rate_limited")
        finally:
            for s in streams:
                s.__exit__(None, None, None)
            for c in held:
                c.close()
        with no_key() as c:
            wait_until(lambda: c.put(small["url"], content=b"in bounds").status_code == 200, 10,
                       what="the held downloads given back")
        assert sbx.read("/workspace/small.txt") == b"in bounds"
        api.delete_all()
