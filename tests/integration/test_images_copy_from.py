"""COPY --from=IMAGE (docs/images.md, "Multi-stage builds"): a Dockerfile copies files out of an
image built here (by name, name:tag or id) or a built-in one, resolved for the build's owner: another
owner's image is a 404 as the resolve route answers. The image's id is in the build's cache key, so a
rebuilt source image runs the copy again and an unchanged one is a cache hit; the path rules are a
stage's (a symbolic link is copied as a link, not followed)."""
from __future__ import annotations

import uuid

import pytest

from helpers import Api, wait_until


def _name(prefix: str = "cpf") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _wait(api: Api, image_id: str, timeout: float = 300) -> dict:
    def done():
        j = api.get(f"/v1/images/{image_id}").json()
        return j if j["state"] not in ("queued", "building") else None
    return wait_until(done, timeout, 0.3, what=f"image {image_id} built")


def _build(api: Api, dockerfile: str, name: str | None = None, **body) -> dict:
    r = api.post("/v1/images", json={"name": name or _name(), "dockerfile": dockerfile, **body})
    assert r.status_code == 201, r.text
    return _wait(api, r.json()["id"])


def _log(api: Api, image_id: str) -> str:
    return "\n".join(l["line"] for l in api.get(f"/v1/images/{image_id}/logs").json()["lines"])


@pytest.fixture
def capi(api):
    made = []
    yield api, made
    for image_id in reversed(made):
        api.post(f"/v1/images/{image_id}:delete", json={})


def test_copy_from_an_image_cached_by_its_id_and_refused_to_another_owner(capi):
    api, made = capi
    src = _name("src")
    one = _build(api, "FROM default\nRUN mkdir -p /opt/d && echo one > /opt/d/data.txt && "
                 "ln -s data.txt /opt/d/link && ln -s /etc/hostname /opt/out-link\n", name=src)
    assert one["state"] == "ready", _log(api, one["id"])
    made.append(one["id"])
    dockerfile = (f"FROM default\nCOPY --from={src} /opt/d/data.txt /got/data.txt\n"
                  f"COPY --from={src}:latest /opt/d/data.txt /got/latest.txt\n"
                  f"COPY --from={one['id']} /opt/d /got/d\n"
                  "COPY --from=default /etc/debian_version /got/dv\nRUN cat /got/data.txt\n")
    consumer = _build(api, dockerfile)
    assert consumer["state"] == "ready", _log(api, consumer["id"])
    made.append(consumer["id"])
    sbx = api.create_sandbox(image=consumer["id"])
    out = api.exec(sbx.id, command="cat /got/data.txt /got/latest.txt /got/d/data.txt; readlink /got/d/link; "
                   "test -s /got/dv && echo dv")
    assert out["stdout"].split() == ["one", "one", "one", "data.txt", "dv"], out
    api.delete(f"/v1/sandboxes/{sbx.id}")
    # Unchanged: a cache hit.
    again = _build(api, dockerfile)
    made.append(again["id"])
    assert again["state"] == "ready" and "using the cache" in _log(api, again["id"]), _log(api, again["id"])
    # The source image rebuilt (a new id behind its name): the copy runs again, with its new files.
    two = _build(api, "FROM default\nRUN mkdir -p /opt/d && echo two > /opt/d/data.txt && "
                 "ln -s data.txt /opt/d/link && ln -s /etc/hostname /opt/out-link\n", name=src)
    assert two["state"] == "ready", _log(api, two["id"])
    made.append(two["id"])
    third = _build(api, dockerfile.replace(one["id"], two["id"]))
    made.append(third["id"])
    assert third["state"] == "ready" and "using the cache" not in _log(api, third["id"]), _log(api, third["id"])
    sbx = api.create_sandbox(image=third["id"])
    assert api.exec(sbx.id, command="cat /got/data.txt")["stdout"].strip() == "two"
    api.delete(f"/v1/sandboxes/{sbx.id}")
    # Another owner: neither the name nor the id reaches the image.
    r = api.post("/v1/keys", json={"name": "other-owner", "owner": f"other-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201, r.text
    other = Api(api.daemon, key=r.json()["key"])
    try:
        for ref in (src, f"{src}:latest", two["id"]):
            r = other.post("/v1/images", json={"name": _name(), "dockerfile":
                                               f"FROM default\nCOPY --from={ref} /opt/d/data.txt /x\n"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "image_not_found", r.text
            assert "line 2" in r.json()["error"]["message"], r.text
    finally:
        other.close()


def test_copy_from_a_missing_source_or_a_later_stage(capi):
    api, made = capi
    r = api.post("/v1/images", json={"name": _name(), "dockerfile":
                                     "FROM default\nCOPY --from=later /a /b\nFROM default AS later\n"})
    assert r.status_code == 400 and "later stage" in r.json()["error"]["message"], r.text
    image = _build(api, "FROM default\nCOPY --from=default /no/such/file /x\n")
    made.append(image["id"])
    assert image["state"] == "failed" and "not in the image" in image["error"], image
    # A link that leads out of what is copied is refused, as from a stage.
    src = _build(api, "FROM default\nRUN ln -s /etc/shadow /opt/out-link\n")
    made.append(src["id"])
    image = _build(api, f"FROM default\nCOPY --from={src['id']} /opt/out-link /x\n")
    made.append(image["id"])
    assert image["state"] == "failed" and "could not be unpacked" in image["error"], image
    image = _build(api, f"FROM default\nCOPY --from={src['id']} /../etc/passwd /x\n")
    made.append(image["id"])
    assert image["state"] == "failed" and "leaves the stage's root" in image["error"], image
