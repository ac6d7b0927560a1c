"""Conformance: the published withruntime client (0.35.0, in a venv of its own) drives runtimed's
files surface as its users call it: list (with glob, hidden and limit), glob, stat and exists
(False, not an error, for a missing path), mkdir with parents, remove (recursive on request,
its answer saying whether anything went), rename with overwrite, streamed reads checked
against the length the API says, writes over 1 MiB (sent in parts) and the upload/download
helpers for single files.

The sandbox is made by the suite, so each driver is chosen; the published client attaches to it
with Sandbox.connect. On the emulated microVM a representative subset runs."""
from __future__ import annotations

import pytest

PRELUDE = """
import json, os, sys
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
f = sbx.files
"""


@pytest.mark.microvm_subset
def test_list_glob_stat_exists(pub, sandbox):
    sandbox.run("mkdir -p /workspace/p/src/pkg /workspace/p/.cache && cd /workspace/p && "
                "printf abc > top.py && touch notes.txt src/a.py src/pkg/b.py .cache/c.py && "
                "chmod 755 top.py && ln -s /etc/hostname link")
    got = pub(PRELUDE + """
rel = lambda es: sorted(e["path"][len("/workspace/p/"):] for e in es)
out = {
  "list": rel(f.list("/workspace/p")),
  "nohidden": rel(f.list("/workspace/p", hidden=False)),
  "deep": rel(f.list("/workspace/p", depth=3)),
  "glob": rel(f.glob("**/*.py", "/workspace/p")),
  "glob_top": rel(f.glob("*.py", "/workspace/p")),
  "limited": len(f.list("/workspace/p", depth=3, limit=2)),
  "entry": [e for e in f.list("/workspace/p") if e["name"] == "top.py"][0],
  "dir": f.stat("/workspace/p/src"),
  "link": f.stat("/workspace/p/link"),
  "missing": f.stat("/workspace/p/nope"),
  "exists": [f.exists("/workspace/p/top.py"), f.exists("/workspace/p/nope"), f.exists("/workspace/p/top.py/x")],
}
print(json.dumps(out))
""", sandbox.id)
    assert got["list"] == [".cache", "link", "notes.txt", "src", "top.py"]
    assert got["nohidden"] == ["link", "notes.txt", "src", "top.py"]
    assert got["deep"] == [".cache", ".cache/c.py", "link", "notes.txt", "src", "src/a.py", "src/pkg",
                           "src/pkg/b.py", "top.py"]
    assert got["glob"] == [".cache/c.py", "src/a.py", "src/pkg/b.py", "top.py"]
    assert got["glob_top"] == ["top.py"]
    assert got["limited"] == 2
    e = got["entry"]
    assert (e["path"], e["name"], e["type"], e["size"], e["mode"]) == ("/workspace/p/top.py", "top.py", "file", 3,
                                                                       "0755"), e
    assert e["modifiedAt"].endswith("Z")
    assert got["dir"]["type"] == "directory" and got["dir"]["exists"] is True
    assert got["link"]["type"] == "symlink" and got["link"]["symlinkTarget"] == "/etc/hostname"
    assert got["missing"] == {"path": "/workspace/p/nope", "exists": False}
    assert got["exists"] == [True, False, False]


@pytest.mark.microvm_subset
def test_mkdir_remove_rename(pub, sandbox):
    got = pub(PRELUDE + """
from withruntime import RuntimeAPIError
out = {}
f.mkdir("/workspace/m/n/o")
f.mkdir("/workspace/m/n/o")  # parents=True: an existing directory is fine
try:
    f.mkdir("/workspace/m/n/o", parents=False)
    out["mkdir_again"] = "no error"
except RuntimeAPIError as e:
    out["mkdir_again"] = [e.status, e.code]
f.write("/workspace/m/n/o/f.txt", "x")
try:
    f.remove("/workspace/m")
    out["remove_full"] = "no error"
except RuntimeAPIError as e:
    out["remove_full"] = [e.status, e.code]
out["removed"] = [f.remove("/workspace/m", recursive=True), f.remove("/workspace/m", recursive=True)]
f.write("/workspace/a.txt", "a")
f.write("/workspace/b.txt", "b")
try:
    f.rename("/workspace/a.txt", "/workspace/b.txt")
    out["rename_kept"] = "no error"
except RuntimeAPIError as e:
    out["rename_kept"] = [e.status, e.code, f.read_text("/workspace/b.txt")]
f.rename("/workspace/a.txt", "/workspace/b.txt", overwrite=True)
out["renamed"] = [f.read_text("/workspace/b.txt"), f.exists("/workspace/a.txt")]
print(json.dumps(out))
""", sandbox.id)
    assert got["mkdir_again"] == [409, "conflict"]
    assert got["remove_full"] == [409, "conflict"]
    assert got["removed"] == [True, False]
    assert got["rename_kept"] == [409, "conflict", "b"]
    assert got["renamed"] == ["a", False]


def test_streamed_reads_upload_download(pub, sandbox, tmp_path):
    sandbox.run("head -c 3000000 /dev/urandom > /workspace/big.bin && chmod 640 /workspace/big.bin")
    want = sandbox.run("sha256sum /workspace/big.bin").split()[0]
    local = tmp_path / "tool.sh"
    local.write_bytes(b"#!/bin/sh\necho uploaded\n")
    local.chmod(0o755)
    got = pub(PRELUDE + """
import hashlib
payload = os.urandom(3 * 1024 * 1024 + 5)
f.write("/workspace/written.bin", payload, mode=0o700)  # over 1 MiB: in parts
written = f.read("/workspace/written.bin") == payload
h, pieces = hashlib.sha256(), 0
for piece in f.read_stream("/workspace/big.bin"):
    h.update(piece); pieces += 1
dest = os.path.join(sys.argv[2], "got.bin")
f.download("/workspace/big.bin", dest)
f.upload(sys.argv[3], "/workspace/bin/tool.sh")
try:
    f.download("/workspace/none.bin", os.path.join(sys.argv[2], "none.bin"))
    missing = "no error"
except Exception as e:
    missing = [type(e).__name__, getattr(e, "code", None)]
print(json.dumps({"stream": h.hexdigest(), "pieces": pieces, "written": written,
                  "download": hashlib.sha256(open(dest, "rb").read()).hexdigest(),
                  "left": sorted(os.listdir(sys.argv[2])), "missing": missing}))
""", sandbox.id, str(tmp_path), str(local))
    assert got["stream"] == want and got["download"] == want
    assert got["pieces"] >= 1 and got["written"] is True
    assert sandbox.stat("/workspace/written.bin").json()["mode"] == "0700"
    assert got["left"] == ["got.bin", "tool.sh"]  # no partial file beside it
    assert got["missing"][1] == "file_not_found", got["missing"]
    assert sandbox.run("/workspace/bin/tool.sh") == "uploaded\n"
    assert sandbox.stat("/workspace/bin/tool.sh").json()["mode"] == "0755"


@pytest.mark.microvm_subset
def test_archive_unarchive_and_folders(pub, sandbox, tmp_path):
    sandbox.run("mkdir -p /workspace/proj/src /workspace/proj/.venv && cd /workspace/proj && "
                "printf 'print(1)' > src/main.py && printf x > .venv/big && ln -s src/main.py entry.py")
    local = tmp_path / "local"
    (local / "pkg").mkdir(parents=True)
    (local / "pkg" / "mod.py").write_text("X = 1\n")
    (local / "blob.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: a gzip of it still makes parts
    (local / "rand.bin").write_bytes(__import__("os").urandom(1_500_000))  # incompressible: over 1 MiB
    got = pub(PRELUDE + """
import io, tarfile
out = {}
data = f.archive("/workspace/proj", exclude=[".venv"])
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
    out["names"] = sorted(m.name for m in t.getmembers())
plain = f.archive("/workspace/proj", gzip=False)
out["plain"] = plain[:2] != b"\\x1f\\x8b" and len(plain) % 512 == 0
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as t:
    i = tarfile.TarInfo("notes/n.txt"); i.size = 2; t.addfile(i, io.BytesIO(b"hi"))
f.unarchive("/workspace/un", buf.getvalue())
out["unarchived"] = f.read_text("/workspace/un/notes/n.txt")
bad = io.BytesIO()
with tarfile.open(fileobj=bad, mode="w") as t:
    i = tarfile.TarInfo("../escape"); i.size = 1; t.addfile(i, io.BytesIO(b"x"))
try:
    f.unarchive("/workspace/un", bad.getvalue())
    out["bad"] = "no error"
except Exception as e:
    out["bad"] = [getattr(e, "status", None), getattr(e, "code", None)]
f.upload(sys.argv[2], "/workspace/up")
f.download("/workspace/proj", os.path.join(sys.argv[3], "proj"))
out["downloaded"] = sorted(os.path.relpath(os.path.join(d, n), sys.argv[3])
                           for d, ds, ns in os.walk(os.path.join(sys.argv[3], "proj")) for n in ns + ds)
print(json.dumps(out))
""", sandbox.id, str(local), str(tmp_path))
    assert got["names"] == [".", "./entry.py", "./src", "./src/main.py"], got["names"]
    assert got["plain"] is True
    assert got["unarchived"] == "hi"
    assert got["bad"] == [400, "invalid_request"]
    assert sandbox.run("test ! -e /workspace/escape && echo ok") == "ok\n"
    assert sandbox.read("/workspace/up/pkg/mod.py") == b"X = 1\n"
    assert sandbox.read("/workspace/up/blob.bin") == bytes(range(256)) * 8192
    assert sandbox.run("stat -c %s /workspace/up/rand.bin") == "1500000\n"
    assert {"proj/src/main.py", "proj/entry.py", "proj/.venv/big"} <= set(got["downloaded"]), got["downloaded"]
