"""Four plain functions that give an agent a sandbox: run a command, read, write and list
files. ``FunctionTool.from_defaults(fn=f)`` takes each as it is: the type hints and the
Google-style ``Args:`` lines of the docstrings become the tool's JSON schema, with a
description for every parameter.

What they return is text written for a model: exit code, stdout, stderr, whether it timed
out; long output is cut keeping its end, with a marker saying how much was dropped. Failures
(no such file, a timeout, a stopped sandbox, an unreachable daemon) come back as text the
model can act on, never as an exception that would end the agent's run.
"""

# No "from __future__ import annotations" here: FunctionTool reads these functions' annotations
# at run time and needs real types, not strings. The "Args:" lines of the docstrings stay one
# line each: llama-index-core takes a parameter's description from its line only.

import posixpath
import shlex
from typing import Any, Awaitable, Callable, List, Optional, Union

from ._models import CommandResult, FileEntry
from .async_sandbox import AsyncSandbox
from .errors import APIConnectionError, APIError, NotFoundError
from .sandbox import Sandbox

__all__ = ["sandbox_tools", "RuntimeCodeInterpreterToolSpec"]


def __getattr__(name: str) -> Any:
    # The tool spec subclasses LlamaIndex's BaseToolSpec: import llama-index-core only when
    # it is asked for.
    if name == "RuntimeCodeInterpreterToolSpec":
        from ._interpreter_tool import RuntimeCodeInterpreterToolSpec

        return RuntimeCodeInterpreterToolSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_MAX_KEEP_BYTES = 16 * 1024 * 1024
_MIN_OUTPUT_CHARS = 200

ToolFunction = Callable[..., Union[str, Awaitable[str]]]


class _Settings:
    def __init__(self, root: str, timeout_seconds: int, max_output_chars: int) -> None:
        self.root = root
        self.timeout_seconds = timeout_seconds
        self.max_output_chars = max_output_chars
        # Commands are streamed so every character is counted; only the end is kept, a UTF-8
        # character being at most 4 bytes.
        self.keep_bytes = min(_MAX_KEEP_BYTES, max_output_chars * 4)

    def resolve(self, path: Any) -> str:
        if not isinstance(path, str) or not path.strip():
            raise ValueError("path must be a non-empty string")
        if "\x00" in path:
            raise ValueError("path contains a NUL byte")
        path = path.strip()
        full = path if path.startswith("/") else posixpath.join(self.root, path)
        return posixpath.normpath(full)

    def exec_timeout(self, requested: Any) -> "tuple[int, str]":
        """The timeout to use (never above the configured one) and a note when it was capped."""
        if requested is None or requested == "":
            return self.timeout_seconds, ""
        try:
            seconds = int(float(requested))
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"timeout_seconds must be a whole number of seconds, not {requested!r}") from None
        if seconds < 1:
            seconds = 1
        if seconds > self.timeout_seconds:
            return self.timeout_seconds, f"(timeout_seconds capped at {self.timeout_seconds})\n"
        return seconds, ""


def _cut_keep_end(text: str, limit: int, total: int) -> str:
    """The end of ``text`` within ``limit`` characters, marked with how much of the ``total``
    characters the command printed is not shown."""
    tail = text[-limit:] if len(text) > limit else text
    if len(tail) < total:
        # Start on a whole line when one begins soon enough.
        nl = tail.find("\n", 0, 200)
        if 0 <= nl < len(tail) - 1:
            tail = tail[nl + 1 :]
    dropped = total - len(tail)
    if dropped <= 0:
        return tail
    return f"[... {dropped} characters cut from the start ...]\n" + tail


def _split_budget(a: str, b: str, limit: int) -> "tuple[int, int]":
    """Share ``limit`` characters between stdout and stderr; a short one leaves the rest to
    the other."""
    if len(a) + len(b) <= limit:
        return len(a), len(b)
    half = limit // 2
    if len(a) <= half:
        return len(a), limit - len(a)
    if len(b) <= half:
        return limit - len(b), len(b)
    return half, limit - half


class _Counter:
    """Counts the characters a streamed command printed, so the marker can say exactly how
    much was cut even though only the end is kept."""

    def __init__(self) -> None:
        self.stdout = 0
        self.stderr = 0

    def out(self, data: str) -> None:
        self.stdout += len(data)

    def err(self, data: str) -> None:
        self.stderr += len(data)


def _format_exec(r: CommandResult, seen: _Counter, timeout: int, limit: int, note: str) -> str:
    out_budget, err_budget = _split_budget(r.stdout, r.stderr, limit)

    def section(name: str, text: str, budget: int, total: int) -> str:
        if not text:
            return f"{name}: (empty)\n"
        body = _cut_keep_end(text, budget, max(total, len(text)))
        if not body.endswith("\n"):
            body += "\n"
        return f"{name}:\n{body}"

    head = note
    if r.timed_out:
        head += (
            f"timed out: yes, the command was killed after {timeout} s (exit code {r.exit_code}). "
            "Split the work into shorter steps or run it in the background.\n"
        )
    else:
        head += f"exit code: {r.exit_code}\n"
    return (
        head
        + section("stdout", r.stdout, out_budget, seen.stdout)
        + section("stderr", r.stderr, err_budget, seen.stderr)
    ).rstrip("\n")


def _format_error(exc: BaseException, what: str) -> str:
    if isinstance(exc, NotFoundError):
        return f"error: {what}: not found ({exc.message})"
    if isinstance(exc, APIConnectionError):
        return f"error: {what}: the sandbox service could not be reached ({exc.message}). Retrying later may help."
    if isinstance(exc, APIError):
        text = f"error: {what}: {exc.message} ({exc.code})"
        if exc.code == "conflict" and "running" in exc.message.lower():
            text += ". The sandbox is not running, so no command or file operation can work in it; tell the user."
        elif exc.hint:
            text += f". Hint: {exc.hint}"
        return text
    return f"error: {what}: {exc}"


def _format_file(path: str, data: bytes, size: int, limit: int) -> str:
    if not data:
        return f"({path} is empty)"
    if b"\x00" in data[:8192]:
        return (
            f"({path} is a binary file of {size} bytes, not shown. Inspect it with runtime_exec, "
            f"e.g. `file {shlex.quote(path)}` or `xxd {shlex.quote(path)} | head`.)"
        )
    text = data.decode("utf-8", "replace")
    shown_all = len(data) >= size
    if len(text) <= limit and shown_all:
        return text
    text = text[:limit]
    next_byte = len(text.encode("utf-8")) + 1
    return (
        text
        + f"\n[... {path} has {size} bytes; only the first {len(text)} characters are shown. "
        f"Read further with runtime_exec, e.g. `tail -c +{next_byte} {shlex.quote(path)} | head -c {limit}`. ...]"
    )


def _format_list(path: str, entries: List[FileEntry], truncated: bool, depth: int, limit: int) -> str:
    if not entries:
        return f"{path} is empty"
    lines = [f"{path} (depth {depth}, {len(entries)} entries{', more not listed' if truncated else ''}):"]
    used = len(lines[0])
    prefix = path.rstrip("/") + "/"
    for i, e in enumerate(sorted(entries, key=lambda x: x.path)):
        rel = e.path[len(prefix):] if e.path.startswith(prefix) else e.path
        if e.is_dir:
            line = f"dir   {rel}/"
        elif e.type == "symlink":
            line = f"link  {rel} -> {e.target or '?'}"
        elif e.type == "file":
            line = f"file  {rel}  ({e.size} bytes)"
        else:
            line = f"other {rel}"
        if used + len(line) + 1 > limit:
            lines.append(f"[... {len(entries) - i} more entries not shown; list a subdirectory ...]")
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines)


def _docs(s: _Settings) -> "dict[str, str]":
    return {
        "exec": f"""Run a shell command in the sandbox (a throwaway Linux machine with bash, python3 and
pip) and return its exit code, stdout and stderr.

The command runs under bash -c inside the sandbox, in {s.root} unless cwd says otherwise.
Files written there stay for the life of the sandbox. Long output is cut, keeping its end.

Args:
    command (str): The shell command to run, for example "python3 analysis.py" or "ls -la".
    cwd (Optional[str]): Directory to run in; a relative path is taken under {s.root}. Defaults to {s.root}.
    timeout_seconds (Optional[int]): Seconds before the command is killed, at most {s.timeout_seconds}. Defaults to {s.timeout_seconds}.
""",
        "read": f"""Read a text file from the sandbox and return its content.

Long files are cut, keeping their start; binary files are described, not shown.

Args:
    path (str): Path of the file; a relative path is taken under {s.root}.
""",
        "write": f"""Write a text file in the sandbox, replacing it if it exists and making missing parent directories.

Args:
    path (str): Path of the file; a relative path is taken under {s.root}.
    content (str): The full text to write into the file.
""",
        "list": f"""List the files and directories under a directory of the sandbox, with their sizes.

Args:
    path (str): Directory to list; a relative path is taken under {s.root}. Defaults to {s.root} itself.
    depth (int): How many levels to descend, from 1 (only the directory's own entries) to 10.
""",
    }


def _clamp_depth(depth: Any) -> int:
    try:
        d = int(depth)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"depth must be a whole number from 1 to 10, not {depth!r}") from None
    return min(10, max(1, d))


def _read_head_command(path: str, limit_bytes: int) -> "list[str]":
    return ["head", "-c", str(limit_bytes), "--", path]


def _sync_tools(sbx: Sandbox, s: _Settings) -> List[ToolFunction]:
    docs = _docs(s)

    def runtime_exec(command: str, cwd: Optional[str] = None, timeout_seconds: Optional[int] = None) -> str:
        try:
            if not isinstance(command, str) or not command.strip():
                return "error: command must be a non-empty string"
            timeout, note = s.exec_timeout(timeout_seconds)
            where = s.resolve(cwd) if cwd else s.root
            seen = _Counter()
            r = sbx.exec(command, cwd=where, timeout_seconds=timeout, on_stdout=seen.out, on_stderr=seen.err,
                         max_output_bytes=s.keep_bytes)
            return _format_exec(r, seen, timeout, s.max_output_chars, note)
        except Exception as e:  # noqa: BLE001 - the model gets the failure as text
            return _format_error(e, "running the command")

    def runtime_read_file(path: str) -> str:
        try:
            full = s.resolve(path)
            st = sbx.files.stat(full)
            if not st.exists:
                return f"error: reading {path!r}: not found ({full} does not exist)"
            if st.is_dir:
                return f"error: {full} is a directory; list it with runtime_list_files"
            limit_bytes = s.max_output_chars * 4
            if st.size > limit_bytes:
                r = sbx.exec(_read_head_command(full, limit_bytes), timeout_seconds=60,
                             max_output_bytes=limit_bytes)
                if r.exit_code != 0:
                    return f"error: reading {full}: {r.stderr.strip() or 'exit code ' + str(r.exit_code)}"
                data = r.stdout.encode("utf-8")
            else:
                data = sbx.files.read(full)
            return _format_file(full, data, max(st.size, len(data)), s.max_output_chars)
        except Exception as e:  # noqa: BLE001
            return _format_error(e, f"reading {path!r}")

    def runtime_write_file(path: str, content: str) -> str:
        try:
            full = s.resolve(path)
            if not isinstance(content, str):
                return "error: content must be a string"
            w = sbx.files.write(full, content)
            return f"wrote {w.size} bytes to {w.path}"
        except Exception as e:  # noqa: BLE001
            return _format_error(e, f"writing {path!r}")

    def runtime_list_files(path: str = ".", depth: int = 1) -> str:
        try:
            full = s.resolve(path or ".")
            d = _clamp_depth(depth)
            entries = sbx.files.list(full, depth=d)
            return _format_list(full, entries, entries.truncated, d, s.max_output_chars)
        except Exception as e:  # noqa: BLE001
            return _format_error(e, f"listing {path!r}")

    runtime_exec.__doc__ = docs["exec"]
    runtime_read_file.__doc__ = docs["read"]
    runtime_write_file.__doc__ = docs["write"]
    runtime_list_files.__doc__ = docs["list"]
    return [runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files]


def _async_tools(sbx: AsyncSandbox, s: _Settings) -> List[ToolFunction]:
    docs = _docs(s)

    async def runtime_exec(command: str, cwd: Optional[str] = None, timeout_seconds: Optional[int] = None) -> str:
        try:
            if not isinstance(command, str) or not command.strip():
                return "error: command must be a non-empty string"
            timeout, note = s.exec_timeout(timeout_seconds)
            where = s.resolve(cwd) if cwd else s.root
            seen = _Counter()
            r = await sbx.exec(command, cwd=where, timeout_seconds=timeout, on_stdout=seen.out,
                               on_stderr=seen.err, max_output_bytes=s.keep_bytes)
            return _format_exec(r, seen, timeout, s.max_output_chars, note)
        except Exception as e:  # noqa: BLE001
            return _format_error(e, "running the command")

    async def runtime_read_file(path: str) -> str:
        try:
            full = s.resolve(path)
            st = await sbx.files.stat(full)
            if not st.exists:
                return f"error: reading {path!r}: not found ({full} does not exist)"
            if st.is_dir:
                return f"error: {full} is a directory; list it with runtime_list_files"
            limit_bytes = s.max_output_chars * 4
            if st.size > limit_bytes:
                r = await sbx.exec(_read_head_command(full, limit_bytes), timeout_seconds=60,
                                   max_output_bytes=limit_bytes)
                if r.exit_code != 0:
                    return f"error: reading {full}: {r.stderr.strip() or 'exit code ' + str(r.exit_code)}"
                data = r.stdout.encode("utf-8")
            else:
                data = await sbx.files.read(full)
            return _format_file(full, data, max(st.size, len(data)), s.max_output_chars)
        except Exception as e:  # noqa: BLE001
            return _format_error(e, f"reading {path!r}")

    async def runtime_write_file(path: str, content: str) -> str:
        try:
            full = s.resolve(path)
            if not isinstance(content, str):
                return "error: content must be a string"
            w = await sbx.files.write(full, content)
            return f"wrote {w.size} bytes to {w.path}"
        except Exception as e:  # noqa: BLE001
            return _format_error(e, f"writing {path!r}")

    async def runtime_list_files(path: str = ".", depth: int = 1) -> str:
        try:
            full = s.resolve(path or ".")
            d = _clamp_depth(depth)
            entries = await sbx.files.list(full, depth=d)
            return _format_list(full, entries, entries.truncated, d, s.max_output_chars)
        except Exception as e:  # noqa: BLE001
            return _format_error(e, f"listing {path!r}")

    runtime_exec.__doc__ = docs["exec"]
    runtime_read_file.__doc__ = docs["read"]
    runtime_write_file.__doc__ = docs["write"]
    runtime_list_files.__doc__ = docs["list"]
    return [runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files]


def sandbox_tools(
    sbx: Union[Sandbox, AsyncSandbox],
    *,
    root: str = "/workspace",
    timeout_seconds: int = 300,
    max_output_chars: int = 20000,
) -> List[ToolFunction]:
    """The four tool functions for one sandbox, in this order: ``runtime_exec``,
    ``runtime_read_file``, ``runtime_write_file``, ``runtime_list_files``.

    Given an :class:`AsyncSandbox` they are coroutine functions. ``root`` is where relative
    paths resolve; ``timeout_seconds`` is the default and the most a model may ask for one
    command; ``max_output_chars`` bounds the text one call returns.
    """
    if not isinstance(root, str) or not root.startswith("/"):
        raise ValueError(f"root must be an absolute path, not {root!r}")
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not is_int(timeout_seconds) or not 1 <= timeout_seconds <= 86400:
        raise ValueError(f"timeout_seconds must be an integer from 1 to 86400, not {timeout_seconds!r}")
    if not is_int(max_output_chars) or max_output_chars < _MIN_OUTPUT_CHARS:
        raise ValueError(f"max_output_chars must be an integer of at least {_MIN_OUTPUT_CHARS}")
    settings = _Settings(posixpath.normpath(root), timeout_seconds, max_output_chars)
    if isinstance(sbx, AsyncSandbox):
        return _async_tools(sbx, settings)
    if isinstance(sbx, Sandbox):
        return _sync_tools(sbx, settings)
    raise TypeError(f"sandbox_tools() needs a Sandbox or an AsyncSandbox, not {type(sbx).__name__}")
