"""Listings and stat as the published client reads them, on every driver: each entry's owner and
group by name from the sandbox's own /etc/passwd and /etc/group (the number as text where an id
has no usable name), entries in order of name (bytewise) whatever the directory's own order, and
a symlink's target with the type of what it leads to (targetType; null when it leads nowhere),
followed only inside the sandbox. The published client and its E2B drop-in read the same fields."""
from __future__ import annotations

import pytest

DIR = "/workspace/ls"


def entries(sandbox, path: str = DIR, **query) -> list[dict]:
    r = sandbox.list(path, **query)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def by_name(sandbox, path: str = DIR, **query) -> dict[str, dict]:
    return {e["name"]: e for e in entries(sandbox, path, **query)}


def stat(sandbox, path: str) -> dict:
    r = sandbox.stat(path)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.microvm_subset
def test_owner_and_group_names(sandbox):
    me = sandbox.run("id -un; id -gn").split()
    sandbox.write(f"{DIR}/mine.txt", b"m")  # as the sandbox's own user
    sandbox.run(f"cd {DIR} && touch root.txt nameless.txt && chown 4242:4343 nameless.txt", user="root")
    got = by_name(sandbox)
    assert (got["mine.txt"]["owner"], got["mine.txt"]["group"]) == tuple(me), got["mine.txt"]
    assert (got["root.txt"]["owner"], got["root.txt"]["group"]) == ("root", "root")
    assert (got["nameless.txt"]["owner"], got["nameless.txt"]["group"]) == ("4242", "4343")
    for name, e in got.items():
        st = stat(sandbox, e["path"])
        assert (st["owner"], st["group"]) == (e["owner"], e["group"]), name
    root = stat(sandbox, "/")
    assert (root["owner"], root["group"]) == ("root", "root")
    assert all(isinstance(e["owner"], str) and isinstance(e["group"], str) for e in entries(sandbox, "/"))


def test_names_are_read_per_request_and_bounded(sandbox):
    sandbox.run(f"mkdir -p {DIR} && cd {DIR} && touch a b c d && chown 4250:4250 a && chown 4251:4251 b && "
                "chown 4252:4252 c && chown 4253:4253 d", user="root")
    assert by_name(sandbox)["a"]["owner"] == "4250"
    # The sandbox's root may write anything there: a name that is no name,
    # an overlong one, markup and control bytes stand as the number.
    long_name = "u" * 40
    sandbox.run("printf '%s\\n' 'alice:x:4250:4250::/:' 'evil <b>\"x\":x:4251:4251::/:' "
                f"'{long_name}:x:4252:4252::/:' \"$(printf 'ctl\\001:x:4253:4253::/:')\" >> /etc/passwd && "
                "printf '%s\\n' 'staff2:x:4250:' 'bad name:x:4251:' >> /etc/group", user="root")
    got = by_name(sandbox)
    assert (got["a"]["owner"], got["a"]["group"]) == ("alice", "staff2")
    assert (got["b"]["owner"], got["b"]["group"]) == ("4251", "4251")
    assert got["c"]["owner"] == "4252"
    assert got["d"]["owner"] == "4253"


@pytest.mark.microvm_subset
def test_entries_sorted_by_name(sandbox):
    # Made in an order unlike the names' own; the directory's order (a hash
    # on ext4 and overlayfs, newest first on tmpfs) is neither.
    made = ["b", "Z9", "a.b", "_x", "Z10", "B", "a-b", "\u00e9t\u00e9", "a"]
    sandbox.run(f"mkdir -p {DIR} && cd {DIR} && for n in " + " ".join(f"'{n}'" for n in made[:-1]) +
                "; do touch \"$n\"; done && mkdir a && touch a/z a/Y a/y")
    want = ["B", "Z10", "Z9", "_x", "a", "a-b", "a.b", "b", "\u00e9t\u00e9"]
    assert [e["name"] for e in entries(sandbox)] == want
    deep = [e["path"][len(DIR) + 1:] for e in entries(sandbox, depth=2)]
    assert deep == ["B", "Z10", "Z9", "_x", "a", "a/Y", "a/y", "a/z", "a-b", "a.b", "b", "\u00e9t\u00e9"]
    # A limit cuts the ordered listing: always its start.
    body = sandbox.list(DIR, depth=2, limit=6).json()
    assert [e["path"][len(DIR) + 1:] for e in body["data"]] == deep[:6] and body["truncated"] is True
    assert [e["name"] for e in entries(sandbox, glob="**/[a-z]*")] == ["a", "y", "z", "a-b", "a.b", "b"]


def test_large_directory_sorted_and_cut_at_its_start(sandbox):
    sandbox.run(f"mkdir -p {DIR} && cd {DIR} && "
                "python3 -c \"import random\nn=list(range(3000))\nrandom.shuffle(n)\n"
                "[open('f%04d' % i, 'w').close() for i in n]\"")
    assert [e["name"] for e in entries(sandbox)] == [f"f{i:04d}" for i in range(3000)]
    body = sandbox.list(DIR, limit=5).json()
    assert [e["name"] for e in body["data"]] == [f"f{i:04d}" for i in range(5)] and body["truncated"] is True


@pytest.mark.microvm_subset
def test_symlink_target_types(sandbox):
    sandbox.run(f"mkdir -p {DIR}/dir && cd {DIR} && printf abc > file && mkfifo fifo && "
                "ln -s file to-file && ln -s dir to-dir && ln -s fifo to-fifo && ln -s nothing dangling && "
                "ln -s loop-b loop-a && ln -s loop-a loop-b && ln -s / to-root && "
                "ln -s ../../../../../../../etc/hostname climbs && ln -s to-file chain")
    want = {"to-file": ("file", "file"), "to-dir": ("dir", "directory"), "to-fifo": ("fifo", "other"),
            "dangling": ("nothing", None), "loop-a": ("loop-b", None), "loop-b": ("loop-a", None),
            "to-root": ("/", "directory"), "climbs": ("../../../../../../../etc/hostname", "file"),
            "chain": ("to-file", "file")}
    listed = by_name(sandbox)
    for name, (target, target_type) in want.items():
        for e in (listed[name], stat(sandbox, f"{DIR}/{name}")):
            assert e["type"] == "symlink", e
            assert e["symlinkTarget"] == target and e["target"] == target, e
            assert "targetType" in e and e["targetType"] == target_type, e
    # Not a link: no target and no targetType.
    for e in (listed["file"], listed["dir"], stat(sandbox, f"{DIR}/file")):
        assert "targetType" not in e and "symlinkTarget" not in e, e
    # A link to / is the sandbox's own root: a listing through the link
    # shows the sandbox's files, never the host's.
    inside = {e["name"] for e in entries(sandbox, f"{DIR}/to-root")}
    assert "workspace" in inside, inside


@pytest.mark.microvm_subset
def test_published_client_reads_owner_order_and_links(pub, sandbox):
    sandbox.run(f"mkdir -p {DIR} && cd {DIR} && touch b a C && ln -s a to-a && ln -s gone dangling && "
                "ln -s / root-link")
    sandbox.run(f"cd {DIR} && chown 4242:4343 C", user="root")
    me = sandbox.run("id -un; id -gn").split()
    got = pub("""
import json, sys
from withruntime import Sandbox
from withruntime.e2b import Sandbox as E2BSandbox
sbx = Sandbox.connect(sys.argv[1])
f = sbx.files
listed = f.list(sys.argv[2])
e2b = E2BSandbox.connect(sys.argv[1])
info = e2b.files.list(sys.argv[2])
print(json.dumps({
  "names": [e["name"] for e in listed],
  "owners": {e["name"]: [e["owner"], e["group"]] for e in listed},
  "links": {e["name"]: [e.get("symlinkTarget"), e.get("targetType")] for e in listed},
  "stat": f.stat(sys.argv[2] + "/to-a"),
  "e2b": [[i.name, i.owner, i.group, i.symlink_target, i.permissions[0]] for i in info],
  "e2b_info": [getattr(e2b.files.get_info(sys.argv[2] + "/a"), k) for k in ("owner", "group")],
}))
""", sandbox.id, DIR)
    assert got["names"] == ["C", "a", "b", "dangling", "root-link", "to-a"]
    assert got["owners"]["C"] == ["4242", "4343"]
    assert got["owners"]["a"] == me
    assert got["links"]["to-a"] == ["a", "file"]
    assert got["links"]["dangling"] == ["gone", None]
    assert got["links"]["root-link"] == ["/", "directory"]
    assert got["links"]["a"] == [None, None]
    st = got["stat"]
    assert (st["type"], st["symlinkTarget"], st["targetType"], st["owner"]) == ("symlink", "a", "file", me[0])
    # E2B's EntryInfo: owner and group as the names (E2B calls the sandbox
    # user by its own name only when it is "runtime"), a link's target made
    # absolute, entries in the order the server gave.
    assert [i[0] for i in got["e2b"]] == got["names"]
    rows = {i[0]: i[1:] for i in got["e2b"]}
    assert rows["C"][:2] == ["4242", "4343"]
    assert rows["to-a"] == [me[0], me[1], f"{DIR}/a", "L"]
    assert rows["root-link"][2] == "/"
    assert got["e2b_info"] == me
