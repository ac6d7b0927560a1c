"""The files API on every driver: byte-exact transfers, persistence between
execs, list/stat/mkdir/remove/rename, relative paths, and its errors."""
from __future__ import annotations

import hashlib
import os

import pytest

from helpers import assert_error

MiB = 1024 * 1024


@pytest.mark.microvm_subset
def test_10mib_random_round_trip(sandbox):
    data = os.urandom(10 * MiB)
    r = sandbox.put_file("/workspace/big.bin", data)
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/workspace/big.bin", "size": len(data)}
    r = sandbox.get_file("/workspace/big.bin")
    assert r.status_code == 200
    assert r.headers.get("content-type", "").startswith("application/octet-stream")
    assert len(r.content) == len(data)
    assert r.content == data, "content differs after a round trip"
    # and what a process inside sees is the same bytes
    out = sandbox.run("sha256sum /workspace/big.bin | cut -d' ' -f1").strip()
    assert out == hashlib.sha256(data).hexdigest()


@pytest.mark.microvm_subset
def test_empty_and_binary_edge_files(sandbox):
    sandbox.write("empty", b"")
    assert sandbox.read("empty") == b""
    special = bytes(range(256)) * 4 + b"\r\n\x00\xff"
    sandbox.write("special.bin", special)
    assert sandbox.read("/workspace/special.bin") == special


@pytest.mark.microvm_subset
def test_put_is_overwrite_and_makes_parents(sandbox):
    sandbox.write("/workspace/deep/er/still/f.txt", b"one")
    sandbox.write("/workspace/deep/er/still/f.txt", b"two, longer")
    assert sandbox.read("/workspace/deep/er/still/f.txt") == b"two, longer"
    assert sandbox.run("cat /workspace/deep/er/still/f.txt") == "two, longer"
    # no temporary files left beside it
    assert sandbox.run("ls -A /workspace/deep/er/still") == "f.txt\n"


@pytest.mark.microvm_subset
def test_put_mode(sandbox):
    r = sandbox.put_file("/workspace/tool.sh", b"#!/bin/sh\necho tool ran\n", mode="755")
    assert r.status_code == 200, r.text
    assert sandbox.run("/workspace/tool.sh") == "tool ran\n"
    st = sandbox.stat("/workspace/tool.sh").json()
    assert st["mode"] == "0755", st


@pytest.mark.microvm_subset
def test_files_persist_between_execs(sandbox):
    sandbox.run("echo from-exec > /workspace/p.txt")
    assert sandbox.run("cat /workspace/p.txt") == "from-exec\n"
    assert sandbox.read("/workspace/p.txt") == b"from-exec\n"
    sandbox.write("/workspace/q.txt", b"from-api")
    assert sandbox.run("cat /workspace/q.txt") == "from-api"
    # /tmp and other writable places persist too
    sandbox.run("echo t > /tmp/t.txt")
    assert sandbox.run("cat /tmp/t.txt") == "t\n"


@pytest.mark.microvm_subset
def test_list_with_depth(sandbox):
    sandbox.write("/workspace/tree/a/b/c.txt", b"ccc")
    sandbox.write("/workspace/tree/top.txt", b"t")
    r = sandbox.list("/workspace/tree")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["path"] == "/workspace/tree"
    assert body["truncated"] is False
    paths = {e["path"]: e for e in body["data"]}
    assert set(paths) == {"/workspace/tree/a", "/workspace/tree/top.txt"}, paths
    top = paths["/workspace/tree/top.txt"]
    assert top["name"] == "top.txt" and top["type"] == "file" and top["size"] == 1
    for f in ("path", "name", "type", "size", "mode", "mtime", "modifiedAt"):
        assert f in top, f"entry lacks {f}: {top}"
    assert paths["/workspace/tree/a"]["type"] == "directory"

    body = sandbox.list("/workspace/tree", depth=3).json()
    paths = {e["path"] for e in body["data"]}
    assert paths == {"/workspace/tree/a", "/workspace/tree/a/b", "/workspace/tree/a/b/c.txt",
                     "/workspace/tree/top.txt"}, paths

    body = sandbox.list("/workspace/tree", depth=2).json()
    assert "/workspace/tree/a/b/c.txt" not in {e["path"] for e in body["data"]}


@pytest.mark.parametrize("depth", ["0", "11", "-1", "x"])
def test_list_bad_depth(sandbox, depth):
    assert_error(sandbox.list("/workspace", depth=depth), 400, "invalid_request")


@pytest.mark.microvm_subset
def test_list_glob_hidden_limit(sandbox):
    sandbox.run("mkdir -p /workspace/g/src/pkg /workspace/g/.git && cd /workspace/g && "
                "touch top.py notes.txt src/a.py src/pkg/b.py .git/c.py .hidden.py")
    names = lambda **q: sorted(e["path"][len("/workspace/g/"):]  # noqa: E731
                               for e in sandbox.list("/workspace/g", **q).json()["data"])
    assert names(glob="*.py") == [".hidden.py", "top.py"]
    assert names(glob="**/*.py") == [".git/c.py", ".hidden.py", "src/a.py", "src/pkg/b.py", "top.py"]
    assert names(glob="**/*.py", hidden="false") == ["src/a.py", "src/pkg/b.py", "top.py"]
    assert names(glob="src/*") == ["src/a.py", "src/pkg"]
    assert names(hidden="false") == ["notes.txt", "src", "top.py"]
    body = sandbox.list("/workspace/g", glob="**", limit="2").json()
    assert len(body["data"]) == 2 and body["truncated"] is True and body["hasMore"] is True


@pytest.mark.parametrize("query", [{"limit": "0"}, {"limit": "10001"}, {"limit": "x"}, {"hidden": "maybe"},
                                   {"glob": ""}, {"glob": "x" * 1025}, {"glob": "/".join(["a"] * 40)}])
def test_list_bad_query(sandbox, query):
    assert_error(sandbox.list("/workspace", **query), 400, "invalid_request")


def test_list_large_directory_is_complete(sandbox):
    sandbox.run("mkdir /workspace/big && cd /workspace/big && "
                "python3 -c \"import os\nfor i in range(2000): open('file-%05d' % i,'w').close()\"")
    body = sandbox.list("/workspace/big").json()
    assert body["truncated"] is False, f"2000 entries cut to {len(body['entries'])}"
    assert sorted(e["name"] for e in body["data"]) == [f"file-{i:05d}" for i in range(2000)]


def test_list_entry_limit(sandbox):
    sandbox.run("mkdir /workspace/many && cd /workspace/many && "
                "python3 -c \"import os\nfor i in range(10050): open(str(i),'w').close()\"")
    body = sandbox.list("/workspace/many").json()
    assert body["truncated"] is True
    assert len(body["data"]) == 10000


@pytest.mark.microvm_subset
def test_stat(sandbox):
    sandbox.write("/workspace/s.txt", b"12345")
    st = sandbox.stat("/workspace/s.txt")
    assert st.status_code == 200, st.text
    st = st.json()
    assert st["path"] == "/workspace/s.txt" and st["name"] == "s.txt"
    assert st["type"] == "file" and st["size"] == 5 and st["exists"] is True
    assert isinstance(st["mtime"], str) and st["mtime"].endswith("Z"), st
    assert sandbox.stat("/workspace").json()["type"] == "directory"
    sandbox.run("ln -s /etc/hostname /workspace/link")
    st = sandbox.stat("/workspace/link").json()
    assert st["type"] == "symlink" and st["target"] == st["symlinkTarget"] == "/etc/hostname", st
    # Nothing there is an answer, not an error: a path below a file as well.
    for missing in ("/workspace/missing", "/workspace/s.txt/below", "/no/such/dir/x"):
        r = sandbox.stat(missing)
        assert r.status_code == 200 and r.json() == {"path": missing, "exists": False}, r.text


def test_mkdir(sandbox):
    r = sandbox.files_call("mkdir", path="/workspace/m/n/o", parents=True)
    assert r.status_code == 200, r.text
    assert r.json()["path"] == "/workspace/m/n/o"
    assert sandbox.stat("/workspace/m/n/o").json()["type"] == "directory"
    # again with parents: fine; without: it exists
    assert sandbox.files_call("mkdir", path="/workspace/m/n/o", parents=True).status_code == 200
    assert_error(sandbox.files_call("mkdir", path="/workspace/m/n/o", parents=False), 409, "conflict")
    assert_error(sandbox.files_call("mkdir", path="/workspace/nope/x", parents=False), 404,
                 "not_found")
    sandbox.write("/workspace/plain", b"x")
    assert_error(sandbox.files_call("mkdir", path="/workspace/plain/sub", parents=True), 400,
                 "invalid_request")


def test_remove(sandbox):
    sandbox.write("/workspace/r/f.txt", b"x")
    sandbox.write("/workspace/r/d/g.txt", b"y")
    assert_error(sandbox.files_call("remove", path="/workspace/r"), 409, "conflict")
    assert_error(sandbox.files_call("remove", path="/workspace/r", recursive=False), 409, "conflict")
    r = sandbox.files_call("remove", path="/workspace/r/f.txt")
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/workspace/r/f.txt", "removed": True, "entries": 1}
    assert sandbox.stat("/workspace/r/f.txt").json()["exists"] is False
    r = sandbox.files_call("remove", path="/workspace/r", recursive=True)
    assert r.status_code == 200 and r.json()["entries"] == 3, r.text  # r, d, g.txt
    assert sandbox.stat("/workspace/r").json()["exists"] is False
    # Nothing there: the answer says nothing was removed.
    r = sandbox.files_call("remove", path="/workspace/r")
    assert r.status_code == 200 and r.json() == {"path": "/workspace/r", "removed": False, "entries": 0}


@pytest.mark.microvm_subset
def test_recursive_remove_does_not_follow_symlinks(sandbox):
    sandbox.write("/workspace/keep/precious.txt", b"keep me")
    sandbox.run("mkdir -p /workspace/rm && ln -s /workspace/keep /workspace/rm/link")
    assert sandbox.files_call("remove", path="/workspace/rm", recursive=True).status_code == 200
    assert sandbox.read("/workspace/keep/precious.txt") == b"keep me"


@pytest.mark.microvm_subset
def test_rename(sandbox):
    sandbox.write("/workspace/from.txt", b"moving")
    r = sandbox.files_call("rename", **{"from": "/workspace/from.txt", "to": "/workspace/dir/to.txt"})
    if r.status_code == 404:
        # rename needs the target directory to exist, as rename(2) does
        sandbox.files_call("mkdir", path="/workspace/dir", parents=True)
        r = sandbox.files_call("rename", **{"from": "/workspace/from.txt",
                                            "to": "/workspace/dir/to.txt"})
    assert r.status_code == 200, r.text
    assert r.json() == {"from": "/workspace/from.txt", "to": "/workspace/dir/to.txt"}
    assert sandbox.read("/workspace/dir/to.txt") == b"moving"
    assert sandbox.stat("/workspace/from.txt").json()["exists"] is False
    assert_error(sandbox.files_call("rename", **{"from": "/workspace/ghost", "to": "/workspace/g2"}),
                 404, "not_found")
    # overwrite: false keeps an existing target; true (or left out) replaces it.
    sandbox.write("/workspace/a.txt", b"a")
    sandbox.write("/workspace/b.txt", b"b")
    assert_error(sandbox.files_call("rename", **{"from": "/workspace/a.txt", "to": "/workspace/b.txt",
                                                 "overwrite": False}), 409, "conflict")
    assert sandbox.read("/workspace/b.txt") == b"b" and sandbox.read("/workspace/a.txt") == b"a"
    r = sandbox.files_call("rename", **{"from": "/workspace/a.txt", "to": "/workspace/b.txt", "overwrite": True})
    assert r.status_code == 200, r.text
    assert sandbox.read("/workspace/b.txt") == b"a"
    assert_error(sandbox.files_call("rename", **{"from": "/workspace/b.txt", "to": "/workspace/c.txt",
                                                 "overwrite": "yes"}), 400, "invalid_request")


def test_relative_paths_resolve_under_workspace(sandbox):
    r = sandbox.put_file("rel/x.txt", b"relative")
    assert r.status_code == 200, r.text
    assert r.json()["path"] == "/workspace/rel/x.txt"
    assert sandbox.run("cat /workspace/rel/x.txt") == "relative"
    assert sandbox.read("rel/x.txt") == b"relative"
    assert sandbox.read("./rel/../rel/x.txt") == b"relative"
    assert sandbox.stat("rel").json()["path"] == "/workspace/rel"
    assert {e["name"] for e in sandbox.list("rel").json()["data"]} == {"x.txt"}


@pytest.mark.microvm_subset
def test_missing_file_is_404(sandbox):
    assert_error(sandbox.get_file("/workspace/does-not-exist"), 404, "not_found")
    assert_error(sandbox.get_file("/no/such/dir/file"), 404, "not_found")


def test_directory_and_not_a_directory_are_400(sandbox):
    assert_error(sandbox.get_file("/workspace"), 400, "invalid_request")
    sandbox.write("/workspace/file", b"x")
    assert_error(sandbox.put_file("/workspace/file/child", b"y"), 400, "invalid_request")
    assert_error(sandbox.put_file("/workspace", b"y"), 400, "invalid_request")


@pytest.mark.parametrize("path", ["a\x00b", "/workspace/\x00", "/" + "a" * 5000,
                                  "/workspace/" + "/".join(["d" * 200] * 25)])
def test_bad_paths_are_400(sandbox, path):
    assert_error(sandbox.get_file(path), 400, "invalid_request")
    assert_error(sandbox.put_file(path, b"x"), 400, "invalid_request")
    assert_error(sandbox.stat(path), 400, "invalid_request")
    assert_error(sandbox.files_call("mkdir", path=path), 400, "invalid_request")


def test_missing_path_parameter(sandbox):
    r = sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/files/content")
    assert_error(r, 400, "invalid_request")


def test_files_of_unknown_sandbox(api):
    r = api.get("/v1/sandboxes/sbx_00000000000000000000/files/content", params={"path": "/etc/passwd"})
    assert_error(r, 404, "not_found")


@pytest.mark.microvm_subset
def test_files_are_per_sandbox(api, driver):
    a = api.create_sandbox(driver=driver)
    b = api.create_sandbox(driver=driver)
    a.write("/workspace/only-a.txt", b"a")
    assert_error(b.get_file("/workspace/only-a.txt"), 404, "not_found")
    assert b.exec("test -e /workspace/only-a.txt")["exitCode"] == 1
