# The MCP servers of a sandbox (docs/mcp.md, "Inside a sandbox"), run by
# runtimed as `python3 -c PROGRAM VERB ARGS...` under the
# sandbox's user, as an exec. Verbs:
#
#   start SPEC REPLACE   SPEC is the daemon's JSON: {"port", "servers": [{"id",
#                        "argv", "env", "secrets": {ENV: SECRET}}]}; starts a
#                        supervisor that runs mcp-proxy with the servers as its
#                        named stdio servers, and answers the state when every
#                        server is up or failed (or after START_WAIT seconds)
#   get                  the state
#   stop                 ends the supervisor, the gateway and the servers
#
# The state is JSON on standard output: {"running", "port", "servers":
# [{"id", "status", "error"}]}. What went wrong is the exit status (below)
# with the detail on standard output.
#
# mcp-proxy starts its named servers one after another and exits when one of
# them fails to start (or when one does not answer its initialize within
# SETUP_MAX seconds, the supervisor ends it); the supervisor then marks that
# server failed (the last one the gateway was setting up) and starts the
# gateway again without it, so that a broken server never takes the others
# with it. A gateway that exits
# after it came up is started again with the same servers, RESTARTS_MAX
# times in all. Everything the gateway and the servers write to stderr is
# kept up to LOG_MAX bytes; the rest is read and dropped.
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
SETUP_MAX = 30  # seconds the gateway may take to set up every server


def path(name):
    return os.path.join(DIR, name)


def alive():
    try:
        with open(path("supervisor.pid")) as f:
            pid = int(f.read())
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


def state():
    try:
        with open(path("status.json")) as f:
            st = json.load(f)
    except (OSError, ValueError):
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
    """Ends the supervisor's process group (the gateway and its servers):
    SIGTERM, SIGKILL after 3 s; waits for the group to be gone and the port
    to be free."""
    pid = alive()
    port = (state() or {}).get("port")
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
        if port:
            wait(lambda: port_free(port), 3)
    for name in ("supervisor.pid", "status.json", "spec.json", "config.json", "stopping", "gateway.log"):
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


def supervise(spec):
    status = {s["id"]: {"id": s["id"], "status": "installing", "error": None} for s in spec["servers"]}
    order = [s["id"] for s in spec["servers"]]
    remaining = list(order)

    def publish():
        write_json("status.json", {"port": spec["port"], "servers": [status[i] for i in order]})

    publish()
    restarts = 0
    log = open(path("gateway.log"), "wb")
    logged = 0
    while remaining and restarts < RESTARTS_MAX and not os.path.exists(path("stopping")):
        servers = {}
        for s in spec["servers"]:
            if s["id"] in remaining:
                env = dict(s.get("env") or {})
                for name, secret in (s.get("secrets") or {}).items():
                    env[name] = os.environ.get(secret, "")
                servers[s["id"]] = {"command": s["argv"][0], "args": s["argv"][1:], "env": env}
        write_json("config.json", {"mcpServers": servers})
        for i in remaining:
            status[i].update(status="installing", error=None)
        publish()
        try:
            gw = subprocess.Popen([GATEWAY, "--named-server-config", path("config.json"), "--port", str(spec["port"]),
                                   "--host", "127.0.0.1", "--pass-environment", "--log-level", "INFO"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  cwd=os.environ.get("HOME") if os.path.isdir(os.environ.get("HOME", "")) else "/")
        except OSError as e:
            for i in remaining:
                status[i].update(status="failed", error="the gateway did not start: %s" % e)
            break
        setting_up, up, tail, slow = None, False, b"", []

        def too_slow():
            if not up:
                slow.append(True)
                kill_tree(gw.pid)

        timer = threading.Timer(SETUP_MAX, too_slow)
        timer.daemon = True
        timer.start()
        while True:
            line = gw.stdout.readline(LINE_MAX)
            if not line:
                break
            if logged < LOG_MAX:
                log.write(line[:LOG_MAX - logged])
                log.flush()
                logged += min(len(line), LOG_MAX - logged)
            tail = (tail + line)[-600:]
            if b"Setting up named server '" in line:
                setting_up = line.split(b"'")[1].decode(errors="replace")
            elif not up and (b"Uvicorn running on" in line or b"Application startup complete" in line):
                up = True
                for i in remaining:
                    status[i]["status"] = "running"
                publish()
        gw.wait()
        timer.cancel()
        if os.path.exists(path("stopping")):
            break
        if not up and setting_up in remaining:
            remaining.remove(setting_up)
            why = ("it did not answer MCP's initialize within %d s" % SETUP_MAX if slow else
                   "it exited at its start: " + tail.decode(errors="replace").strip()[-300:])
            status[setting_up].update(status="failed", error=why)
        else:
            restarts += 1
        publish()
    for i in remaining:
        if status[i]["status"] != "failed":
            status[i].update(status="failed", error="the gateway exited %d times" % restarts)
    publish()


def start(spec_text, replace):
    spec = json.loads(spec_text)
    if not os.access(GATEWAY, os.X_OK):
        print("mcp-proxy")
        sys.exit(EXIT_MISSING)
    if alive():
        if replace != "1":
            print(",".join(s["id"] for s in (state() or {}).get("servers", [])))
            sys.exit(EXIT_BUSY)
        stop()
    for s in spec["servers"]:
        for secret in (s.get("secrets") or {}).values():
            if secret not in os.environ:
                print(secret)
                sys.exit(EXIT_NO_SECRET)
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
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline:
        st = state()
        if st and all(s["status"] != "installing" for s in st["servers"]):
            break
        time.sleep(0.1)
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
