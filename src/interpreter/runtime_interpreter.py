# runtime-interpreter: one context of Runtime's stateful interpreter.
#
# runtimed sends this program to python3's stdin (python3 - OP ARGS...), so
# it works in any image that has python3 and needs nothing else installed.
#
#   start CTX LANGUAGE CWD ENV_JSON MEMCAP_MIB
#                                     start a context: a session of its own
#                                     that outlives the exec that started it;
#                                     MEMCAP_MIB > 0 caps its address space
#   list                              the contexts, as {"data": [...]}
#   restart CTX                       kill the context and start it again empty
#   interrupt CTX                     SIGINT: the running cell stops, state stays
#   remove CTX                        kill the context and delete its directory
#
# A context lives in ROOT/CTX: meta.json, pid, port and out/ for results too
# large to travel inline. It listens on 127.0.0.1:PORT and serves one
# connection at a time, so runs take turns in the listen queue. A run
# (runtimed's interpreter:run) sends one JSON request line and reads JSON
# lines until the context closes the connection: stdout, stderr, result,
# error, and finally end. Every line is bounded; runtimed validates them
# again. The port is reachable by every process of the sandbox, which are
# all its owner's and run as the same user as the context.
import ast
import base64
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback

ROOT = "/workspace/.runtime/interpreter"
CTX_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_REQUEST = 4 * 1024 * 1024  # a cell's source, with its JSON envelope
REQUEST_WAIT_S = 30  # a connection that sends no whole request by then is dropped
STREAM_MAX = 1024 * 1024  # stdout + stderr bytes sent per cell; the rest is counted
INLINE_MAX = 512 * 1024  # one MIME entry inline; larger ones go to out/ by reference
RESULTS_MAX = 64  # results per cell (figures, display() calls)
TEXT_MAX = 64 * 1024  # text/plain of one value
TABLE_ROWS = 1000  # rows of a DataFrame in the table MIME type
TABLE_MIME = "application/vnd.runtime.table+json"
_fd_outputs = []  # the context's FdOutput for fds 1 and 2


def reply(obj, code=0):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
    sys.exit(code)


def fail(code, message):
    reply({"error": {"code": code, "message": message}}, 1)


def ctx_dir(ctx):
    if not CTX_RE.match(ctx or ""):
        fail("invalid_request", "a context id is 1-63 of [a-z0-9-], starting with a letter or digit")
    return os.path.join(ROOT, ctx)


def read_pid(d):
    try:
        with open(os.path.join(d, "pid")) as f:
            pid = int(f.read().strip() or "0")
    except (OSError, ValueError):
        return 0
    if pid <= 1:
        return 0
    try:
        os.kill(pid, 0)
    except OSError:
        return 0
    return pid


def read_meta(d):
    try:
        with open(os.path.join(d, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def describe(ctx, d):
    meta = read_meta(d)
    if meta is None:
        return None
    pid = read_pid(d)
    return {"id": ctx, "language": meta.get("language", "python"), "cwd": meta.get("cwd", "/workspace"),
            "createdAt": meta.get("createdAt"), "running": bool(pid), "pid": pid or None,
            "executionCount": None}


def kill_context(d):
    pid = read_pid(d)
    if pid:
        # The context is a session leader: its group holds what its cells started.
        for target in (-pid, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass
        for _ in range(200):
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.01)
    try:
        os.unlink(os.path.join(d, "pid"))
    except OSError:
        pass
    return bool(pid)


def spawn(ctx, d, meta):
    """Starts the context's process, detached from the exec that asked, and
    waits until it serves."""
    os.makedirs(os.path.join(d, "out"), mode=0o700, exist_ok=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        try:
            serve(ctx, d, meta, w)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        ready = f.read(64)
    if not ready.startswith(b"ok"):
        fail("internal", "the context did not start: " + ready.decode("utf-8", "replace"))


def op_start(ctx, language, cwd, env_json, memcap):
    d = ctx_dir(ctx)
    if language != "python":
        fail("invalid_request", "language must be python")
    try:
        env = json.loads(env_json)
    except ValueError:
        fail("invalid_request", "env must be a JSON object")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        fail("invalid_request", "env must map names to strings")
    if not os.path.isdir(cwd):
        fail("invalid_request", "cwd %s is not a directory in the sandbox" % cwd)
    os.makedirs(ROOT, mode=0o700, exist_ok=True)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        if read_pid(d):
            fail("conflict", "context %s exists" % ctx)
    try:
        memcap = int(memcap)
    except ValueError:
        fail("invalid_request", "MEMCAP_MIB must be a number")
    meta = {"language": language, "cwd": cwd, "env": env, "memoryCapMiB": max(0, memcap),
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    spawn(ctx, d, meta)
    reply(describe(ctx, d))


def op_list():
    out = []
    try:
        names = sorted(os.listdir(ROOT))
    except OSError:
        names = []
    for name in names:
        if CTX_RE.match(name):
            one = describe(name, os.path.join(ROOT, name))
            if one:
                out.append(one)
    reply({"data": out})


def op_restart(ctx):
    d = ctx_dir(ctx)
    meta = read_meta(d)
    if meta is None:
        fail("not_found", "no context %s" % ctx)
    kill_context(d)
    spawn(ctx, d, meta)
    reply(describe(ctx, d))


def op_interrupt(ctx):
    d = ctx_dir(ctx)
    if read_meta(d) is None:
        fail("not_found", "no context %s" % ctx)
    pid = read_pid(d)
    if pid:
        os.kill(pid, signal.SIGINT)
    reply({"interrupted": bool(pid)})


def op_remove(ctx):
    d = ctx_dir(ctx)
    if read_meta(d) is None:
        reply({"deleted": False})
    kill_context(d)
    import shutil
    shutil.rmtree(d, ignore_errors=True)
    reply({"deleted": True})


# ---- the context process ----------------------------------------------------

class CellTimeout(BaseException):
    """Raised in the cell when its timeoutMs passes."""


class Cell:
    """One run: where its lines go, and their bounds."""

    def __init__(self, out, ctx, number):
        self.out = out
        self.ctx = ctx
        self.number = number
        self.lock = threading.Lock()
        self.sent = 0
        self.dropped = 0
        self.results = 0
        self.broken = False

    def line(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        with self.lock:
            if self.broken:
                return
            try:
                self.out.write(data)
                self.out.flush()
            except OSError:
                # The reader left (client gone): the cell runs on, unheard.
                self.broken = True

    def text(self, kind, text):
        if not text:
            return
        with self.lock:
            room = STREAM_MAX - self.sent
            if room <= 0:
                self.dropped += len(text)
                return
            if len(text) > room:
                self.dropped += len(text) - room
                text = text[:room]
            self.sent += len(text)
        self.line({"k": kind, "text": text})


class CellStream:
    """sys.stdout / sys.stderr while a cell runs: whole lines, or 8 KiB, per message."""

    def __init__(self, state, kind):
        self.state = state
        self.kind = kind
        self.buf = []
        self.size = 0

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if self.state.cell is None:
            return len(s)
        self.buf.append(s)
        self.size += len(s)
        if "\n" in s or self.size >= 8192:
            self.flush()
        return len(s)

    def flush(self):
        cell = self.state.cell
        text, self.buf, self.size = "".join(self.buf), [], 0
        if cell is not None and text:
            cell.text(self.kind, text)

    def isatty(self):
        return False

    @property
    def encoding(self):
        return "utf-8"


class State:
    def __init__(self, ctx, d):
        self.ctx = ctx
        self.d = d
        self.cell = None
        self.running = False
        self.count = 0
        self.ns = {"__name__": "__main__", "__builtins__": __builtins__}
        self.ns["display"] = self.display

    def display(self, *objs):
        cell = self.cell
        if cell is None:
            return
        for obj in objs:
            self.emit_result(cell, obj, False)

    def emit_result(self, cell, obj, main):
        if cell.results >= RESULTS_MAX:
            cell.dropped += 1
            return
        cell.results += 1
        data, refs = {}, {}
        for mime, value in bundle(obj).items():
            size = len(value) if isinstance(value, str) else len(json.dumps(value))
            if size > INLINE_MAX:
                refs[mime] = self.keep(cell, mime, value)
            else:
                data[mime] = value
        cell.line({"k": "result", "main": main, "data": data, "refs": refs})

    def keep(self, cell, mime, value):
        ext = {"image/png": "png", "text/html": "html", "text/plain": "txt"}.get(mime, "json")
        name = "%d-%d.%s" % (cell.number, cell.results, ext)
        raw = base64.b64decode(value) if mime == "image/png" else (
            value.encode() if isinstance(value, str) else json.dumps(value).encode())
        path = os.path.join(self.d, "out", name)
        with open(path, "wb") as f:
            f.write(raw)
        return {"path": "%s/%s/out/%s" % (ROOT, self.ctx, name), "size": len(raw)}


def bundle(obj):
    """The MIME bundle of a value, as a notebook shows it."""
    out = {}
    try:
        text = repr(obj)
    except Exception as e:  # a broken __repr__ is the user's, not ours
        text = "<repr failed: %s>" % type(e).__name__
    out["text/plain"] = text[:TEXT_MAX] + ("..." if len(text) > TEXT_MAX else "")
    for method, mime in (("_repr_html_", "text/html"), ("_repr_png_", "image/png"), ("_repr_json_", "application/json")):
        fn = getattr(type(obj), method, None)
        if fn is None:
            continue
        try:
            value = fn(obj)
        except Exception:
            continue
        if isinstance(value, tuple):
            value = value[0]
        if value is None:
            continue
        if mime == "image/png" and isinstance(value, bytes):
            value = base64.b64encode(value).decode()
        out[mime] = value
    if type(obj) in (dict, list) and "application/json" not in out:
        try:
            json.dumps(obj)
            out["application/json"] = obj
        except (TypeError, ValueError):
            pass
    table = as_table(obj)
    if table is not None:
        out[TABLE_MIME] = table
    return out


def as_table(obj):
    pd = sys.modules.get("pandas")
    if pd is None:
        return None
    if isinstance(obj, pd.Series):
        obj = obj.to_frame()
    if not isinstance(obj, pd.DataFrame):
        return None
    head = obj.head(TABLE_ROWS)
    split = json.loads(head.to_json(orient="split", date_format="iso", default_handler=str))
    return {"columns": [str(c) for c in head.columns], "index": split.get("index", []),
            "rows": split.get("data", []), "dtypes": [str(t) for t in head.dtypes],
            "totalRows": int(len(obj)), "truncated": len(obj) > TABLE_ROWS}


def figures(state, cell):
    """Every open matplotlib figure as image/png, then closed, as a notebook
    with inline plots does."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    import io
    for num in plt.get_fignums():
        fig = plt.figure(num)
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format="png", bbox_inches="tight")
        except Exception:
            continue
        png = base64.b64encode(buf.getvalue()).decode()
        if cell.results >= RESULTS_MAX:
            break
        cell.results += 1
        data, refs = {"text/plain": "<Figure %d>" % num}, {}
        if len(png) > INLINE_MAX:
            cell.results -= 1
            refs["image/png"] = state.keep(cell, "image/png", png)
            cell.results += 1
        else:
            data["image/png"] = png
        cell.line({"k": "result", "main": False, "data": data, "refs": refs})
    plt.close("all")


def cell_traceback(etype, value, tb):
    # Frames of this program (read from stdin) are not the user's.
    frames = [f for f in traceback.extract_tb(tb) if f.filename != "<stdin>"]
    head = ["Traceback (most recent call last):\n"] + traceback.format_list(frames) if frames else []
    return "".join(head + traceback.format_exception_only(etype, value))


def flush_streams():
    sys.stdout.flush()
    sys.stderr.flush()
    for out in _fd_outputs:
        out.sync()


def run_cell(state, cell, code, timeout_ms):
    state.count += 1
    name = "<cell-%d>" % state.count
    status = "ok"
    try:
        tree = ast.parse(code, filename=name, mode="exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        body = compile(tree, name, "exec")
        tail = compile(last, name, "eval") if last is not None else None
        if timeout_ms > 0:
            signal.setitimer(signal.ITIMER_REAL, timeout_ms / 1000.0)
        state.running = True
        try:
            exec(body, state.ns)
            value = eval(tail, state.ns) if tail is not None else None
        finally:
            state.running = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        figures(state, cell)
        if value is not None:
            state.ns["_"] = value
            state.emit_result(cell, value, True)
    except CellTimeout:
        flush_streams()
        status = "timeout"
        cell.line({"k": "error", "name": "TimeoutError", "value": "the cell ran past its timeout of %d ms" % timeout_ms,
                   "traceback": ""})
    except BaseException as e:  # the cell's exception is its result, SystemExit included
        flush_streams()
        status = "error"
        etype, value, tb = sys.exc_info()
        cell.line({"k": "error", "name": etype.__name__, "value": str(value)[:TEXT_MAX],
                   "traceback": cell_traceback(etype, value, tb)[:TEXT_MAX * 4]})
        del e
    finally:
        flush_streams()
        try:
            figures(state, cell)
        except Exception:
            pass
    return status


class FdOutput:
    """What the cell's subprocesses write to fds 1 and 2 joins its stream. At the end of a
    cell a marker written down the same pipe says everything before it was forwarded."""

    SYNC = b"\x00runtime-interpreter-sync\x00"

    def __init__(self, state, fd, kind):
        self.state = state
        self.kind = kind
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        self.fd = fd
        self.r = r
        self.synced = threading.Event()
        threading.Thread(target=self.forward, daemon=True).start()

    def emit(self, decoder, data):
        text = decoder.decode(data)
        cell = self.state.cell
        if cell is not None and text:
            cell.text(self.kind, text)

    def forward(self):
        import codecs
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        buf = b""
        while True:
            try:
                chunk = os.read(self.r, 65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while True:
                i = buf.find(self.SYNC)
                if i < 0:
                    break
                self.emit(decoder, buf[:i])
                buf = buf[i + len(self.SYNC):]
                self.synced.set()
            keep = 0
            for n in range(min(len(self.SYNC) - 1, len(buf)), 0, -1):
                if buf.endswith(self.SYNC[:n]):
                    keep = n
                    break
            self.emit(decoder, buf[:len(buf) - keep])
            buf = buf[len(buf) - keep:]

    def sync(self):
        self.synced.clear()
        try:
            os.write(self.fd, self.SYNC)
        except OSError:
            return
        self.synced.wait(2)


def serve(ctx, d, meta, ready_fd):
    os.environ.update(meta.get("env") or {})
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.chdir(meta.get("cwd") or "/workspace")
    # A cell that eats the sandbox's memory should cost its own context, not
    # the agent or another context.
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    cap = meta.get("memoryCapMiB") or 0
    if cap > 0:
        # Under gVisor the host's OOM killer would take the whole sandbox, agent
        # included: a capped address space makes a memory hog a MemoryError here.
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (cap << 20, cap << 20))
    state = State(ctx, d)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    global _fd_outputs
    _fd_outputs = [FdOutput(state, 1, "stdout"), FdOutput(state, 2, "stderr")]
    sys.stdin = open(os.devnull)
    sys.stdout = CellStream(state, "stdout")
    sys.stderr = CellStream(state, "stderr")

    def on_sigint(signum, frame):
        if state.running:
            raise KeyboardInterrupt

    def on_alarm(signum, frame):
        if state.running:
            raise CellTimeout

    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    for name, value in (("port", listener.getsockname()[1]), ("pid", os.getpid())):
        with open(os.path.join(d, name + ".tmp"), "w") as f:
            f.write(str(value))
        os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
    os.write(ready_fd, b"ok")
    os.close(ready_fd)
    while True:
        try:
            conn, _ = listener.accept()
        except KeyboardInterrupt:
            continue
        except OSError:
            time.sleep(0.1)  # out of descriptors: let the cell's leftovers go
            continue
        try:
            raw = read_request(conn)
        except (KeyboardInterrupt, OSError):
            conn.close()
            continue
        conn.settimeout(None)
        out = conn.makefile("wb")
        cell = Cell(out, ctx, state.count + 1)
        try:
            req = json.loads(raw) if raw is not None else None
            code = req.get("code") if isinstance(req, dict) else None
            timeout_ms = req.get("timeoutMs", 0) if isinstance(req, dict) else 0
            if not isinstance(code, str) or not isinstance(timeout_ms, int) or timeout_ms < 0:
                cell.line({"k": "end", "status": "rejected", "executionCount": state.count})
                continue
            state.cell = cell
            status = run_cell(state, cell, code, timeout_ms)
            state.cell = None
            cell.line({"k": "end", "status": status, "executionCount": state.count, "dropped": cell.dropped})
        except KeyboardInterrupt:
            state.cell = None
            cell.line({"k": "end", "status": "error", "executionCount": state.count, "dropped": cell.dropped})
        except ValueError:
            cell.line({"k": "end", "status": "rejected", "executionCount": state.count})
        finally:
            state.cell = None
            for f in (out, conn):
                try:
                    f.close()
                except OSError:
                    pass


def read_request(conn):
    """One request line, at most MAX_REQUEST bytes; None when it is longer or
    the run went away before sending all of it."""
    conn.settimeout(REQUEST_WAIT_S)
    parts, size = [], 0
    while size <= MAX_REQUEST:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        nl = chunk.find(b"\n")
        if nl >= 0:
            parts.append(chunk[:nl])
            return b"".join(parts) if size + nl <= MAX_REQUEST else None
        parts.append(chunk)
        size += len(chunk)
    return None


def main(argv):
    ops = {"start": (op_start, 5), "list": (op_list, 0), "restart": (op_restart, 1),
           "interrupt": (op_interrupt, 1), "remove": (op_remove, 1)}
    if len(argv) < 1 or argv[0] not in ops or len(argv) - 1 != ops[argv[0]][1]:
        fail("invalid_request", "usage: start|list|restart|interrupt|remove ...")
    fn, _ = ops[argv[0]]
    fn(*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
