# The MCP servers of a sandbox (docs/mcp.md, "Inside a sandbox"), run by
# runtimed as `python3 -c PROGRAM VERB ARGS...` under the
# sandbox's user, as an exec. Verbs:
#
#   start SPEC REPLACE   SPEC is the daemon's JSON: {"port", "servers": [{"id",
#                        "argv", "env", "secrets": {ENV: SECRET}}]}; starts a
#                        supervisor that serves them, or (REPLACE, same port)
#                        hands the running one the new set; answers the state
#                        when every server is up or failed (or after
#                        START_WAIT seconds)
#   get                  the state
#   stop                 ends the supervisor, the gateways and the servers
#
# The state is JSON on standard output: {"running", "port", "servers":
# [{"id", "status", "error", "restarts"}]}. What went wrong is the exit
# status (below) with the detail on standard output.
#
# Each server has a gateway of its own (mcp-proxy with that one named
# server, on a port of the loopback chosen by the kernel), and the supervisor
# routes /servers/ID/... on the public port to it. So a change of the set
# (a start with REPLACE) ends the gateways of the servers it drops and starts
# those it adds, and the sessions of the servers that stay are never cut; a
# server whose command or secrets changed is started anew. A gateway that
# does not come up (the server exits at its start, or does not answer its
# initialize within SETUP_MAX seconds) marks its server failed; one that
# exits after it came up is started again, RESTARTS_MAX times, and its
# restarts are in the state. Everything the gateways and the servers write
# is kept up to LOG_MAX bytes in all; the rest is read and dropped.
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

EXIT_MISSING = 10      # the image has no gateway (what is missing)
EXIT_NOT_RUNNING = 11  # nothing runs
EXIT_BUSY = 16         # servers run already and REPLACE was not asked (their ids)
EXIT_NO_SECRET = 17    # the sandbox does not see a secret (its name)
EXIT_PORT_BUSY = 18    # something else listens on the port

DIR = "/tmp/.runtime-mcp"
GATEWAY = "/opt/runtime-mcp/venv/bin/mcp-proxy"
LOG_MAX = 64 * 1024
LINE_MAX = 64 * 1024
RESTARTS_MAX = 5
START_WAIT = 40
SETUP_MAX = 30  # seconds a server's gateway may take to set it up
HEAD_MAX = 16 * 1024  # a request's head, as the router reads it
HEAD_WAIT = 30  # seconds a connection may take to send it
CONNECTIONS_MAX = 256


def path(name):
    return os.path.join(DIR, name)


def recorded():
    try:
        with open(path("supervisor.pid")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def alive():
    try:
        pid = recorded()
        if pid <= 0:
            return 0
        os.kill(pid, 0)
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                return 0
        return pid
    except (OSError, ValueError, IndexError):
        return 0


def write_json(name, value):
    tmp = path(name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path(name))


def read_json(name):
    try:
        with open(path(name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def state():
    st = read_json("status.json")
    if not isinstance(st, dict):
        return None
    st["running"] = bool(alive())
    return st


def group_gone(pid):
    try:
        os.killpg(pid, 0)
        return False
    except ProcessLookupError:
        return True
    except OSError:
        return False


def port_free(port):
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def wait(cond, seconds):
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop():
    """Ends the supervisor's process group (the gateways and their servers):
    SIGTERM, SIGKILL after 3 s; waits for the group to be gone and the port
    to be free. A supervisor that died leaves its gateways in its group
    (whose id the kernel does not hand out again while it has members):
    they are killed."""
    pid = alive()
    port = (state() or {}).get("port")
    left = recorded()
    if not pid and left > 1:
        try:
            os.killpg(left, signal.SIGKILL)
        except OSError:
            pass
        wait(lambda: group_gone(left), 2)
    if pid:
        open(path("stopping"), "w").close()
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
        if not wait(lambda: group_gone(pid), 3):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            wait(lambda: group_gone(pid), 2)
        if isinstance(port, int):
            wait(lambda: port_free(port), 3)
    for name in os.listdir(DIR):
        if name != "lock":
            try:
                os.unlink(path(name))
            except OSError:
                pass
    return bool(pid)


def kill_tree(pid):
    """SIGKILL to pid and every process below it."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    todo = [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def free_loopback_port():
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def same_server(a, b):
    return all(a.get(k) == b.get(k) for k in ("argv", "env", "secrets"))


class Supervisor:
    def __init__(self, spec):
        self.port = spec["port"]
        self.lock = threading.Lock()
        self.log = open(path("gateway.log"), "wb")
        self.logged = 0
        self.routes = {}   # id -> the loopback port of its gateway, while it serves
        self.servers = {}  # id -> Server
        self.order = []
        self.generation = None
        self.first = spec

    def keep(self, line):
        with self.lock:
            if self.logged < LOG_MAX:
                self.log.write(line[:LOG_MAX - self.logged])
                self.log.flush()
                self.logged += min(len(line), LOG_MAX - self.logged)

    def publish(self):
        with self.lock:
            write_json("status.json", {"port": self.port, "generation": self.generation,
                                       "servers": [s.status for s in map(self.servers.get, self.order) if s]})

    def apply(self, spec):
        """Takes the set of a start: drops the servers it leaves out or
        changes, starts the ones it adds, and leaves the others serving."""
        wanted = {s["id"]: s for s in spec["servers"]}
        for i, srv in list(self.servers.items()):
            if i not in wanted or not same_server(srv.spec, wanted[i]):
                srv.end()
                del self.servers[i]
        with self.lock:
            self.order = [s["id"] for s in spec["servers"]]
            self.generation = spec.get("generation")
        added = [Server(self, s) for s in spec["servers"] if s["id"] not in self.servers]
        for srv in added:
            self.servers[srv.id] = srv
        self.publish()
        for srv in added:
            threading.Thread(target=srv.run, daemon=True).start()

    def reload(self):
        spec = read_json("spec.json")
        if isinstance(spec, dict) and spec.get("port") == self.port and isinstance(spec.get("servers"), list):
            self.apply(spec)

    async def route(self, reader, writer):
        """One connection of the public port: its first request's path names
        the server, and the connection is its gateway's from then on, closed
        after that request's answer (Connection: close), so that a next
        request, perhaps for another server, comes on a new connection."""
        upstream = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_WAIT)
            lines = head[:-4].split(b"\r\n")
            target = lines[0].split(b" ")
            parts = target[1].split(b"?", 1)[0].split(b"/") if len(target) == 3 else []
            name = parts[2].decode("ascii", "replace") if len(parts) > 3 and parts[1] == b"servers" else ""
            port = self.routes.get(name)
            if not port:
                body = b'{"error": "no MCP server of that name serves here"}'
                writer.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % ((503, b"Service Unavailable", len(body), body)
                                                              if name in self.servers else
                                                              (404, b"Not Found", len(body), body)))
                await writer.drain()
                return
            kept = [h for h in lines[1:] if h.split(b":", 1)[0].strip().lower() not in (b"connection", b"keep-alive")]
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", port)
            upstream.write(b"\r\n".join([lines[0], *kept, b"connection: close", b"", b""]))

            async def pipe(src, dst):
                try:
                    while True:
                        data = await src.read(65536)
                        if not data:
                            break
                        dst.write(data)
                        await dst.drain()
                    if dst.can_write_eof():
                        dst.write_eof()
                except (OSError, RuntimeError):
                    pass

            ask = asyncio.ensure_future(pipe(reader, upstream))
            await pipe(up_reader, writer)
            ask.cancel()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError):
            pass
        finally:
            for w in (upstream, writer):
                if w is not None:
                    w.close()

    async def serve(self):
        slots = asyncio.Semaphore(CONNECTIONS_MAX)

        async def one(reader, writer):
            if slots.locked():
                writer.close()
                return
            async with slots:
                await self.route(reader, writer)

        try:
            server = await asyncio.start_server(one, "127.0.0.1", self.port, limit=HEAD_MAX, reuse_address=True)
        except OSError as e:
            with self.lock:
                write_json("status.json", {"port": self.port, "generation": self.first.get("generation"), "servers": [
                    {"id": s["id"], "status": "failed", "error": "port %d: %s" % (self.port, e), "restarts": 0}
                    for s in self.first["servers"]]})
            return
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)
        self.apply(self.first)
        async with server:
            await server.serve_forever()


class Server:
    """One server of the set and its gateway."""

    def __init__(self, sup, spec):
        self.sup = sup
        self.spec = spec
        self.id = spec["id"]
        self.status = {"id": self.id, "status": "installing", "error": None, "restarts": 0}
        self.ended = False
        self.proc = None

    def end(self):
        self.ended = True
        self.sup.routes.pop(self.id, None)
        proc = self.proc
        if proc is not None:
            kill_tree(proc.pid)

    def set(self, **kw):
        if not self.ended:
            self.status.update(kw)
            self.sup.publish()

    def config(self):
        # The server's secrets are in its own environment only: the gateway's
        # configuration gives them to the one process it starts.
        env = dict(self.spec.get("env") or {})
        for name, secret in (self.spec.get("secrets") or {}).items():
            env[name] = os.environ.get(secret, "")
        name = path("config-%s.json" % self.id)
        write_json("config-%s.json" % self.id, {"mcpServers": {self.id: {
            "command": self.spec["argv"][0], "args": self.spec["argv"][1:], "env": env}}})
        return name

    def run(self):
        restarts = 0
        home = os.environ.get("HOME", "")
        while not self.ended:
            port = free_loopback_port()
            try:
                proc = subprocess.Popen([GATEWAY, "--named-server-config", self.config(), "--port", str(port),
                                         "--host", "127.0.0.1", "--pass-environment", "--log-level", "INFO"],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        cwd=home if os.path.isdir(home) else "/")
            except OSError as e:
                self.set(status="failed", error="its gateway did not start: %s" % e)
                return
            self.proc = proc
            if self.ended:
                kill_tree(proc.pid)
            up, tail, slow = False, b"", []

            def too_slow():
                if not up:
                    slow.append(True)
                    kill_tree(proc.pid)

            timer = threading.Timer(SETUP_MAX, too_slow)
            timer.daemon = True
            timer.start()
            while True:
                line = proc.stdout.readline(LINE_MAX)
                if not line:
                    break
                self.sup.keep(line)
                tail = (tail + line)[-600:]
                if not up and (b"Uvicorn running on" in line or b"Application startup complete" in line):
                    up = True
                    self.sup.routes[self.id] = port
                    self.set(status="running", error=None)
            proc.wait()
            timer.cancel()
            if self.sup.routes.get(self.id) == port:
                del self.sup.routes[self.id]
            if self.ended:
                return
            if not up:
                self.set(status="failed", error=("it did not answer MCP's initialize within %d s" % SETUP_MAX
                                                 if slow else "it exited at its start: " +
                                                 tail.decode(errors="replace").strip()[-300:]))
                return
            restarts += 1
            if restarts > RESTARTS_MAX:
                self.set(status="failed", error="its gateway exited %d times" % restarts, restarts=RESTARTS_MAX)
                return
            self.set(status="installing", error=None, restarts=restarts)


def supervise(spec):
    asyncio.run(Supervisor(spec).serve())


def settled(generation):
    st = state()
    return st if (st and st.get("generation") == generation and
                  all(s.get("status") != "installing" for s in st.get("servers", []))) else None


def start(spec_text, replace):
    spec = json.loads(spec_text)
    spec["generation"] = time.time_ns()
    if not os.access(GATEWAY, os.X_OK):
        print("mcp-proxy")
        sys.exit(EXIT_MISSING)
    for s in spec["servers"]:
        for secret in (s.get("secrets") or {}).values():
            # An egress secret's variable holds its placeholder; any other
            # variable of the environment (PATH, HOME) is no secret.
            if not os.environ.get(secret, "").startswith("runtime-secret-%s-" % secret):
                print(secret)
                sys.exit(EXIT_NO_SECRET)
    running = alive()
    if not running:
        stop()  # what a supervisor that died left
    if running:
        if replace != "1":
            print(",".join(s.get("id", "") for s in (state() or {}).get("servers", [])))
            sys.exit(EXIT_BUSY)
        if (state() or {}).get("port") == spec["port"]:
            # The same port: the running supervisor takes the new set.
            write_json("spec.json", spec)
            os.kill(running, signal.SIGHUP)
            wait(lambda: settled(spec["generation"]) or not alive(), START_WAIT)
            print(json.dumps(state() or {"running": False, "servers": []}))
            return
        stop()
    if not port_free(spec["port"]):
        print(spec["port"])
        sys.exit(EXIT_PORT_BUSY)
    for name in ("stopping", "status.json"):
        try:
            os.unlink(path(name))
        except OSError:
            pass
    write_json("spec.json", spec)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork():
            os._exit(0)
        os.setpgid(0, 0)  # a group of its own, which stop() ends whole
        fd = os.open(os.devnull, os.O_RDWR)
        for i in (0, 1, 2):
            os.dup2(fd, i)
        os.closerange(3, 1024)
        with open(path("supervisor.pid"), "w") as f:
            f.write(str(os.getpid()))
        try:
            supervise(spec)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    wait(lambda: settled(spec["generation"]) or (state() is not None and not alive()), START_WAIT)
    print(json.dumps(state() or {"running": False, "servers": []}))


def main():
    os.makedirs(DIR, mode=0o700, exist_ok=True)
    verb = sys.argv[1]
    import fcntl
    lock = open(path("lock"), "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if verb == "start":
        start(sys.argv[2], sys.argv[3])
    elif verb == "get":
        st = state()
        if st is None:
            sys.exit(EXIT_NOT_RUNNING)
        print(json.dumps(st))
    elif verb == "stop":
        print(1 if stop() else 0)
    else:
        sys.exit(2)


main()
