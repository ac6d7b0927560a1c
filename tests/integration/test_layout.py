"""The layout of the C sources shows the architecture (docs/architecture.md):
HTTP stays at the edge, the manager and the drivers never reach up into it,
and the agent protocol has one client in the daemon. Static checks over the
source tree; no daemon runs."""
from __future__ import annotations

import re
from pathlib import Path

from helpers import REPO

SRC = REPO / "src"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)

# The daemon's folders are its layers (docs/architecture.md draws them):
# the entry point (src/daemon/ itself: main, the options, the wiring), the
# HTTP edge (http/: the server, WebSocket, the route table, request parsing,
# the error shape), the handlers (api/), the manager (manager/, and egress/,
# the control side of the egress proxy), the model (model/) and the store
# (store/). Each may include the layers named here, and itself.
DAEMON = SRC / "daemon"
LAYERS = ("entry", "http", "api", "manager", "egress", "model", "store")
MAY_INCLUDE = {
    "entry": {"entry", "http", "api", "manager", "egress", "model", "store"},
    "api": {"api", "http", "manager", "egress", "model", "store"},
    "http": {"http", "manager", "model", "store"},
    "manager": {"manager", "egress", "model", "store"},
    "egress": {"egress", "manager", "model", "store"},
    "store": {"store", "model"},
    "model": {"model"},
}
# What lies outside src/daemon/ that a layer may reach: the drivers, the
# egress proxy's own code, the agent protocol and the shared helpers.
OUTSIDE = {
    "entry": {"driver", "egress", "proto", "common"},
    "api": {"driver", "egress", "proto", "common"},
    "http": {"common", "proto", "egress"},
    "manager": {"driver", "egress", "proto", "common"},
    "egress": {"driver", "egress", "proto", "common"},
    "store": {"common", "egress"},
    "model": {"common"},
}


def _layer(rel: str) -> str | None:
    """The layer of a path under src/ (or of an include like
    "daemon/http/http.h"); None outside the daemon."""
    parts = rel.split("/")
    if parts[0] != "daemon":
        return None
    if len(parts) == 2:
        return "entry"
    assert parts[1] in LAYERS, f"src/{rel}: a folder of the daemon that is no layer"
    return parts[1]


def _is_http_layer(path: Path) -> bool:
    return _layer(path.relative_to(SRC).as_posix()) in ("http", "api", "entry")


def _c_files(*folders: str) -> list[Path]:
    out: list[Path] = []
    for f in folders:
        out += sorted((SRC / f).glob("*.[ch]"))
    return out


def _daemon_files(*layers: str) -> list[Path]:
    return [p for p in sorted(DAEMON.rglob("*.[ch]")) if _layer(p.relative_to(SRC).as_posix()) in layers]


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _includes(path: Path) -> list[str]:
    return INCLUDE.findall(_strip_comments(path.read_text()))


def _closure(path: Path) -> set[str]:
    """Every project header path reaches, directly or through other headers."""
    seen: set[str] = set()
    todo = [i for i in _includes(path) if (SRC / i).exists()]
    while todo:
        inc = todo.pop()
        if inc in seen:
            continue
        seen.add(inc)
        todo += [i for i in _includes(SRC / inc) if (SRC / i).exists()]
    return seen


def _manager_and_drivers() -> list[Path]:
    files = _daemon_files("manager", "egress", "model", "store")
    files += _c_files("driver", "egress", "proto")
    assert len(files) > 10, files
    return files


def _http_header(inc: str) -> bool:
    return _layer(inc) in ("http", "api", "entry")


def _http_layer_functions() -> set[str]:
    """The functions the HTTP layer's headers declare."""
    names: set[str] = set()
    for h in _daemon_files("http", "api") + [DAEMON / "daemon.h"]:
        if h.suffix == ".h":
            names |= set(re.findall(r"^[A-Za-z_][\w \*]*?\b(\w+)\s*\(", _strip_comments(h.read_text()), re.M))
    assert {"reply_json", "http_route_match", "api_error", "handle_exec", "request_parse_create"} <= names, names
    return names - {"void", "int", "bool", "char", "unsigned", "size_t", "ssize_t", "int64_t", "uint64_t"}


def test_manager_and_drivers_never_reach_the_http_layer():
    upward = _http_layer_functions()
    bad = []
    for path in _manager_and_drivers():
        rel = path.relative_to(REPO)
        for inc in sorted(_closure(path)):
            if _http_header(inc):
                bad.append(f"{rel} includes {inc}")
        if "microhttpd.h" in _includes(path):
            bad.append(f"{rel} includes microhttpd.h")
        code = _strip_comments(path.read_text())
        for call in re.findall(r"\b(\w+)\s*\(", code):
            if call in upward or call.startswith("MHD_"):
                bad.append(f"{rel} calls {call}")
        for name in re.findall(r"\b(ApiError|Req|HttpRoute|HttpServer)\b", code):
            bad.append(f"{rel} names {name}")
    assert not bad, "the manager and the drivers reach into the HTTP layer:\n" + "\n".join(sorted(set(bad)))


def test_each_layer_includes_only_what_it_may():
    """The folders of src/daemon/ are layers: each includes only the layers
    MAY_INCLUDE names for it (the model nothing of the daemon, the store the
    model, the manager never the HTTP edge or the handlers, ...)."""
    bad = []
    for path in sorted(DAEMON.rglob("*.[ch]")):
        rel = path.relative_to(SRC).as_posix()
        mine = _layer(rel)
        for inc in _includes(path):
            if not (SRC / inc).exists():
                continue
            theirs = _layer(inc)
            top = inc.split("/")[0]
            if theirs is None and top not in OUTSIDE[mine]:
                bad.append(f"src/{rel} ({mine}) includes {inc}")
            elif theirs is not None and theirs not in MAY_INCLUDE[mine]:
                bad.append(f"src/{rel} ({mine}) includes {inc} ({theirs})")
    assert not bad, "\n".join(bad)
    assert {p.name for p in DAEMON.iterdir() if p.is_dir()} == set(LAYERS) - {"entry"}


def test_http_module_knows_no_sandbox():
    """http.c serves a route table it is handed; it never names the manager or
    the handlers."""
    for name in ("http/http.c", "http/http.h"):
        incs = _closure(SRC / "daemon" / name)
        wrong = sorted(i for i in incs if Path(i).stem in ("sandbox", "api", "channel", "egress_service")
                       or Path(i).stem.startswith("api_") or i.startswith("driver/"))
        assert not wrong, f"src/daemon/{name} reaches {wrong}"


def test_handlers_do_not_borrow_each_other():
    """A handler file includes the http module, api.h (what handlers share) and
    the manager, never another handler file."""
    bad = []
    for path in sorted((SRC / "daemon" / "api").glob("api_*.c")):
        for inc in _includes(path):
            stem = Path(inc).stem
            if stem.startswith("api_") and stem != path.stem:
                bad.append(f"{path.name} includes {inc}")
    assert not bad, "\n".join(bad)


def test_one_route_table():
    """Routes are declared once, in routes.c's table; no switch over route kinds
    elsewhere decides which handler runs or which body a route takes."""
    table = (SRC / "daemon" / "api" / "routes.c").read_text()
    kinds = set(re.findall(r"\bROUTE_[A-Z_]+\b", (SRC / "daemon" / "api" / "api.h").read_text())) - {"ROUTE_ID_LEN"}
    kinds.discard("_ROUTE_MAX")
    for k in kinds:
        assert re.search(rf"\b{k}\b", table), f"{k} has no row in the route table"
    http = _strip_comments((SRC / "daemon" / "http" / "http.c").read_text())
    assert "ROUTE_" not in re.sub(r"\bROUTE_(ID_LEN|KEY_ID_LEN|MAX_URL)\b", "", http), \
        "http.c names a route: routing belongs to the table"


def test_one_agent_protocol_client():
    """Only agent_client.c writes the agent's ops: exec, files and egress build
    their requests and await their results through it."""
    bad = []
    for path in sorted(DAEMON.rglob("*.[ch]")):
        if path.name == "agent_client.c":
            continue
        code = _strip_comments(path.read_text())
        if re.search(r'"op"\s*,', code):
            bad.append(f"{path.relative_to(REPO)} builds an agent request itself")
    assert not bad, "\n".join(bad)
    egress = _strip_comments((SRC / "daemon" / "egress" / "egress_service.c").read_text())
    assert "chan_stream_next" not in egress.split("egress_sandbox_new", 1)[0], \
        "egress_service.c reads agent results itself before its relay code"


def test_one_sqlite_policy():
    """Only sqldb.c (in the store folder, src/daemon/store/) opens the
    database or sets its pragmas and busy timeout; no part keeps its own exec
    or statement-cleanup helper."""
    assert (SRC / "daemon" / "store" / "sqldb.c").is_file()
    bad = []
    for path in sorted(DAEMON.rglob("*.[ch]")) + _c_files("egress"):
        if path.name in ("sqldb.c", "sqldb.h"):
            continue
        code = _strip_comments(path.read_text())
        for what in ("sqlite3_open", "sqlite3_busy_timeout", "PRAGMA", "static int exec_sql",
                     "static int sql_err", "stmt_finalizep", "sqlite3_finalizep", "define LOCKED"):
            if what in code:
                bad.append(f"{path.relative_to(REPO)}: {what}")
        # Statements are finalized by their attribute (_cleanup_stmt_) and
        # SQL text runs through sqldb_exec, whose errors are errnos.
        for call in ("sqlite3_finalize", "sqlite3_exec"):
            if re.search(rf"\b{call}\s*\(", code):
                bad.append(f"{path.relative_to(REPO)} calls {call}")
    assert not bad, "\n".join(bad)


# Files outside the store folder that still reach the database themselves,
# each to leave this list when its SQL moves behind the store's tables (one
# that no longer does and is still listed fails too).
SQL_OUTSIDE_THE_STORE: set[str] = set()


def test_sql_only_in_the_store_folder():
    """The daemon's durable state is behind the store's interface
    (src/daemon/store/store.h): SQLite, and SQL text, appear only in the
    store folder, whose backends implement its tables."""
    found = set()
    for path in sorted(SRC.rglob("*.[ch]")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("daemon/store/"):
            continue
        code = _strip_comments(path.read_text())
        if re.search(r"\bsqlite3\w*", code) or "store/sqldb.h" in code or \
                re.search(r'"\s*(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM|CREATE TABLE)\b', code):
            found.add(rel)
    assert found - SQL_OUTSIDE_THE_STORE == set(), f"SQL outside src/daemon/store/: {sorted(found - SQL_OUTSIDE_THE_STORE)}"
    assert SQL_OUTSIDE_THE_STORE - found == set(), \
        f"no SQL left: remove from SQL_OUTSIDE_THE_STORE: {sorted(SQL_OUTSIDE_THE_STORE - found)}"


def test_egress_manager_returns_plain_data():
    """The egress state (egress_service.c) answers the secrets and audit
    routes with plain data and a SandboxError; api_egress.c makes the API's
    JSON of them. No call of it hands back JSON for a client, and it names
    none of the fields a client reads."""
    header = _strip_comments((SRC / "daemon" / "egress" / "egress_service.h").read_text())
    bad = []
    for decl in re.findall(r"^\s*int\s+(egress_(?:secret|audit)_\w+)\s*\(([^;]*)\)\s*;", header, re.M):
        name, params = decl
        if re.search(r"\bjson_t\s*\*\s*\*", params):
            bad.append(f"{name} hands back JSON")
    assert {"egress_secret_put", "egress_audit_list"} <= set(
        n for n, _ in re.findall(r"^\s*int\s+(egress_(?:secret|audit)_\w+)\s*\(([^;]*)\)\s*;", header, re.M))
    code = _strip_comments((SRC / "daemon" / "egress" / "egress_service.c").read_text())
    for field in ("createdAt", "updatedAt", "placeholder\", ", "enforced", "deleted", "sandboxId", "entries",
                  "bytesOut", "bytesIn", "secretsUsed", "\"next\""):
        if field in code:
            bad.append(f"egress_service.c names the API's {field}")
    assert not bad, "\n".join(bad)


# The stores and the manager: they hand their callers plain data and their
# own errors; the handlers (api*.c) make the API's JSON of it.
PLAIN_DATA_PARTS = ("keys", "ledger", "sandbox", "snapshot", "egress_service")
# Parts that keep no JSON of any kind: not even a stored spec or a message to
# another process.
JSON_FREE_PARTS = ("keys", "ledger")
# Fields that only the API's answers carry (keys, usage, limits, the sandbox,
# snapshot and process objects, pages). The manager's own JSON (a sandbox's
# stored spec, agent requests, the egress proxy's settings) names none of
# them, so a part that does is building an answer.
API_ANSWER_FIELDS = ("createdAt", "revokedAt", "revoked", "leaseEndsAt", "endsAt", "startedAt", "stoppedAt", "endedAt",
                     "expiresAt", "builtAt", "costMicros", "costMicrosPerHour", "runSeconds", "failureReason",
                     "keyId", "keyName", "sandboxId", "snapshotId", "sourceSandboxId", "dailyLimitMicros",
                     "totalSeconds", "totalMicros", "usedMicros", "remainingMicros", "settledMicros",
                     "reservedMicros", "limitMicros", "freesAt", "windowSeconds", "sizeBytes", "truncated",
                     "hasMore", "nextCursor", "keepsAwake")


def _plain_data_violations(src: Path) -> list[str]:
    bad = []
    for part in PLAIN_DATA_PARTS:
        header = _strip_comments(next((src / "daemon").rglob(f"{part}.h")).read_text())
        code = _strip_comments(next((src / "daemon").rglob(f"{part}.c")).read_text())
        for name, params in re.findall(r"^[A-Za-z_][\w \*]*?\b(\w+)\s*\(([^;{]*)\)\s*;", header, re.M):
            if re.search(r"\bjson_t\s*\*\s*\*", params):
                bad.append(f"{part}.h: {name} hands back JSON")
        for call in ("json_time_or_null",):
            if re.search(rf"\b{call}\s*\(", code):
                bad.append(f"{part}.c calls {call} (the API's times are the handlers')")
        for field in API_ANSWER_FIELDS:
            if f'"{field}"' in code:
                bad.append(f"{part}.c names the API's {field}")
        if part in JSON_FREE_PARTS:
            for path, text in ((f"{part}.h", header), (f"{part}.c", code)):
                if "jansson.h" in text or re.search(r"\bjson_\w+", text):
                    bad.append(f"{path} uses JSON")
    return bad


def test_stores_and_manager_return_plain_data():
    """The key store (keys.c), the ledger, the sandbox manager, the snapshot
    store and the egress state return plain data (KeyRecord, LedgerUsage,
    SandboxRow, ...) to the handlers, which make the API's JSON of it: no
    call of theirs hands back JSON, none formats the API's times or names a
    field only an answer carries, and the key store and the ledger use no
    JSON at all. (json_pack itself stays with the manager for what is its
    own: a sandbox's stored spec, agent requests, the proxy's settings.)"""
    bad = _plain_data_violations(SRC)
    assert not bad, "a store or the manager builds the API's JSON:\n" + "\n".join(bad)


def test_daemon_entry_point_is_thin():
    """runtimed's options live in one table (options.c), the one place in the
    daemon that parses a flag or a config file; main.c only reads them and
    hands over to the wiring (daemon.c), which alone opens the parts."""
    bad = []
    for path in sorted((SRC / "daemon").rglob("*.[ch]")):
        code = _strip_comments(path.read_text())
        if path.name != "options.c" and re.search(r"\bgetopt(_long)?\s*\(", code):
            bad.append(f"{path.relative_to(REPO)} parses flags itself")
    main = _strip_comments((SRC / "daemon" / "main.c").read_text())
    if len(main.splitlines()) > 150:
        bad.append(f"src/daemon/main.c has {len(main.splitlines())} lines")
    for call in ("db_open", "manager_new", "egress_service_new", "http_server_new", "driver_all"):
        if re.search(rf"\b{call}\s*\(", main):
            bad.append(f"src/daemon/main.c calls {call}: the wiring is daemon.c's")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------
# The house limits over the whole of src/: no include cycle between units, no
# C file over FILE_MAX_LINES, no function over FUNCTION_MAX_LINES.

FILE_MAX_LINES = 1500
FUNCTION_MAX_LINES = 150
# Files still over a limit, each to leave this list when it is split (a new
# offender fails the test; one that is fixed and still listed fails too).
OVER_THE_LIMITS = {
}


def _strip_code(text: str) -> str:
    """The C text with comments, string and character literals emptied and
    preprocessor lines blanked; newlines are kept, so line numbers hold."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q:
                j += 2 if text[j] == "\\" else 1
            out.append(q + q)
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    lines = "".join(out).split("\n")
    return "\n".join("" if line.lstrip().startswith("#") else line for line in lines)


def _called_name(head: str) -> tuple[str | None, int]:
    """The name before the parenthesized list that ends head, and where it
    starts: (None, 0) when head does not end in one."""
    if not head.endswith(")"):
        return None, 0
    depth = 0
    for i in range(len(head) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(head[i], 0)
        if depth == 0:
            m = re.search(r"(\w+)\s*$", head[:i])
            return (m.group(1), m.start(1)) if m else (None, 0)
    return None, 0


def c_functions(path: Path) -> list[tuple[str, int, int]]:
    """Each function defined at file scope: (name, first line, lines from
    the line of its opening brace's signature to its closing brace). A
    top-level brace after a closing parenthesis opens a function; the
    braces of initializers, structs and enums do not count."""
    code = _strip_code(path.read_text())
    found, depth, line, start, name = [], 0, 1, None, None
    for m in re.finditer(r"[{}\n]", code):
        ch = m.group(0)
        if ch == "\n":
            line += 1
        elif ch == "{":
            if depth == 0:
                head = code[max(0, m.start() - 600):m.start()].rstrip()
                name, at = _called_name(head)
                if name and name not in ("if", "for", "while", "switch"):
                    start = line - head[at:].count("\n")
                else:
                    start = None
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0 and start is not None:
                found.append((name, start, line - start + 1))
                start = None
    return found


def include_cycles(src: Path) -> list[list[str]]:
    """Units are the .c files (with their .h); a header without a .c of its
    own (a subsystem's -internal.h, a plain data header) is transparent: a
    unit that includes it depends on what it includes. Answers every set of
    units that reach each other (a strongly connected component)."""
    pattern = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)

    def includes(p: Path) -> list[str]:
        return [i for i in pattern.findall(_strip_comments(p.read_text())) if (src / i).exists()]

    units = {str(p.relative_to(src).with_suffix("")) for p in src.rglob("*.c")}
    graph: dict[str, set[str]] = {}
    for u in units:
        seen, deps = set(), set()
        todo = [i for ext in (".c", ".h") if (src / (u + ext)).exists() for i in includes(src / (u + ext))]
        while todo:
            h = todo.pop()
            if h in seen:
                continue
            seen.add(h)
            m = str(Path(h).with_suffix(""))
            if m in units:
                if m != u:
                    deps.add(m)
            else:
                todo += includes(src / h)
        graph[u] = deps
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(units):
        if v not in index:
            visit(v)
    return cycles


def limit_violations(src: Path) -> dict[str, str]:
    """Each file of src/ over a limit: "file" (too many lines) or
    "function NAME (N lines)"."""
    bad: dict[str, str] = {}
    for path in sorted(src.rglob("*.c")):
        rel = str(path.relative_to(src))
        n = path.read_text().count("\n")
        if n > FILE_MAX_LINES:
            bad[rel] = "file"
        for name, first, length in c_functions(path):
            if length > FUNCTION_MAX_LINES and rel not in bad:
                bad[rel] = f"function {name} ({length} lines from line {first})"
    return bad


def test_the_limit_measures_see_what_they_measure():
    # The measures themselves: a long function, a long initializer, braces in
    # strings and comments, a function with an attribute.
    body = "\n".join(f"        x += {i};" for i in range(200))
    table = "\n".join(f"        {{ {i}, \"{{\" }}," for i in range(300))
    text = (f"static const struct {{ int a; const char *b; }} t[] = {{\n{table}\n}};\n"
            f"/* {{ not a brace */\n"
            f"__attribute__((noinline)) static int f(int x) {{\n{body}\n        return x;\n}}\n"
            f"int g(void) {{ return '}}'; }}\n")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.c"
        p.write_text(text)
        fns = {name: length for name, _, length in c_functions(p)}
    assert fns == {"f": 203, "g": 1}, fns


def test_no_include_cycle_in_src():
    cycles = include_cycles(SRC)
    assert not cycles, "units that include each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_file_or_function_over_the_limits():
    bad = limit_violations(SRC)
    new = {f: why for f, why in bad.items() if f not in OVER_THE_LIMITS}
    fixed = sorted(f for f in OVER_THE_LIMITS if f not in bad)
    assert not new, f"over the limits ({FILE_MAX_LINES} lines a file, {FUNCTION_MAX_LINES} a function):\n" + \
        "\n".join(f"src/{f}: {why}" for f, why in sorted(new.items()))
    assert not fixed, f"within the limits now: remove from OVER_THE_LIMITS: {fixed}"


def test_cli_and_egress_take_nothing_of_the_agent_or_the_daemon():
    """The CLI and the egress process are programs of their own: no header of
    the agent or the daemon is reached from their sources, and the Makefile
    links no object of those folders into them."""
    bad = []
    for folder in ("cli", "egress"):
        for path in sorted((SRC / folder).rglob("*.[ch]")):
            for inc in sorted(_closure(path)):
                if inc.startswith(("agent/", "daemon/")):
                    bad.append(f"{path.relative_to(REPO)} reaches {inc}")
    make = (REPO / "Makefile").read_text()
    for var in ("CLI_OBJ", "EGRESS_OBJ"):
        m = re.search(rf"^{var} :=(.*?)(?<!\\)$", make, re.M | re.S)
        assert m, f"the Makefile has no {var}"
        if re.search(r"src/(agent|daemon)/", m.group(1)):
            bad.append(f"the Makefile's {var} takes {m.group(1).strip()}")
    assert not bad, "\n".join(bad)
