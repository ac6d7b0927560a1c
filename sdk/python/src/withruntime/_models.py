"""Result types and the request building and answer parsing that the sync and async
clients share, so the two differ only in how they wait."""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from .errors import APIConnectionError, APIError, InvalidRequestError, error_from_response

# Python name -> the API's camelCase name, for POST /v1/sandboxes.
CREATE_FIELDS: Dict[str, str] = {
    "timeout_seconds": "timeoutSeconds",
    "on_lease_end": "onLeaseEnd",
    "vcpu": "vcpu",
    "memory_mib": "memoryMiB",
    "disk_mib": "diskMiB",
    "network": "network",
    "env": "env",
    "image": "image",
    "driver": "driver",
    "name": "name",
    "labels": "labels",
    "max_cost_micros": "maxCostMicros",
    "max_total_cost_micros": "maxTotalCostMicros",
    "secrets": "secrets",
    "idle_pause_seconds": "idlePauseSeconds",
    "auto_wake": "autoWake",
    "pausable": "pausable",
    "get_or_create": "getOrCreate",
    "snapshot": "snapshot",
    "snapshot_id": "snapshot",
    "user": "user",
    # The published client's names, so that code moves between the two unchanged; the daemon
    # takes persistent=False and volumes, and answers 501 naming the others (and persistent=True).
    "persistent": "persistent",
    "funding": "funding",
    "region": "region",
    "cpu": "cpu",
    "cpu_floor_millis": "cpuFloorMillis",
    "spread_from": "spreadFrom",
    "volumes": "volumes",
    "tailscale": "tailscale",
}
_VOLUME_KEYS = {"volume_id": "volumeId", "read_only": "readOnly"}
CLIENT_OPTIONS = ("keep", "api_key", "base_url", "http_timeout", "idempotency_key")

MAX_PATH_BYTES = 4096
MAX_EXEC_TIMEOUT_SECONDS = 86400
DEFAULT_EXEC_TIMEOUT_SECONDS = 60.0
# Output kept per stream when the SDK itself gathers a streamed exec; the daemon never cuts a
# stream, so without this a sandbox could fill the client's memory.
DEFAULT_STREAM_KEEP_BYTES = 1024 * 1024
# The HTTP wait for an exec is the command's own timeout plus this slack.
EXEC_HTTP_SLACK_SECONDS = 30.0
CREATE_HTTP_TIMEOUT_SECONDS = 180.0


def wake_body(timeout_seconds: Optional[int]) -> Dict[str, Any]:
    """The body of POST :wake: an optional new lease."""
    if timeout_seconds is None:
        return {}
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int):
        raise InvalidRequestError(f"timeout_seconds must be an integer, not {type(timeout_seconds).__name__}")
    return {"timeoutSeconds": timeout_seconds}

_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


def check_sandbox_id(sandbox_id: Any) -> str:
    if not isinstance(sandbox_id, str) or not _SANDBOX_ID.match(sandbox_id):
        raise InvalidRequestError(
            f"{sandbox_id!r} is not a sandbox id",
            hint="sandbox ids look like sbx_9f2c4e1a7b3d5c6e8f01",
        )
    return sandbox_id


def check_path(path: Any, what: str = "path") -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise InvalidRequestError(f"{what} must be a string, not {type(path).__name__}")
    if not path:
        raise InvalidRequestError(f"{what} is empty")
    if "\x00" in path:
        raise InvalidRequestError(f"{what} contains a NUL byte")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidRequestError(f"{what} is longer than {MAX_PATH_BYTES} bytes")
    return path


def with_user(params: Dict[str, Any], user: Optional[str]) -> Dict[str, Any]:
    """``params`` with the files API's ``user`` query argument when one is named: "sandbox"
    (what the daemon assumes when it is left out) or "root"; the daemon refuses others."""
    if user is not None:
        if not isinstance(user, str):
            raise InvalidRequestError(f"user must be a string, not {type(user).__name__}")
        params["user"] = user
    return params


def _suggest(name: str, valid: Sequence[str]) -> str:
    low = name.lower()
    for py, api in CREATE_FIELDS.items():
        if low == api.lower():
            return py
    starts = [v for v in valid if v.startswith(low)]
    if starts:
        return starts[0]
    import difflib

    # The sandbox's own fields first: a near miss is more likely one of them.
    for group in (list(CREATE_FIELDS), list(valid)):
        close = difflib.get_close_matches(low, group, n=1, cutoff=0.6)
        if close:
            return close[0]
    return ""


def build_create_body(fields: Mapping[str, Any]) -> Dict[str, Any]:
    """Map Python keyword names to the API's; an unknown name is a TypeError naming the
    nearest valid one."""
    body: Dict[str, Any] = {}
    valid = list(CREATE_FIELDS) + list(CLIENT_OPTIONS)
    for name, value in fields.items():
        api_name = CREATE_FIELDS.get(name)
        if api_name is None:
            near = _suggest(name, valid)
            hint = f"; did you mean {near!r}?" if near else ""
            raise TypeError(
                f"Sandbox.create() got an unexpected keyword argument {name!r}{hint} "
                f"(valid: {', '.join(valid)})"
            )
        if value is not None:
            body[api_name] = value
    if isinstance(body.get("volumes"), list):
        # {"volume_id", "path", "read_only"} as the published client sends them.
        body["volumes"] = [{_VOLUME_KEYS.get(k, k): v for k, v in item.items()} if isinstance(item, Mapping) else item
                           for item in body["volumes"]]
    return body


def build_sandbox_list_params(state: Optional[Sequence[str]], labels: Optional[Mapping[str, str]],
                              name: Optional[str], include_stopped: bool, limit: Optional[int]) -> List[Tuple[str, str]]:
    """The query of a sandbox listing: repeated ``state`` and ``label=key:value`` filters."""
    params: List[Tuple[str, str]] = []
    for st in [state] if isinstance(state, str) else (state or []):
        params.append(("state", str(st)))
    for k, v in (labels or {}).items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise InvalidRequestError("labels must map non-empty strings to strings")
        params.append(("label", f"{k}:{v}"))
    if name is not None:
        params.append(("name", name))
    params.append(("includeStopped", "true" if include_stopped else "false"))
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            raise InvalidRequestError(f"limit must be an integer from 1 to 100, not {limit!r}")
        params.append(("limit", str(limit)))
    return params


def build_exec_body(
    command: Union[str, Sequence[str]],
    *,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    stdin: Union[str, bytes, None],
    timeout_seconds: Optional[float],
    stream: bool,
    max_output_bytes: Optional[int],
    timeout_ms: Optional[int] = None,
    user: Optional[str] = None,
) -> Tuple[Dict[str, Any], float]:
    """The body of POST :exec and how long to wait for its answer."""
    body: Dict[str, Any] = {}
    if isinstance(command, str):
        if not command:
            raise InvalidRequestError("command is empty")
        body["command"] = command
    elif isinstance(command, (list, tuple)):
        if not command:
            raise InvalidRequestError("argv is empty", hint="pass at least the program to run")
        if not all(isinstance(a, str) for a in command):
            raise InvalidRequestError("every argv element must be a string")
        body["argv"] = list(command)
    else:
        raise InvalidRequestError(
            f"command must be a string (run by bash -c) or a list of strings (argv), "
            f"not {type(command).__name__}"
        )
    if cwd is not None:
        body["cwd"] = check_path(cwd, "cwd")
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        elif isinstance(stdin, (bytes, bytearray, memoryview)):
            body["stdinBase64"] = base64.b64encode(bytes(stdin)).decode("ascii")
        else:
            raise InvalidRequestError(f"stdin must be str or bytes, not {type(stdin).__name__}")
    if user is not None:
        if not isinstance(user, str):
            raise InvalidRequestError(f"user must be a string, not {type(user).__name__}")
        body["user"] = user
    if timeout_ms is not None:
        # The published client's name for it, in milliseconds; it wins over timeout_seconds.
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
            raise InvalidRequestError("timeout_ms must be an integer")
        timeout_seconds = timeout_ms / 1000
    seconds = DEFAULT_EXEC_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidRequestError("timeout_seconds must be a number")
    if not 0 < seconds <= MAX_EXEC_TIMEOUT_SECONDS:
        raise InvalidRequestError(
            f"timeout_seconds must be in (0, {MAX_EXEC_TIMEOUT_SECONDS}], not {seconds}"
        )
    body["timeoutMs"] = max(1, int(round(seconds * 1000)))
    if stream:
        body["stream"] = True
    elif max_output_bytes is not None:
        body["maxOutputBytes"] = int(max_output_bytes)
    return body, float(seconds) + EXEC_HTTP_SLACK_SECONDS


def event_end(ev: Mapping[str, Any], cursor: int) -> int:
    """The output cursor after a stdout/stderr event: its offset plus its bytes (``base64``
    when present, else the text's UTF-8)."""
    off = ev.get("offset")
    if not isinstance(off, int):
        return cursor
    b64 = ev.get("base64")
    if isinstance(b64, str):
        n = len(base64.b64decode(b64))
    else:
        data = ev.get("data")
        # ASCII text (which str knows without a look) is its own length in bytes: no copy.
        n = (len(data) if data.isascii() else len(data.encode())) if isinstance(data, str) else 0
    return max(cursor, off + n)


@dataclass(frozen=True)
class CommandResult:
    """What a command did. A timeout is a result: ``timed_out`` is True and ``exit_code`` 137."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    #: The process the command ran as (a streamed exec or a spawned process); None for a
    #: buffered exec.
    process_id: Optional[str] = None
    #: Who ran it, "sandbox" or "root" ("root" on an image without the sandbox user); None
    #: from a daemon that does not say.
    user: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out


def parse_exec_result(data: Any) -> CommandResult:
    if not isinstance(data, Mapping) or not isinstance(data.get("exitCode"), int):
        raise APIConnectionError("the daemon's exec answer has no exitCode")
    return CommandResult(
        exit_code=int(data["exitCode"]),
        stdout=str(data.get("stdout") or ""),
        stderr=str(data.get("stderr") or ""),
        timed_out=bool(data.get("timedOut", False)),
        stdout_truncated=bool(data.get("stdoutTruncated", False)),
        stderr_truncated=bool(data.get("stderrTruncated", False)),
        duration_ms=int(data.get("durationMs") or 0),
        user=data["user"] if isinstance(data.get("user"), str) else None,
    )


class _Tail:
    """Keeps the last ``limit`` bytes of a stream (errors and results come at its end)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.truncated = False

    def add(self, text: str) -> None:
        self.buf += text.encode("utf-8", "surrogatepass")
        if len(self.buf) > self.limit:
            del self.buf[: len(self.buf) - self.limit]
            self.truncated = True

    def text(self) -> str:
        data = bytes(self.buf)
        if self.truncated:
            # Do not start in the middle of a UTF-8 character.
            i = 0
            while i < len(data) and i < 4 and (data[i] & 0xC0) == 0x80:
                i += 1
            data = data[i:]
        return data.decode("utf-8", "replace")


class ExecStream:
    """Folds the NDJSON events of a streamed exec into a :class:`CommandResult`."""

    def __init__(self, keep_bytes: int = DEFAULT_STREAM_KEEP_BYTES) -> None:
        self.stdout = _Tail(keep_bytes)
        self.stderr = _Tail(keep_bytes)
        self.result: Optional[CommandResult] = None
        self.pid: Optional[int] = None
        self.process_id: Optional[str] = None
        self.user: Optional[str] = None
        self.cursor = 0
        self.lost = False

    def feed(self, line: str) -> Tuple[str, str]:
        """Returns ("stdout"|"stderr", data) for output, ("", "") otherwise; raises the
        API error an ``error`` event carries."""
        line = line.strip()
        if not line:
            return "", ""
        try:
            ev = json.loads(line)
        except ValueError:
            raise APIConnectionError("the daemon sent an exec event that is not JSON") from None
        if not isinstance(ev, dict):
            raise APIConnectionError("the daemon sent an exec event that is not an object")
        return self.feed_event(ev)

    def feed_event(self, ev: Dict[str, Any]) -> Tuple[str, str]:
        kind = ev.get("type")
        if kind in ("stdout", "stderr"):
            data = ev.get("data")
            data = data if isinstance(data, str) else ""
            (self.stdout if kind == "stdout" else self.stderr).add(data)
            self.cursor = event_end(ev, self.cursor)
            return kind, data
        if kind == "truncated":
            self.lost = True
            resume = ev.get("resumeAt")
            if isinstance(resume, int):
                self.cursor = max(self.cursor, resume)
        elif kind == "continue":
            cur = ev.get("cursor")
            if isinstance(cur, int):
                self.cursor = max(self.cursor, cur)
            pid_ = ev.get("processId")
            self.process_id = pid_ if isinstance(pid_, str) else self.process_id
        elif kind == "start":
            pid = ev.get("pid")
            self.pid = pid if isinstance(pid, int) else None
            pid_ = ev.get("processId")
            self.process_id = pid_ if isinstance(pid_, str) else None
            user = ev.get("user")
            self.user = user if isinstance(user, str) else None
        elif kind == "exit":
            code = ev.get("exitCode")
            self.result = CommandResult(
                exit_code=code if isinstance(code, int) else -1,
                stdout=self.stdout.text(),
                stderr=self.stderr.text(),
                timed_out=bool(ev.get("timedOut", False)),
                stdout_truncated=self.stdout.truncated or self.lost,
                stderr_truncated=self.stderr.truncated or self.lost,
                duration_ms=int(ev.get("durationMs") or 0),
                process_id=self.process_id,
                user=self.user,
            )
        elif kind == "error":
            err = ev.get("error")
            status = err.get("status") if isinstance(err, dict) else None
            raise error_from_response(
                status if isinstance(status, int) else 500, {"error": err}
            )
        return "", ""

    def finish(self) -> CommandResult:
        if self.result is None:
            raise APIConnectionError(
                "the exec stream ended before the command's exit was reported",
                hint="the daemon or the sandbox may have stopped; check the sandbox's state",
            )
        return self.result


class FileEntry(Dict[str, Any]):
    """One file, directory or link inside the sandbox: the API's dict (``path``, ``name``,
    ``type`` ("file", "directory", "symlink" or "other"), ``size``, ``mode`` (octal text such
    as "0644"), ``modifiedAt``, ``symlinkTarget`` for a link, and ``exists`` from ``stat``),
    the shape the published client returns. Its fields read as attributes too; ``.mode`` is
    then the permission bits as a number."""

    @property
    def path(self) -> str:
        return str(self.get("path", ""))

    @property
    def name(self) -> str:
        return str(self.get("name") or self.path.rstrip("/").rsplit("/", 1)[-1])

    @property
    def type(self) -> str:
        return str(self.get("type") or "other")

    @property
    def size(self) -> int:
        v = self.get("size")
        return v if isinstance(v, int) else 0

    @property
    def mode(self) -> int:
        v = self.get("mode")
        try:
            return int(v, 8) if isinstance(v, str) else int(v or 0)
        except ValueError:
            return 0

    @property
    def mtime(self) -> Optional[str]:
        v = self.get("modifiedAt", self.get("mtime"))
        return v if isinstance(v, str) else None

    @property
    def target(self) -> Optional[str]:
        v = self.get("symlinkTarget", self.get("target"))
        return v if isinstance(v, str) else None

    @property
    def exists(self) -> bool:
        return bool(self.get("exists", True))

    @property
    def is_dir(self) -> bool:
        return self.type == "directory"

    @property
    def is_file(self) -> bool:
        return self.type == "file"


def parse_entry(data: Any) -> FileEntry:
    if not isinstance(data, Mapping) or not isinstance(data.get("path"), str):
        raise APIConnectionError("the daemon sent a file entry without a path")
    e = FileEntry(data)
    # An older daemon's spellings, in today's shape.
    if e.get("type") == "dir":
        e["type"] = "directory"
    if isinstance(e.get("mode"), int):
        e["mode"] = format(e["mode"] & 0o7777, "04o")
    if "mtime" in e and "modifiedAt" not in e:
        e["modifiedAt"] = e["mtime"]
    if "target" in e and "symlinkTarget" not in e:
        e["symlinkTarget"] = e["target"]
    return e


class FileList(List[FileEntry]):
    """A list of entries (dicts); ``truncated`` is True when the daemon stopped at the limit."""

    truncated: bool = False


def parse_list(data: Any) -> FileList:
    out = FileList()
    entries = None
    if isinstance(data, Mapping):
        entries = data.get("data", data.get("entries"))
    for e in entries if isinstance(entries, list) else []:
        out.append(parse_entry(e))
    out.truncated = bool(data.get("truncated", False)) if isinstance(data, Mapping) else False
    return out


def build_list_params(path: str, depth: Optional[int], glob: Optional[str], hidden: Optional[bool],
                      limit: Optional[int]) -> Dict[str, Any]:
    """The query of a listing; what is None is left to the daemon."""
    params: Dict[str, Any] = {"path": path}
    if glob is not None:
        if not isinstance(glob, str) or not glob or len(glob.encode()) > 1024 or "\x00" in glob:
            raise InvalidRequestError("glob must be a pattern of 1 to 1024 bytes, e.g. '**/*.py'")
        params["glob"] = glob
    if depth is not None:
        deepest = 32 if glob is not None else 10
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= deepest:
            raise InvalidRequestError(f"depth must be an integer from 1 to {deepest}, not {depth!r}")
        params["depth"] = depth
    if hidden is not None:
        params["hidden"] = "true" if hidden else "false"
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10000:
            raise InvalidRequestError(f"limit must be an integer from 1 to 10000, not {limit!r}")
        params["limit"] = limit
    return params


@dataclass(frozen=True)
class WriteResult:
    """Where a write landed (the absolute path in the sandbox) and how many bytes it holds."""

    path: str
    size: int


def parse_write(data: Any, fallback_path: str, fallback_size: int) -> WriteResult:
    if isinstance(data, Mapping):
        size = data.get("size")
        return WriteResult(
            path=str(data.get("path") or fallback_path),
            size=size if isinstance(size, int) else fallback_size,
        )
    return WriteResult(path=fallback_path, size=fallback_size)


def encode_content(data: Union[str, bytes, bytearray, memoryview]) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise InvalidRequestError(f"data must be str or bytes, not {type(data).__name__}")


def check_depth(depth: Any) -> int:
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 10:
        raise InvalidRequestError(f"depth must be an integer from 1 to 10, not {depth!r}")
    return depth


class SandboxInfo:
    """Read-only views of the sandbox object the daemon last answered."""

    _data: Dict[str, Any]

    @property
    def data(self) -> Dict[str, Any]:
        """The sandbox object as the API last returned it (camelCase names)."""
        return dict(self._data)

    @property
    def id(self) -> str:
        return str(self._data["id"])

    @property
    def state(self) -> str:
        return str(self._data.get("state", "unknown"))

    @property
    def name(self) -> Optional[str]:
        return self._data.get("name")

    @property
    def labels(self) -> Dict[str, str]:
        return dict(self._data.get("labels") or {})

    @property
    def driver(self) -> Optional[str]:
        return self._data.get("driver")

    @property
    def image(self) -> Optional[str]:
        return self._data.get("image")

    @property
    def vcpu(self) -> Optional[int]:
        return self._data.get("vcpu")

    @property
    def memory_mib(self) -> Optional[int]:
        return self._data.get("memoryMiB")

    @property
    def disk_mib(self) -> Optional[int]:
        return self._data.get("diskMiB")

    @property
    def network(self) -> Dict[str, Any]:
        return dict(self._data.get("network") or {})

    @property
    def timeout_seconds(self) -> Optional[int]:
        return self._data.get("timeoutSeconds")

    @property
    def on_lease_end(self) -> Optional[str]:
        return self._data.get("onLeaseEnd")

    @property
    def user(self) -> Optional[str]:
        """Who commands, processes and file operations run as when they name no user:
        ``"sandbox"`` or ``"root"``."""
        return self._data.get("user")

    @property
    def created_at(self) -> Optional[str]:
        return self._data.get("createdAt")

    @property
    def lease_ends_at(self) -> Optional[str]:
        return self._data.get("leaseEndsAt")

    @property
    def cost_micros(self) -> Optional[int]:
        return self._data.get("costMicros")

    @property
    def cost_micros_per_hour(self) -> Optional[int]:
        return self._data.get("costMicrosPerHour")

    @property
    def run_seconds(self) -> Optional[int]:
        return self._data.get("runSeconds")

    @property
    def max_cost_micros(self) -> Optional[int]:
        return self._data.get("maxCostMicros")

    @property
    def max_total_cost_micros(self) -> Optional[int]:
        return self._data.get("maxTotalCostMicros")

    @property
    def failure_reason(self) -> Optional[str]:
        return self._data.get("failureReason")

    def _set_data(self, data: Any) -> None:
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise APIConnectionError("the daemon's answer is not a sandbox object")
        self._data = data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self._data.get('id')!r}, state={self.state!r})"


def is_gone(exc: APIError) -> bool:
    return exc.code == "not_found"


__all__ = [
    "CommandResult",
    "FileEntry",
    "FileList",
    "WriteResult",
]


# -- egress ------------------------------------------------------------------------------

NETWORK_PATTERNS_MAX = 256
_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
SECRET_VALUE_MAX = 8192
SECRET_HOSTS_MAX = 64


def _patterns(what: str, value: Any, limit: int) -> List[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InvalidRequestError(f"{what} must be a list of host patterns, such as ['pypi.org']")
    if len(value) > limit:
        raise InvalidRequestError(f"{what}: at most {limit} patterns")
    for v in value:
        if not isinstance(v, str) or not v or len(v) > 260:
            raise InvalidRequestError(f"{what}: each pattern is a host name of 1 to 260 characters: {v!r}")
    return list(value)


def build_network_body(internet: Optional[bool], allow: Optional[Sequence[str]],
                       deny: Optional[Sequence[str]]) -> Dict[str, Any]:
    """The ``network`` object of the API from ``network.set``'s arguments."""
    if internet is None:
        if allow is None:
            raise InvalidRequestError("say internet=True or internet=False, or give allow=[...]")
        internet = True
    if not isinstance(internet, bool):
        raise InvalidRequestError(f"internet must be True or False, not {type(internet).__name__}")
    if not internet and allow:
        raise InvalidRequestError("allow needs internet=True (with internet=False nothing leaves)")
    body: Dict[str, Any] = {"internet": internet}
    if allow is not None:
        body["allow"] = _patterns("allow", allow, NETWORK_PATTERNS_MAX)
    if deny is not None:
        body["deny"] = _patterns("deny", deny, NETWORK_PATTERNS_MAX)
    return body


def check_secret_name(name: Any) -> str:
    if not isinstance(name, str) or not _SECRET_NAME.fullmatch(name):
        raise InvalidRequestError(
            f"a secret's name is an environment variable name, [A-Za-z_][A-Za-z0-9_]{{0,63}}: {name!r}")
    return name


SECRET_HEADER_MAX = 64
SECRET_FORMAT_MAX = 256
SECRET_RULES_MAX = 16


def check_secret_value(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value.encode()) > SECRET_VALUE_MAX:
        raise InvalidRequestError(f"value must be a string of 1 to {SECRET_VALUE_MAX} bytes")
    if any(not (" " <= c <= "~") for c in value):
        raise InvalidRequestError("value goes into HTTP headers: visible ASCII and spaces only "
                                  "(no CR, LF, tab, NUL or other characters)")
    return value


def build_secret_body(value: Any, hosts: Any, header: Any = None, format: Any = None,
                      rules: Any = None) -> Dict[str, Any]:
    """The body of PUT /v1/egress-secrets/{name}. The daemon judges header names, formats and
    rules strictly; these checks only catch the plain mistakes before a request."""
    check_secret_value(value)
    hosts = _patterns("hosts", hosts, SECRET_HOSTS_MAX)
    if not hosts:
        raise InvalidRequestError("hosts: name at least one host the value may go to")
    body: Dict[str, Any] = {"value": value, "hosts": hosts}
    if header is not None:
        if not isinstance(header, str) or not header or len(header) > SECRET_HEADER_MAX \
                or any(c in header for c in " \t\r\n:"):
            raise InvalidRequestError(f"header must be a header name of 1 to {SECRET_HEADER_MAX} characters: "
                                      f"{header!r}")
        body["header"] = header
    if format is not None:
        if header is None:
            raise InvalidRequestError("format needs a header")
        if not isinstance(format, str) or format.count("{value}") != 1 or len(format) > SECRET_FORMAT_MAX \
                or any(not (" " <= c <= "~") for c in format):
            raise InvalidRequestError("format holds {value} once, in at most "
                                      f"{SECRET_FORMAT_MAX} visible ASCII characters: {format!r}")
        body["format"] = format
    if rules is not None:
        if not isinstance(rules, (list, tuple)) or not 1 <= len(rules) <= SECRET_RULES_MAX \
                or not all(isinstance(r, Mapping) and r.get("paths") for r in rules):
            raise InvalidRequestError(f"rules must be 1 to {SECRET_RULES_MAX} rules, each with paths "
                                      "(and optionally methods)")
        body["rules"] = [dict(r) for r in rules]
    return body


def secret_path(name: str) -> str:
    return f"/v1/egress-secrets/{quote(check_secret_name(name), safe='')}"


def parse_egress_log(data: Any) -> List[Dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise APIConnectionError("the daemon's answer is not an egress log")
    return [e for e in data["entries"] if isinstance(e, dict)]


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10000:
        raise InvalidRequestError("limit must be an integer from 1 to 10000")
    return limit


def pack_directory(local_path: str) -> bytes:
    """A local directory as gzip-compressed tar bytes, its contents at the archive's root."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        t.add(local_path, arcname=".")
    return buf.getvalue()


def unpack_directory(data: bytes, local_path: str) -> None:
    """Unpacks tar bytes from a sandbox into a local directory with tarfile's ``data`` filter:
    what a sandbox sends is not trusted, so absolute names, "..", links that lead out and device
    files are refused. Interpreters without the filter (before 3.9.17, 3.10.12, 3.11.4) are
    refused rather than unpacked unsafely."""
    import io
    import tarfile

    if not hasattr(tarfile, "data_filter"):
        raise InvalidRequestError("downloading a directory needs tarfile's data filter "
                                  "(Python 3.9.17, 3.10.12, 3.11.4, 3.12 or later)")
    os.makedirs(local_path, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as t:
        try:
            t.extractall(local_path, filter="data")
        except tarfile.FilterError as e:
            raise InvalidRequestError(f"refusing the archive: {e}") from e


SNAPSHOT_MODES = ("disk", "memory")
MAX_FORK_COUNT = 16


def snapshot_body(name: Optional[str], labels: Optional[Mapping[str, str]], retention_days: Optional[int],
                  mode: Optional[str]) -> Dict[str, Any]:
    """The body of ``:snapshot``, under the published client's field names."""
    if mode is not None and mode not in SNAPSHOT_MODES:
        raise InvalidRequestError("mode must be 'disk' or 'memory'")
    body = {"name": name, "labels": dict(labels) if labels is not None else None,
            "retentionDays": retention_days, "mode": mode}
    return {k: v for k, v in body.items() if v is not None}


def fork_body(count: Optional[int], name: Optional[str], labels: Optional[Mapping[str, str]],
              keep_snapshot: Optional[bool], secrets: Optional[Sequence[str]],
              mode: Optional[str] = None) -> Dict[str, Any]:
    if mode is not None and mode not in SNAPSHOT_MODES:
        raise InvalidRequestError("mode must be 'disk' or 'memory'")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or not 1 <= count <= MAX_FORK_COUNT):
        raise InvalidRequestError(f"count must be an integer from 1 to {MAX_FORK_COUNT}")
    body = {"count": count, "name": name, "labels": dict(labels) if labels is not None else None,
            "keepSnapshot": keep_snapshot, "secrets": None if secrets is None else list(secrets), "mode": mode}
    return {k: v for k, v in body.items() if v is not None}


def snapshot_path(snapshot_id: str, suffix: str = "") -> str:
    if not isinstance(snapshot_id, str) or not snapshot_id.startswith("snp_") or "/" in snapshot_id \
            or len(snapshot_id) > 64:
        raise InvalidRequestError(f"not a snapshot id: {snapshot_id!r}")
    return f"/v1/snapshots/{snapshot_id}{suffix}"


def snapshot_update_body(fields: Mapping[str, Any]) -> Dict[str, Any]:
    unknown = set(fields) - {"name", "labels", "if_labels", "retention_days"}
    if unknown:
        raise TypeError(f"unknown snapshot fields: {', '.join(sorted(unknown))}")
    names = {"name": "name", "labels": "labels", "if_labels": "ifLabels", "retention_days": "retentionDays"}
    return {names[k]: v for k, v in fields.items()}
