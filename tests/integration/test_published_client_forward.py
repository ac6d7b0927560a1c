"""Conformance: the published withruntime client (0.35.0, in a venv of its own) forwards a port
into a sandbox on runtimed: forward_port() reaches `python3 -m http.server` inside with an HTTP GET
here, many connections at once, and a port nothing listens on closes the local connection."""
from __future__ import annotations


# Not in the microVM's default subset: test_port_forward.py's microvm case forwards into the
# guest; the published client's calls are the same on every driver (RUNTIME_TEST_ALL=1 runs it).
def test_forward_port_with_the_published_client(pub, sandbox, driver):
    bound = "240" if driver == "microvm" else "60"
    got = pub("""
import concurrent.futures, hashlib, json, socket, sys, time, urllib.request
from withruntime import Sandbox
sbx = Sandbox.connect(sys.argv[1])
bound = float(sys.argv[2])
sbx.exec("mkdir -p /workspace/www && head -c 2000000 /dev/urandom > /workspace/www/blob")
digest = sbx.exec("sha256sum /workspace/www/blob").stdout.split()[0]
server = sbx.spawn("cd /workspace/www && exec python3 -m http.server 8000 --bind 127.0.0.1")
deadline = time.monotonic() + bound
probe = "python3 -c 'import socket; socket.create_connection((\\"127.0.0.1\\", 8000), 2).close()'"
while sbx.exec(probe).exit_code != 0:
    assert time.monotonic() < deadline
    time.sleep(0.2)
fwd = sbx.forward_port(8000, local_port=0)
url = f"http://127.0.0.1:{fwd.local_port}/blob"
with concurrent.futures.ThreadPoolExecutor(8) as ex:
    bodies = list(ex.map(lambda _: urllib.request.urlopen(url, timeout=bound).read(), range(8)))
fwd.close()
refused = sbx.forward_port(8999, local_port=0)
c = socket.create_connection(("127.0.0.1", refused.local_port), timeout=bound)
try:
    end = c.recv(1)
except ConnectionResetError:
    end = b""
refused.close()
server.kill()
print(json.dumps({"host": fwd.host, "ok": [hashlib.sha256(b).hexdigest() == digest for b in bodies],
                  "refused": end.decode()}))
""", sandbox.id, bound, timeout=900)
    assert got["host"] == "127.0.0.1"
    assert got["ok"] == [True] * 8
    assert got["refused"] == ""
