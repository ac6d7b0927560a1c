# runtime-interpreter: one context of Runtime's stateful interpreter.
#
# runtimed sends this program to python3's stdin (python3 - OP ARGS...), so
# it works in any image that has python3.
#
# Where the image has ipykernel and jupyter_client, a context is a Jupyter
# kernel (IPython's own semantics: !cmd, %magics, display(), formatters,
# interrupt) and this program's context process is the kernel's client: it
# speaks the kernel protocol and turns its messages into the lines below.
# Without them (a user's own image), the context process runs cells itself
# with a small loop of its own. meta.json's "kernel" says which
# ("ipykernel" or "loop").
#
#   start CTX LANGUAGE CWD ENV_JSON MEMCAP_MIB
#                                     start a context: a session of its own
#                                     that outlives the exec that started it;
#                                     MEMCAP_MIB > 0 caps its address space
#   prestart MEMCAP_MIB IDLE_S        start the default python context ahead
#                                     of its first run, where it is a kernel
#                                     and not started yet; answers at once.
#                                     Unused for IDLE_S seconds, it ends
#                                     itself (its memory back to the sandbox)
#   warm MEMCAP_MIB                   the warm pool's: start the default python
#                                     context, where it is a kernel, before the
#                                     sandbox is anyone's (no idle exit); answers
#                                     once it serves
#   adopt IDLE_S                      at a pool sandbox's hand-out: that context
#                                     takes this exec's env (its owner's) and
#                                     ends itself unused after IDLE_S; another
#                                     user than it runs as removes it
#   list                              the contexts, as {"data": [...]}, and
#                                     the default context of each language
#                                     the image has, started or not
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
KERNEL_START_S = 100  # a kernel's start, which takes seconds in the emulated microVM
INTERRUPT_GRACE_S = 5  # a kernel that ignores SIGINT this long is killed
STREAM_FLUSH_S = 0.005  # how long a kernel holds printed output before it sends it
# Deno's kernel publishes a cell's output and its idle status from tasks of their own: a
# stream or result can come just after the idle. Its cells end once this long passes with
# nothing more of theirs, at most DENO_SETTLE_MAX_S after the idle.
DENO_SETTLE_S = 0.25
DENO_SETTLE_MAX_S = 2.0
KERNEL_ENV = "RUNTIME_INTERPRETER_KERNEL"  # "loop" in a context's env asks for the loop
# Every process of a context carries this variable with the context's own token, so that a
# removal finds the ones a cell left behind in sessions of their own (`!cmd` runs on a
# pseudo-terminal, in a new session) even after their parent is gone.
TAG_ENV = "RUNTIME_INTERPRETER_CONTEXT"
# The languages, each with its Jupyter kernel's name. A language's own name is its default
# context, started on its first run. Python without ipykernel runs on the loop.
KERNELS = {"python": "ipykernel_launcher", "bash": "bash_kernel", "javascript": "deno", "typescript": "deno",
           "r": "IRkernel"}
# Deno's own kernel (deno jupyter --kernel) runs JavaScript and TypeScript alike: a cell is
# TypeScript, which is a superset. Where the images install the binary (images/build.sh).
DENO_PATHS = ("/usr/local/bin/deno", "/usr/bin/deno")
# IRkernel is an R package: where Debian's r-cran-irkernel and an R user's install put it.
IRKERNEL_PATHS = ("/usr/lib/R/site-library/IRkernel", "/usr/local/lib/R/site-library/IRkernel",
                  "/usr/lib/R/library/IRkernel")


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
            "executionCount": None, "kernel": meta.get("kernel", "loop")}


def has_modules(*names):
    import importlib.util
    return all(importlib.util.find_spec(m) is not None for m in names)


def deno_path():
    return next((p for p in DENO_PATHS if os.access(p, os.X_OK)), None)


def has_kernel(language):
    """Whether the image has the language's kernel. This program is each kernel's client
    (jupyter_client); bash_kernel runs on ipykernel."""
    if not has_modules("jupyter_client"):
        return False
    kernel = KERNELS[language]
    if kernel == "deno":
        return deno_path() is not None
    if kernel == "IRkernel":
        return os.access("/usr/bin/R", os.X_OK) and any(os.path.isdir(p) for p in IRKERNEL_PATHS)
    return has_modules("ipykernel", kernel)


def languages():
    """The languages this image runs: python always (on the loop without ipykernel), each
    other one where its kernel is installed."""
    return ["python"] + [lang for lang in KERNELS if lang != "python" and has_kernel(lang)]


def context_procs(pid, tag):
    """The context's process and everything it started: its descendants, and every process
    that carries its tag (a cell's background job whose parent has exited)."""
    parent, tagged = {}, []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        p = int(name)
        try:
            with open("/proc/%d/stat" % p, "rb") as f:
                stat = f.read()
            parent[p] = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if tag:
            try:
                with open("/proc/%d/environ" % p, "rb") as f:
                    if ("%s=%s" % (TAG_ENV, tag)).encode() in f.read().split(b"\0"):
                        tagged.append(p)
            except OSError:
                pass
    found = set(tagged)
    if pid:
        found.add(pid)
    grew = True
    while grew:
        grew = False
        for p, pp in parent.items():
            if pp in found and p not in found:
                found.add(p)
                grew = True
    found.discard(os.getpid())
    found.discard(1)
    return found


def kill_context(d):
    pid = read_pid(d)
    meta = read_meta(d) or {}
    # The context is a session leader: its group holds the kernel. What its cells started
    # may live in sessions of their own (`!cmd` on a pseudo-terminal, bash_kernel's bash):
    # they are found by ancestry and by the context's tag, stopped first so none forks
    # past the kill, then killed.
    procs = context_procs(pid, meta.get("tag"))
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in procs:
            try:
                os.kill(p, sig)
            except OSError:
                pass
    if pid:
        try:
            os.kill(-pid, signal.SIGKILL)
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
        if _lock_fd >= 0:
            os.close(_lock_fd)
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
        ready = f.read(2048)
    if not ready.startswith(b"ok"):
        fail("internal", "the context did not start: " + ready.decode("utf-8", "replace"))


def start_lock(ctx):
    """One start of a context at a time: a second start (a run racing the prestart, two
    first runs) waits for the first, then finds the context there."""
    import fcntl
    global _lock_fd
    os.makedirs(ROOT, mode=0o700, exist_ok=True)
    _lock_fd = os.open(os.path.join(ROOT, ".%s.lock" % ctx), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(_lock_fd, fcntl.LOCK_EX)


_lock_fd = -1  # held until this program exits; never by the context it starts


def op_start(ctx, language, cwd, env_json, memcap, idle_exit_s=0, pool=False):
    d = ctx_dir(ctx)
    have = languages()
    if language not in have:
        if language in KERNELS:
            fail("invalid_request", "language %s needs its Jupyter kernel (%s), which this image does not have; "
                 "it has %s" % (language, KERNELS[language], ", ".join(have)))
        fail("invalid_request", "language must be one of %s" % ", ".join(have))
    try:
        env = json.loads(env_json)
    except ValueError:
        fail("invalid_request", "env must be a JSON object")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        fail("invalid_request", "env must map names to strings")
    if not os.path.isdir(cwd):
        fail("invalid_request", "cwd %s is not a directory in the sandbox" % cwd)
    start_lock(ctx)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        if read_pid(d):
            fail("conflict", "context %s exists" % ctx)
    try:
        memcap = int(memcap)
    except ValueError:
        fail("invalid_request", "MEMCAP_MIB must be a number")
    if not os.access(cwd, os.R_OK | os.X_OK):
        fail("invalid_request", "cwd %s is not open to the sandbox's user (uid %d)" % (cwd, os.getuid()))
    kernel = "loop"
    if language != "python":
        kernel = KERNELS[language]
    elif env.get(KERNEL_ENV) != "loop" and has_modules("ipykernel", "jupyter_client"):
        kernel = "ipykernel"
    meta = {"language": language, "cwd": cwd, "env": env, "memoryCapMiB": max(0, memcap),
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "kernel": kernel, "tag": os.urandom(12).hex()}
    if idle_exit_s:
        meta["idleExitS"] = idle_exit_s
    if pool:
        meta["pool"] = True
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    spawn(ctx, d, meta)
    reply(describe(ctx, d))


def op_prestart(memcap, idle_s):
    """The default python context, started ahead of its first run where it is a kernel (a
    kernel's start is seconds; the loop's is tens of milliseconds and needs no head start).
    Answers at once; the start goes on in the background, holding the context's start lock,
    so a first run that comes meanwhile waits for it rather than starting a second one."""
    try:
        idle_s = int(idle_s)
    except ValueError:
        fail("invalid_request", "IDLE_S must be a number")
    if not has_modules("ipykernel", "jupyter_client"):
        reply({"started": False})
    d = ctx_dir("python")
    if read_meta(d) is not None and read_pid(d):
        reply({"started": False})  # running (a sandbox restored from memory has its kernel)
    pid = os.fork()
    if pid:
        reply({"started": True})
    # Detached from the exec that asked, which ends now; the start's own answer goes nowhere.
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        op_start("python", "python", "/workspace", "{}", memcap, max(1, idle_s))
    finally:
        os._exit(0)


def op_warm(memcap):
    """The warm pool's: the default python context started before the sandbox is handed out,
    with no one's env and no idle exit while it waits (the hand-out's adopt gives it both)."""
    if not has_modules("ipykernel", "jupyter_client"):
        reply({"started": False})
    op_start("python", "python", "/workspace", "{}", memcap, 0, pool=True)


# Set by the agent for this exec alone, not part of the sandbox's env a command gets.
ADOPT_SKIP = {"PWD", "OLDPWD", "SHLVL", "_", TAG_ENV, KERNEL_ENV}


def op_adopt(idle_s):
    """A pool sandbox's hand-out: its context, started before it was anyone's, takes this
    exec's env (the owner's: the create's over the egress proxy's) before any run reaches it,
    and from then on ends itself when unused for IDLE_S, as one started ahead does. A sandbox
    that runs as another user than the context does not keep it."""
    try:
        idle_s = int(idle_s)
    except ValueError:
        fail("invalid_request", "IDLE_S must be a number")
    d = ctx_dir("python")
    start_lock("python")
    meta = read_meta(d)
    if meta is None or not meta.get("pool") or not read_pid(d):
        reply({"adopted": False})
    if os.stat(d).st_uid != os.getuid():
        # The owner's sandbox runs as another user (root) than the pool's kernel: it goes,
        # and the owner's own starts in its place.
        kill_context(d)
        import shutil
        shutil.rmtree(d, ignore_errors=True)
        reply({"adopted": False})
    env = {k: v for k, v in os.environ.items() if k not in ADOPT_SKIP}
    answer = b""
    try:
        with open(os.path.join(d, "port")) as f:
            port = int(f.read().strip())
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(json.dumps({"adopt": {"env": env, "idleExitS": max(1, idle_s)}}).encode() + b"\n")
            answer = conn.makefile("rb").read(65536)
    except (OSError, ValueError):
        pass
    if b'"status": "ok"' not in answer:
        # Never left to run cells without its owner's env: the first run starts another.
        kill_context(d)
        import shutil
        shutil.rmtree(d, ignore_errors=True)
        reply({"adopted": False})
    reply({"adopted": True})


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
    # Each language's default context is there from the start, started on its first run.
    made = {one["id"] for one in out}
    for lang in languages():
        if lang not in made:
            out.append({"id": lang, "language": lang, "cwd": "/workspace", "createdAt": None, "running": False,
                        "pid": None, "executionCount": None,
                        "kernel": KERNELS[lang] if lang != "python"
                        else "ipykernel" if has_modules("ipykernel", "jupyter_client") else "loop"})
    out.sort(key=lambda one: one["id"])
    reply({"data": out})


def op_restart(ctx):
    d = ctx_dir(ctx)
    meta = read_meta(d)
    if meta is None:
        fail("not_found", "no context %s" % ctx)
    start_lock(ctx)
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
    start_lock(ctx)
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
        self.cut = {"stdout": False, "stderr": False}

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
                self.cut[kind] = True
                return
            if len(text) > room:
                self.dropped += len(text) - room
                self.cut[kind] = True
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


# What an IPython kernel maps and never touches: ten threads' stacks, its one malloc arena and
# the libraries (about 85 of the 150 MiB it maps at its start with the default image), numpy's
# threads once imported. Its cap has this on top of the sandbox's three quarters, so that the cap
# bounds what cells use rather than those reservations (without it a 256 MiB sandbox's kernel
# could not hold a 32 MiB array after `import numpy`), and a hog still meets its MemoryError
# before the sandbox's memory is spent (the agent's memory watch would end the kernel then).
KERNEL_RESERVED_MIB = 64


def limit_self(meta, adj, reserved_mib=0):
    """oom_score_adj, and under gVisor a cap on the address space, for a process that runs cells."""
    # A cell that eats the sandbox's memory should cost its own context, not
    # the agent or another context.
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(adj))
    except OSError:
        pass
    cap = meta.get("memoryCapMiB") or 0
    if cap > 0:
        # Under gVisor the host's OOM killer would take the whole sandbox, agent
        # included: a capped address space makes a memory hog a MemoryError here.
        import resource
        cap += reserved_mib
        resource.setrlimit(resource.RLIMIT_AS, (cap << 20, cap << 20))


class LoopEngine:
    """Cells run in this process by the loop above: the fallback without ipykernel."""

    def __init__(self, ctx, d, meta):
        self.ctx, self.d, self.meta = ctx, d, meta
        self.state = None

    @property
    def count(self):
        return self.state.count

    def start(self):
        os.environ.setdefault("MPLBACKEND", "Agg")
        limit_self(self.meta, 1000)
        state = self.state = State(self.ctx, self.d)
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

    def set_env(self, env):
        return "ok"  # the loop runs cells in this process, whose os.environ has it

    def run(self, cell, code, timeout_ms):
        self.state.cell = cell
        try:
            return run_cell(self.state, cell, code, timeout_ms)
        finally:
            self.state.cell = None


# ---- a context on a Jupyter kernel -------------------------------------------

# Run in the kernel once at its start, silently: DataFrames and Series gain
# Runtime's table MIME type as one more IPython display formatter, so a
# table comes with IPython's own text/plain and text/html; a plain dict or
# list gains application/json.
KERNEL_SETUP = """
def _runtime_setup():
    import json
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class TableFormatter(BaseFormatter):
        format_type = Unicode(%(mime)r)
        print_method = ObjectName("_repr_runtime_table_")
        _return_type = (dict,)

    def table(obj):
        import pandas as pd
        if isinstance(obj, pd.Series):
            obj = obj.to_frame()
        head = obj.head(%(rows)d)
        split = json.loads(head.to_json(orient="split", date_format="iso", default_handler=str))
        return {"columns": [str(c) for c in head.columns], "index": split.get("index", []),
                "rows": split.get("data", []), "dtypes": [str(t) for t in head.dtypes],
                "totalRows": int(len(obj)), "truncated": len(obj) > %(rows)d}

    ip = get_ipython()
    f = TableFormatter(parent=ip.display_formatter)
    f.for_type_by_name("pandas.core.frame", "DataFrame", table)
    f.for_type_by_name("pandas.core.series", "Series", table)
    ip.display_formatter.formatters[%(mime)r] = f

    # A plain dict or list is also application/json, as the loop gives it and as clients
    # of this API read it (one more formatter; nothing where it is not JSON).
    def plain_json(obj):
        try:
            json.dumps(obj)
        except (TypeError, ValueError, RecursionError):
            return None
        return obj

    for kind in (dict, list):
        ip.display_formatter.formatters["application/json"].for_type(kind, plain_json)

    # ipykernel sends a stream's output every 200 ms; a client that streams a cell's
    # output sees it as it is printed instead.
    import sys
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "flush_interval"):
            stream.flush_interval = %(flush)s

_runtime_setup()
del _runtime_setup
if __import__("sys").modules.get("debugpy.server", 0) is None:
    del __import__("sys").modules["debugpy.server"]
""" % {"mime": TABLE_MIME, "rows": TABLE_ROWS, "flush": STREAM_FLUSH_S}

# ipykernel_launcher, but for its debugger: importing debugpy (for the Jupyter debugger
# protocol, which this client never speaks) is about a third of the kernel's start. Its
# module is marked missing while ipykernel imports, and the mark is removed by the setup
# above, so a cell's own `import debugpy` works as ever.
NO_DEBUGGER = "import sys; sys.modules['debugpy.server'] = None; "
PYTHON_LAUNCH = NO_DEBUGGER + "from ipykernel import kernelapp; kernelapp.launch_new_instance()"
# The other kernels' launchers, as their kernelspecs have them: bash_kernel's as its __main__
# module has it, without the debugger too (its cells are not Python: nothing there imports
# debugpy). Each is given the connection file.
LAUNCH = {
    "bash_kernel": lambda conn: [sys.executable, "-c", NO_DEBUGGER + "from ipykernel.kernelapp import IPKernelApp; "
                          "from bash_kernel.kernel import BashKernel; IPKernelApp.launch_instance("
                          "kernel_class=BashKernel)", "-f", conn],
    "deno": lambda conn: [deno_path(), "jupyter", "--kernel", "--conn", conn],
    "IRkernel": lambda conn: ["/usr/bin/R", "--slave", "--no-save", "--no-restore", "-e", "IRkernel::main()",
                              "--args", conn],
}

KEPT_EXT = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg", "text/html": "html",
            "text/markdown": "md", "text/latex": "tex", "text/plain": "txt"}


class KernelEngine:
    """An IPython kernel (ipykernel) in a child process, driven through jupyter_client.

    The kernel is this process's child in its process group, so removing or
    restarting the context (a kill of the group) ends it too. A kernel that
    dies (out of memory, killed) ends its cell with an error; the next run
    starts a new one."""

    def __init__(self, ctx, d, meta):
        self.ctx, self.d, self.meta = ctx, d, meta
        self.proc = None
        self.kc = None
        self.count = 0
        self.busy = False
        self.kill_at = None  # when an interrupted cell that goes on is killed
        self.python = meta.get("language", "python") == "python"
        self.bash = meta.get("language") == "bash"
        self.deno = KERNELS.get(meta.get("language")) == "deno"
        self.tail = ""  # the cell's last output, a failed bash command's traceback

    def start(self):
        limit_self({}, 900)  # the kernel, at 1000, is the OOM killer's first choice
        signal.signal(signal.SIGINT, lambda signum, frame: self.interrupt())
        self.launch()

    def launch(self):
        import subprocess
        from jupyter_client.blocking import BlockingKernelClient
        from jupyter_client.connect import write_connection_file
        if self.kc is not None:
            self.kc.stop_channels()
        cf = os.path.join(self.d, "kernel.json")
        write_connection_file(cf, ip="127.0.0.1", key=os.urandom(32).hex().encode())
        env = dict(os.environ)
        # IPython's profile and history stay in the context's directory, out of /workspace's view.
        env.setdefault("IPYTHONDIR", os.path.join(self.d, "ipython"))
        env["JPY_PARENT_PID"] = str(os.getpid())  # the kernel ends when this process does
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        if self.meta.get("memoryCapMiB"):
            # Under a capped address space, glibc's 64 MiB arena per thread (the kernel has
            # ten) would spend the cap on reservations before the cell's first byte. One
            # arena: with two, whether the second is made depends on two threads meeting
            # in malloc at the start, and the kernel's address space is then 150 or 220
            # MiB, over a 256 MiB sandbox's cap (192) one start in a few.
            env["MALLOC_ARENA_MAX"] = "1"
        meta = self.meta
        kernel = KERNELS[meta.get("language", "python")]
        reserved = KERNEL_RESERVED_MIB
        if kernel == "deno":
            # Deno fetches nothing at its start: no update check, its cache (compiled
            # modules, npm packages a cell imports) in the context's directory, plain text
            # for errors.
            env.setdefault("DENO_DIR", os.path.join(self.d, "deno"))
            env["DENO_NO_UPDATE_CHECK"] = "1"
            env["DENO_NO_PROMPT"] = "1"
            env["NO_COLOR"] = "1"
            if meta.get("memoryCapMiB"):
                # V8 reserves gigabytes of address space it never touches (its pointer cage,
                # code range and WebAssembly guards): under a capped address space it does
                # not start. Its heap is capped instead: a hog meets V8's own out-of-memory
                # end, a dead kernel (ContextDied), before the sandbox's memory watch.
                env["DENO_V8_FLAGS"] = "--max-old-space-size=%d" % max(16, meta["memoryCapMiB"] // 2)
                reserved = None
        elif kernel == "IRkernel":
            env["R_HISTFILE"] = os.devnull

        def child():
            if reserved is None:
                limit_self({}, 1000)
            else:
                limit_self(meta, 1000, reserved)

        if self.python:
            argv = [sys.executable, "-c", PYTHON_LAUNCH, "-f", cf, "--InteractiveShell.colors=NoColor",
                    "--HistoryManager.enabled=False"]
        else:
            argv = LAUNCH[kernel](cf)
        log = open(os.path.join(self.d, "kernel.log"), "ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, preexec_fn=child, close_fds=True)
        finally:
            log.close()
        kc = self.kc = BlockingKernelClient(connection_file=cf)
        kc.load_connection_file()
        # Deno's kernel is interrupted by a message on its control channel (a SIGINT ends
        # it); the others by the signal.
        kc.start_channels(stdin=False, hb=False, control=self.deno)
        deadline = time.monotonic() + KERNEL_START_S
        # A request sent before the kernel's shell socket is bound and read can go
        # unanswered (Jupyter's own clients ask again for the same reason): asked again
        # each second until one is answered.
        asked = {kc.kernel_info()}
        again = time.monotonic() + 1
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("the kernel exited at its start (status %s): %s"
                                   % (self.proc.returncode, self.log_tail()))
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError("the kernel did not answer in %d s" % KERNEL_START_S)
            if now > again:
                asked.add(kc.kernel_info())
                again = now + 1
            try:
                msg = kc.get_shell_msg(timeout=0.2)
            except Exception:  # queue.Empty
                continue
            if msg["parent_header"].get("msg_id") in asked:
                break
        # iopub is a subscription: what the kernel publishes before the subscription has
        # reached it is lost (ZeroMQ's slow joiner), a first cell's result with it when the
        # cell is sent at once (a run that starts a new kernel). Every kernel publishes its
        # status around a kernel_info: asked again until one is heard.
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                kc.get_iopub_msg(timeout=0.2)
                break
            except Exception:  # queue.Empty
                kc.kernel_info()
        self.count = 0
        if self.python:
            self.execute(None, KERNEL_SETUP, 0, silent=True)

    def log_tail(self):
        try:
            with open(os.path.join(self.d, "kernel.log"), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 1500))
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def interrupt(self):
        """SIGINT from the interrupt operation: to the kernel while a cell runs, then a kill if it goes on."""
        if self.busy and self.alive():
            if self.deno:
                # V8 terminates the running script, a loop that never yields included, and
                # the kernel and its state stay. This runs in the signal handler: the reply
                # is left unread (the socket keeps at most its high-water mark of them).
                self.kc.control_channel.send(self.kc.session.msg("interrupt_request", {}))
            else:
                os.kill(self.proc.pid, signal.SIGINT)
            if self.kill_at is None:
                self.kill_at = time.monotonic() + INTERRUPT_GRACE_S

    def kill(self):
        if self.alive():
            self.proc.kill()
        try:
            self.proc.wait(10)
        except Exception:
            pass

    def set_env(self, env):
        if not self.alive():
            return "ok"  # the next run starts a kernel, from this process's env
        code = "__import__('os').environ.update(__import__('json').loads(%r))" % json.dumps(env)
        return self.execute(None, code, 30000, silent=True)

    def run(self, cell, code, timeout_ms):
        if not self.alive():
            # The kernel died (during an earlier cell, or since): this run starts a new one.
            try:
                self.launch()
            except Exception as e:
                cell.line({"k": "error", "name": "ContextDied",
                           "value": ("a new kernel did not start (%s); restart the context" % e)[:TEXT_MAX],
                           "traceback": ""})
                return "lost"
        return self.execute(cell, code, timeout_ms)

    def execute(self, cell, code, timeout_ms, silent=False):
        import queue
        kc = self.kc
        msg_id = kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=False)
        start = time.monotonic()
        deadline = start + timeout_ms / 1000.0 if timeout_ms > 0 else None
        timed_out = False
        status = "ok"
        idle = False
        reply = None
        self.busy, self.kill_at, self.tail = True, None, ""
        said_error = False
        settle = None  # Deno's: when the cell ends if nothing more of it comes
        try:
            while not idle or (settle is not None and time.monotonic() < settle[0]):
                now = time.monotonic()
                if deadline is not None and now > deadline and not timed_out:
                    # As Ctrl-C would: the state stays. A kernel that ignores it is killed below.
                    timed_out = True
                    self.interrupt()
                if self.kill_at is not None and now > self.kill_at:
                    self.kill()
                if not self.alive():
                    return self.died(cell, timed_out, timeout_ms)
                try:
                    msg = kc.get_iopub_msg(timeout=0.05)
                except queue.Empty:
                    # The kernel's iopub drops messages past its high-water mark: the
                    # shell's reply ends a cell whose idle status was lost.
                    if reply is None:
                        try:
                            got = kc.get_shell_msg(timeout=0)
                        except queue.Empty:
                            got = None
                        if got is not None and got["parent_header"].get("msg_id") == msg_id:
                            reply, reply_at = got, now
                    elif now - reply_at > 1:
                        break
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["header"]["msg_type"], msg["content"]
                if settle is not None:
                    settle[0] = min(now + DENO_SETTLE_S, settle[1])
                if kind == "status":
                    idle = idle or content.get("execution_state") == "idle"
                    if idle and self.deno and settle is None:
                        settle = [now + DENO_SETTLE_S, now + DENO_SETTLE_MAX_S]
                elif cell is None:
                    continue
                elif kind == "stream":
                    text = content.get("text", "")
                    cell.text("stderr" if content.get("name") == "stderr" else "stdout", text)
                    if self.bash and isinstance(text, str):
                        self.tail = (self.tail + text)[-4096:]
                elif kind in ("display_data", "execute_result"):
                    self.result(cell, content.get("data") or {}, kind == "execute_result")
                elif kind == "execute_input":
                    self.count = content.get("execution_count", self.count)
                elif kind == "error":
                    status = "error"
                    if not timed_out:
                        tb = "\n".join(content.get("traceback") or [])
                        name, value = content.get("ename") or "Error", str(content.get("evalue", ""))
                        if self.bash and not content.get("ename"):
                            # bash_kernel says a command's exit status alone; its output on the
                            # terminal (stderr joins stdout there) is the traceback.
                            name, value = "ExitStatus", "exit status %s" % value
                            tb = tb or "\n".join(self.tail.splitlines()[-20:])
                        cell.line({"k": "error", "name": name, "value": value[:TEXT_MAX], "traceback": tb[:TEXT_MAX * 4]})
                        said_error = True
            # Only this cell's reply: a kernel_info asked again at the start may be
            # answered late.
            until = time.monotonic() + 2
            while reply is None and time.monotonic() < until:
                try:
                    got = kc.get_shell_msg(timeout=max(0.01, until - time.monotonic()))
                except queue.Empty:
                    break
                if got["parent_header"].get("msg_id") == msg_id:
                    reply = got
            if reply is not None:
                self.count = reply["content"].get("execution_count", self.count)
                # The kernel's word: a formatter's exception is shown as an error, yet the cell ran.
                content = reply["content"]
                status = "ok" if content.get("status") == "ok" else "error"
                if status == "error" and not said_error and not timed_out and cell is not None and content.get("ename"):
                    # The error message was lost on iopub (a flood, or memory short in the
                    # kernel): the reply carries the same.
                    cell.line({"k": "error", "name": content.get("ename"),
                               "value": str(content.get("evalue", ""))[:TEXT_MAX],
                               "traceback": "\n".join(content.get("traceback") or [])[:TEXT_MAX * 4]})
        finally:
            self.busy, self.kill_at = False, None
        if timed_out and cell is not None:
            cell.line({"k": "error", "name": "TimeoutError",
                       "value": "the cell ran past its timeout of %d ms" % timeout_ms, "traceback": ""})
            return "timeout"
        return status

    def died(self, cell, timed_out, timeout_ms):
        rc = self.proc.returncode
        how = "killed by signal %d" % -rc if rc is not None and rc < 0 else "exit status %s" % rc
        if timed_out:
            what = ("the cell ran past its timeout of %d ms and did not stop when interrupted: its kernel was "
                    "killed; the next run starts a new one, with empty state" % timeout_ms)
            name, status = "TimeoutError", "timeout"
        elif self.kill_at is not None:
            what = ("the cell did not stop within %d s of the interrupt: its kernel was killed; the next run "
                    "starts a new one, with empty state" % INTERRUPT_GRACE_S)
            name, status = "ContextDied", "lost"
        else:
            what = ("the kernel died during the cell (%s; out of memory, most often); the next run starts a "
                    "new one, with empty state" % how)
            name, status = "ContextDied", "lost"
        if cell is not None:
            cell.line({"k": "error", "name": name, "value": what, "traceback": ""})
        return status

    def result(self, cell, bundle, main):
        if cell.results >= RESULTS_MAX:
            cell.dropped += 1
            return
        cell.results += 1
        data, refs = {}, {}
        for mime, value in bundle.items():
            if mime == "text/plain" and isinstance(value, str) and len(value) > TEXT_MAX:
                value = value[:TEXT_MAX] + "..."
            if mime in ("image/png", "image/jpeg") and isinstance(value, str):
                value = value.replace("\n", "")  # ipykernel's base64 is wrapped at 76 columns
            size = len(value) if isinstance(value, str) else len(json.dumps(value))
            if size > INLINE_MAX:
                refs[mime] = self.keep(cell, mime, value)
            else:
                data[mime] = value
        cell.line({"k": "result", "main": main, "data": data, "refs": refs})

    def keep(self, cell, mime, value):
        ext = KEPT_EXT.get(mime, "txt" if isinstance(value, str) else "json")
        name = "%d-%d.%s" % (cell.number, cell.results, ext)
        if mime in ("image/png", "image/jpeg") and isinstance(value, str):
            raw = base64.b64decode(value)  # the protocol's base64 of binary types
        else:
            raw = value.encode() if isinstance(value, str) else json.dumps(value).encode()
        with open(os.path.join(self.d, "out", name), "wb") as f:
            f.write(raw)
        return {"path": "%s/%s/out/%s" % (ROOT, self.ctx, name), "size": len(raw)}


def serve(ctx, d, meta, ready_fd):
    os.environ.update(meta.get("env") or {})
    if meta.get("tag"):
        os.environ[TAG_ENV] = meta["tag"]
    os.chdir(meta.get("cwd") or "/workspace")
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    engine = (LoopEngine if meta.get("kernel", "loop") == "loop" else KernelEngine)(ctx, d, meta)
    try:
        engine.start()
    except Exception as e:  # said to the start, which answers it
        os.write(ready_fd, ("%s" % e).encode()[:2000] or b"error")
        return
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    for name, value in (("port", listener.getsockname()[1]), ("pid", os.getpid())):
        with open(os.path.join(d, name + ".tmp"), "w") as f:
            f.write(str(value))
        os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
    os.write(ready_fd, b"ok")
    os.close(ready_fd)
    # A context started ahead (prestart) that no run has used for idleExitS ends itself, so
    # that a sandbox that never runs a cell does not keep a kernel's memory.
    if meta.get("idleExitS"):
        listener.settimeout(meta["idleExitS"])
    while True:
        try:
            conn, _ = listener.accept()
            listener.settimeout(None)
        except socket.timeout:
            conn = idle_exit(ctx, d, meta, listener)  # a run that came at the last moment
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
        cell = Cell(out, ctx, engine.count + 1)
        try:
            req = json.loads(raw) if raw is not None else None
            if isinstance(req, dict) and "adopt" in req and meta.get("pool"):
                cell.line({"k": "end", "status": adopt_env(engine, d, meta, req["adopt"]),
                           "executionCount": engine.count})
                if meta.get("idleExitS"):
                    listener.settimeout(meta["idleExitS"])  # not a use: an unused kernel still ends
                continue
            if meta.get("pool"):
                # The pool's context, never given its owner's env (its hand-out failed): it runs
                # no cell, and goes; the next run starts the context again with the owner's env.
                cell.line({"k": "error", "name": "ContextDied", "value": "the context was not given its sandbox's "
                           "env; run again to start a new one", "traceback": ""})
                cell.line({"k": "end", "status": "lost", "executionCount": engine.count})
                out.close()
                conn.close()
                end_context(d, meta)
            code = req.get("code") if isinstance(req, dict) else None
            timeout_ms = req.get("timeoutMs", 0) if isinstance(req, dict) else 0
            if not isinstance(code, str) or not isinstance(timeout_ms, int) or timeout_ms < 0:
                cell.line({"k": "end", "status": "rejected", "executionCount": engine.count})
                continue
            status = engine.run(cell, code, timeout_ms)
            cell.line({"k": "end", "status": status, "executionCount": engine.count, "dropped": cell.dropped,
                       "truncated": cell.cut})
        except KeyboardInterrupt:
            cell.line({"k": "end", "status": "error", "executionCount": engine.count, "dropped": cell.dropped,
                       "truncated": cell.cut})
        except ValueError:
            cell.line({"k": "end", "status": "rejected", "executionCount": engine.count})
        finally:
            for f in (out, conn):
                try:
                    f.close()
                except OSError:
                    pass


def adopt_env(engine, d, meta, req):
    """The owner's env, given to a pool sandbox's context at its hand-out: to this process (a
    kernel it starts again gets it) and to the kernel's os.environ (its cells, and what they
    start). Once only: the context is no longer the pool's afterwards."""
    env = req.get("env") if isinstance(req, dict) else None
    idle = req.get("idleExitS") if isinstance(req, dict) else None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()) \
            or not isinstance(idle, int) or idle < 1:
        return "rejected"
    env = {k: v for k, v in env.items() if k and "=" not in k and "\0" not in k + v}
    os.environ.update(env)
    status = engine.set_env(env)
    if status != "ok":
        return status
    meta.pop("pool", None)
    meta["idleExitS"] = idle
    with open(os.path.join(d, "meta.json.tmp"), "w") as f:
        json.dump(meta, f)
    os.rename(os.path.join(d, "meta.json.tmp"), os.path.join(d, "meta.json"))
    return "ok"


def idle_exit(ctx, d, meta, listener):
    """The end of a context started ahead that no run used: under its start lock (a start that
    comes now waits, then starts it again), unless a run is at the door after all (its
    connection is returned, to be served, and the context stays), the listener closes, the
    directory goes and the kernel with it."""
    global _lock_fd
    start_lock(ctx)
    listener.setblocking(False)
    try:
        conn, _ = listener.accept()
    except OSError:
        conn = None
    if conn is not None:
        os.close(_lock_fd)
        _lock_fd = -1
        listener.setblocking(True)
        listener.settimeout(None)
        return conn
    listener.close()
    end_context(d, meta)


def end_context(d, meta):
    """The context's directory goes, then its processes and this one."""
    import shutil
    shutil.rmtree(d, ignore_errors=True)
    me = os.getpid()
    for p in context_procs(me, meta.get("tag")):
        if p != me:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    os._exit(0)


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
    ops = {"start": (op_start, 5), "prestart": (op_prestart, 2), "warm": (op_warm, 1), "adopt": (op_adopt, 1), "list": (op_list, 0), "restart": (op_restart, 1),
           "interrupt": (op_interrupt, 1), "remove": (op_remove, 1)}
    if len(argv) < 1 or argv[0] not in ops or len(argv) - 1 != ops[argv[0]][1]:
        fail("invalid_request", "usage: start|prestart|warm|adopt|list|restart|interrupt|remove ...")
    fn, _ = ops[argv[0]]
    fn(*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
