"""Conformance: the published withruntime client (0.35.0, in a venv of its own) opens terminals
on runtimed: terminal() with its size, write/recv/resize, the exit code, a refused start as its
terminal_refused error, and spawn(pty=...) attached to with terminal(process_id=...)."""
from __future__ import annotations

import pytest


PRELUDE = """
import json, sys, time
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
bound = float(sys.argv[2])

def until(term, needle):
    seen, end = b"", time.monotonic() + bound
    while needle not in seen:
        assert time.monotonic() < end, seen[-300:]
        chunk = term.recv()
        if chunk is None:
            break
        seen += chunk
    return seen.decode("utf-8", "replace")

def to_end(term):
    seen = b""
    while True:
        chunk = term.recv()
        if chunk is None:
            return seen.decode("utf-8", "replace")
        seen += chunk
"""


@pytest.mark.microvm_subset
def test_terminal_with_the_published_client(pub, sandbox, driver):
    bound = "240" if driver == "microvm" else "60"
    got = pub(PRELUDE + """
term = sbx.terminal(cols=101, rows=33)
term.write("stty size\\n")
size = until(term, "33 101".encode())
term.resize(120, 40)
term.write(b"stty size; exit 4\\n")
rest = to_end(term)
try:
    sbx.terminal(user="nobody")
    refused = None
except Exception as e:
    refused = [type(e).__name__, getattr(e, "code", None), str(e)]
print(json.dumps({"pid": term.process_id, "size": size, "rest": rest, "code": term.exit_code,
                  "refused": refused}))
""", sandbox.id, bound, timeout=600)
    assert got["pid"].startswith("proc_")
    assert "33 101" in got["size"] and "40 120" in got["rest"]
    assert got["code"] == 4
    name, code, text = got["refused"]
    assert code == "terminal_refused" and "user" in text, got["refused"]


def test_spawn_pty_and_attach_with_the_published_client(pub, sandbox, driver):
    got = pub(PRELUDE + """
p = sbx.spawn("echo BEGIN; read x; echo got:$x", pty={"cols": 90, "rows": 20})
term = sbx.terminal(process_id=p.id)
first = until(term, b"BEGIN")
term.write("yes\\n")
rest = to_end(term)
print(json.dumps({"same": term.process_id == p.id, "first": first, "rest": rest, "code": term.exit_code,
                  "listed": [q.get("pty") for q in sbx.processes() if q["id"] == p.id]}))
""", sandbox.id, "60", timeout=600)
    assert got["same"] and "BEGIN" in got["first"] and "got:yes" in got["rest"]
    assert got["code"] == 0 and got["listed"] == [{"cols": 90, "rows": 20}]
