"""A sandbox on the microVM from an image built here (docs/images.md, "On the microVM"). The
published client builds a small image FROM default (a COPY, an ENV, a WORKDIR, a RUN that writes
a file of the sandbox user's with its mode and a second name, deletes a file of the base, so a
whiteout, and replaces a directory of the base, so an opaque directory, and a CMD), then one FROM
that image whose RUN does the same to what the first one made (its disk a layer over the
first's); a microVM sandbox from it sees exactly what a namespace sandbox from it sees, its env,
and its start command run in the WORKDIR. The first microVM create makes the image's microVM
disk; another reuses it (by a log line, and by the file's inode and mtime) on a copy of its own;
deleting the image removes it; a tree too deep is refused before a boot; what a killed daemon
left of a disk it was making goes at the next start. Two boots under TCG by default: two first
creates at once, one making the disk and the other waiting for it (two more, a first and a later
create of another image, with RUNTIME_TEST_ALL=1)."""
from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from helpers import Api, wait_until

PARENT = """\
FROM default
ENV GREETING="from the image" MODE=mvm
WORKDIR /opt/app
COPY app.txt ./
RUN echo built > built.txt && chown sandbox:sandbox built.txt && chmod 640 built.txt && \\
    ln built.txt built.link && rm /etc/debian_version && mkdir dir && touch dir/old gone.txt && \\
    rm -rf /etc/apt/apt.conf.d && mkdir /etc/apt/apt.conf.d && echo mine > /etc/apt/apt.conf.d/only && \\
    ln -s /etc/shadow escape && truncate -s 64G sparse && cp /bin/true suid && \\
    chmod 4755 suid && python3 -c "import os; os.setxattr('built.txt', 'user.origin', b'build')"
CMD ["sh", "-c", "pwd > /tmp/started"]
"""
# FROM the parent: its build starts from the parent's disk, so the image's disk is a layer over
# the parent's (bases/0.img), and this step's whiteout and opaque directory are over that layer.
CHILD = """\
FROM {parent}
RUN rm gone.txt && rm -rf dir && mkdir dir && echo new > dir/new && echo child > child.txt
"""

BUILD = """
import json, sys
from withruntime import Runtime
runtime = Runtime()
image = runtime.images.build(dockerfile=open(sys.argv[1] + "/Dockerfile").read(), context_dir=sys.argv[1],
                             name=sys.argv[2])
print(json.dumps({"image": image}))
"""

# What the image's files and env are, read the same way on every driver.
LOOK = ("cat /opt/app/app.txt /opt/app/built.txt /opt/app/child.txt; stat -c '%U:%G %a %h' /opt/app/built.txt; "
        "cmp /opt/app/built.txt /opt/app/built.link && echo same; "
        "test -e /etc/debian_version && echo present || echo gone; ls /etc/apt/apt.conf.d; "
        "ls /opt/app/dir; test -e /opt/app/gone.txt && echo present || echo gone; "
        "echo \"$GREETING|$MODE\"; stat -c '%U %a' / /opt/app; test -s /etc/os-release && echo base; "
        "cd /opt/app && readlink escape && stat -c '%F %s %b %a %U' sparse && stat -c '%a %U' suid && "
        "python3 -c \"import os; print(os.getxattr('built.txt', 'user.origin').decode())\"")
EXPECTED = ["copied", "built", "child", "sandbox:sandbox 640 2", "same", "gone", "only", "new", "gone",
            "from the image|mvm", "root 755", "root 755", "base", "/etc/shadow", "regular file 68719476736 0 644 root", "4755 root", "build"]


def _build(published_client, daemon, ctx, dockerfile):
    (ctx / "Dockerfile").write_text(dockerfile)
    got = published_client.run_json(daemon, BUILD, args=[str(ctx), f"mvm-{uuid.uuid4().hex[:8]}"], timeout=600)
    img = got["image"]
    assert img["state"] == "ready", img
    return img


@pytest.fixture(scope="module")
def image(published_client, daemon, tmp_path_factory):
    ctx = tmp_path_factory.mktemp("mvm") / "ctx"
    ctx.mkdir()
    (ctx / "app.txt").write_text("copied\n")
    parent = _build(published_client, daemon, ctx, PARENT)
    return _build(published_client, daemon, ctx, CHILD.format(parent=parent["name"]))


def _started(api, sid):
    def read():
        r = api.exec(sid, command="cat /tmp/started 2>/dev/null")
        return r["stdout"].strip() or None
    return wait_until(read, 60, 0.5, what="the image's start command's output")


def _create(daemon, driver, image_id, out, tag):
    with Api(daemon) as c:
        t0 = time.monotonic()
        r = c.post("/v1/sandboxes", json={"driver": driver, "image": image_id})
        out[tag] = (r.status_code, r.json(), time.monotonic() - t0)


@pytest.mark.microvm_subset
@pytest.mark.parametrize("driver", ["microvm"], indirect=True)
def test_a_microvm_sandbox_from_a_built_image(image, api, daemon, driver):
    # The namespace driver's view is the reference: the same files, owners, modes and env.
    ns = api.create_sandbox(driver="namespace", image=image["id"])
    ref = api.exec(ns.id, command=LOOK)
    assert ref["exitCode"] == 0 and ref["stdout"].splitlines() == EXPECTED, ref

    disk = daemon.state_dir / "snapshots" / image["snapshotId"] / "upper.ext4"
    assert (disk.parent / "bases" / "0.img").exists(), "the image's disk is a layer over its parent's"
    assert not disk.exists(), "no microVM disk before the first microVM create"
    # Two first creates at once: one makes the disk, the other waits for it and copies it.
    got: dict = {}
    threads = [threading.Thread(target=_create, args=(daemon, driver, image["id"], got, k)) for k in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(got) == ["a", "b"], got
    for status, body, _ in got.values():
        assert status == 201 and body["state"] == "running" and body["driver"] == "microvm", body
        api.created.append(body["id"])
        assert body["start"]["command"][0] == "sh", body
    ids = [got[k][1]["id"] for k in "ab"]
    made = [line for line in daemon.log_path.read_text().splitlines()
            if "the image's microvm disk made from its layers" in line and any(i in line for i in ids)]
    assert len(made) == 1, made
    for sid in ids:
        out = api.exec(sid, command=LOOK)
        assert out["exitCode"] == 0 and out["stdout"].splitlines() == EXPECTED, out
        assert _started(api, sid) == "/opt/app"
    # Each boots on a copy of its own.
    assert api.exec(ids[0], command="echo mine > /opt/app/first.txt")["exitCode"] == 0
    out = api.exec(ids[1], command="test -e /opt/app/first.txt && echo leaked || echo own")
    assert out["stdout"].strip() == "own", out
    st = os.stat(disk)
    # The image's disk size, holding about what its layers hold.
    assert st.st_size == got["a"][1]["diskMiB"] << 20, st
    assert st.st_blocks * 512 <= image["sizeBytes"] + (8 << 20), (st.st_blocks, image["sizeBytes"])

    print(f"\ntwo first microVM creates at once {got['a'][2]:.2f} s and {got['b'][2]:.2f} s ({made[0].split('(')[-1]}; "
          f"the disk {st.st_blocks * 512 / 2**20:.1f} MiB of {st.st_size >> 20}, the image "
          f"{image['sizeBytes'] / 2**20:.1f} MiB; load {os.getloadavg()[0]:.1f}")
    for sid in ids + [ns.id]:
        assert api.delete(f"/v1/sandboxes/{sid}").status_code == 200


# Two boots more: with RUNTIME_TEST_ALL=1 (not microvm_subset); the figures of docs/images.md.
@pytest.mark.parametrize("driver", ["microvm"], indirect=True)
def test_a_later_microvm_create_reuses_the_disk(image, api, daemon, published_client, driver, tmp_path):
    # An image of its own, FROM the first (three layers), that no microVM create has seen yet.
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    mark = uuid.uuid4().hex
    img = _build(published_client, daemon, ctx, f"FROM {image['name']}\nRUN echo {mark} > /opt/app/mark\n")
    disk = daemon.state_dir / "snapshots" / img["snapshotId"] / "upper.ext4"
    t0 = time.monotonic()
    first = api.create_sandbox(driver=driver, image=img["id"])
    first_s = time.monotonic() - t0
    st = os.stat(disk)
    t0 = time.monotonic()
    later = api.create_sandbox(driver=driver, image=img["id"])
    later_s = time.monotonic() - t0
    again = os.stat(disk)
    assert (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    for sid in (first.id, later.id):
        out = api.exec(sid, command="cat /opt/app/mark /opt/app/child.txt")
        assert out["stdout"].split() == [mark, "child"], out
    made = [line for line in daemon.log_path.read_text().splitlines() if "disk made from its layers" in line]
    assert [first.id in line for line in made if first.id in line or later.id in line] == [True], made
    print(f"\na first microVM create from the image {first_s:.2f} s (the disk made: "
          f"{[m for m in made if first.id in m][0].split('(')[-1]}, a later one {later_s:.2f} s; "
          f"load {os.getloadavg()[0]:.1f}")
    assert api.post(f"/v1/images/{img['id']}:delete", json={}).status_code == 200


@pytest.mark.microvm_subset
@pytest.mark.parametrize("driver", ["microvm"], indirect=True)
def test_a_tree_too_deep_is_refused_before_a_boot(api, daemon, published_client, driver, tmp_path):
    """A layer is the sandbox's making: a tree deeper than the conversion walks is a 409 saying
    so, before anything boots, and nothing half made stays beside the image's disk."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    img = _build(published_client, daemon, ctx,
                 "FROM default\nRUN python3 -c \"import os; os.makedirs('/deep/' + '/'.join(['d'] * 140))\"\n")
    r = api.post("/v1/sandboxes", json={"image": img["id"], "driver": driver})
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert "too deep" in err["message"] and "driver it was built on" in err["hint"], err
    snap = daemon.state_dir / "snapshots" / img["snapshotId"]
    assert not [p.name for p in snap.iterdir() if p.name.startswith((".upper.ext4.part", "upper.ext4"))]
    assert api.post(f"/v1/images/{img['id']}:delete", json={}).status_code == 200


def test_deleting_the_image_removes_its_microvm_disk(image, api, daemon):
    disk = daemon.state_dir / "snapshots" / image["snapshotId"] / "upper.ext4"
    if not disk.exists():
        pytest.skip("no microVM create made the image's microVM disk here (the microVM is not offered)")
    r = api.post(f"/v1/images/{image['id']}:delete", json={})
    assert r.status_code == 200, r.text
    assert not disk.exists() and not disk.parent.exists()


def test_a_disk_cut_short_by_a_killed_daemon_is_removed_at_its_start(fresh_daemon):
    """What a daemon killed while it made an image's microVM disk leaves (the disk under its dot
    name, the lock file) goes at the next start, and the image's own files stay."""
    with fresh_daemon.client() as api:
        r = api.post("/v1/images", json={"name": "cut", "dockerfile": "FROM default\nRUN echo one > /one\n"})
        assert r.status_code == 201, r.text
        image_id = r.json()["id"]
        img = wait_until(lambda: (lambda j: j if j["state"] not in ("queued", "building") else None)(
            api.get(f"/v1/images/{image_id}").json()), 300, 0.3, what="the image built")
        assert img["state"] == "ready", img
    snap = fresh_daemon.state_dir / "snapshots" / img["snapshotId"]
    kept = sorted(p.name for p in snap.iterdir())
    assert "layer.img" in kept, kept
    fresh_daemon.kill()
    (snap / ".upper.ext4.part").write_bytes(b"\0" * 65536)
    (snap / ".upper.ext4.lock").write_bytes(b"")
    fresh_daemon.start()
    assert sorted(p.name for p in snap.iterdir()) == kept
    assert f"removing .upper.ext4.part of snapshot {img['snapshotId']}" in fresh_daemon.log_path.read_text()
    with fresh_daemon.client() as api:
        assert api.get(f"/v1/images/{image_id}").json()["state"] == "ready"
