#!/usr/bin/env python3
"""A scripted OpenAI-compatible chat-completions server for tests and offline examples.

It listens on 127.0.0.1 only and speaks POST /v1/chat/completions in both forms the OpenAI
clients use: a JSON answer, and with "stream": true server-sent events carrying
``delta.content`` / ``delta.tool_calls`` chunks and ending with ``data: [DONE]``.

It plays a script instead of thinking. A script is a list of turns:

    {"turns": [
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "echo hi"}}]},
        {"content": "The command printed: {tool_output}"}
    ]}

The turn played is the number of tool-calling assistant messages after the last user message
in the request, so one script answers a whole agent run, and a new user message starts it
over. In ``content`` (and in string arguments), ``{tool_output}`` is replaced by the content of
the last tool message in the request, ``{tool_outputs}`` by all of them since the last user
message, and ``{tool_stdout}`` by the stdout section of the last tool message when it is a
``runtime_exec`` result (the whole message otherwise), so a final answer quotes what the tools
really returned.

Control routes (for tests): POST /_script loads a new script (the body), GET /_requests
returns the chat requests received so far, POST /_reset forgets them.

Run it: ``scripted_openai.py [--port 0] [--script FILE]``; it prints
``listening http://127.0.0.1:PORT/v1`` on stdout once ready. Or from Python:
``with ScriptedOpenAI(script) as llm_server: OpenAI(api_base=llm_server.base_url, ...)``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

MAX_BODY = 16 * 1024 * 1024
MODEL = "gpt-4o-mini"
DEFAULT_SCRIPT: Dict[str, Any] = {
    "turns": [
        {"tool_calls": [{"name": "runtime_exec", "arguments": {"command": "echo hello from the sandbox"}}]},
        {"content": "The sandbox answered:\n{tool_output}"},
    ]
}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, str):
                parts.append(p)
        return "".join(parts)
    return ""


def _stdout_of(text: str) -> str:
    """The stdout section of a runtime_exec result: our tools' "exit code: N\nstdout:\n...\nstderr:...",
    or the published client's dict ({'exit_code': N, 'stdout': ..., ...}, as JSON or Python repr)."""
    if text.startswith("{"):
        import ast
        import json

        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(text)
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, dict) and isinstance(value.get("stdout"), str):
                return value["stdout"].strip("\n")
    start = text.find("stdout:\n")
    if start < 0:
        return text
    body = text[start + len("stdout:\n") :]
    end = body.rfind("\nstderr:")
    return (body[:end] if end >= 0 else body).strip("\n")


def _substitute(value: Any, last: str, alltools: str) -> Any:
    if isinstance(value, str):
        return (
            value.replace("{tool_outputs}", alltools)
            .replace("{tool_output}", last)
            .replace("{tool_stdout}", _stdout_of(last))
        )
    if isinstance(value, list):
        return [_substitute(v, last, alltools) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, last, alltools) for k, v in value.items()}
    return value


class Script:
    def __init__(self, script: Dict[str, Any]) -> None:
        turns = script.get("turns")
        if not isinstance(turns, list) or not turns:
            raise ValueError("a script needs a non-empty list of turns")
        for t in turns:
            if not isinstance(t, dict) or not ("content" in t or "tool_calls" in t):
                raise ValueError("each turn needs content or tool_calls")
        self.turns = turns

    def answer(self, messages: List[Dict[str, Any]]) -> Dict[str, Any]:
        """The turn for this conversation, placeholders filled in."""
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        after = messages[last_user + 1 :]
        done = sum(1 for m in after if m.get("role") == "assistant" and m.get("tool_calls"))
        tools = [_text_of(m.get("content")) for m in after if m.get("role") == "tool"]
        turn = self.turns[min(done, len(self.turns) - 1)]
        if done >= len(self.turns) and "tool_calls" in turn:
            # Out of script: never loop an agent on tool calls forever.
            turn = {"content": "(the script has no more turns) {tool_output}"}
        return _substitute(turn, tools[-1] if tools else "", "\n".join(tools))


class State:
    def __init__(self, script: Dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self.script = Script(script)
        self.requests: List[Dict[str, Any]] = []
        self.counter = 0

    def next_id(self) -> int:
        with self.lock:
            self.counter += 1
            return self.counter


def _tool_calls(turn: Dict[str, Any], base: int) -> List[Dict[str, Any]]:
    calls = []
    for i, c in enumerate(turn.get("tool_calls") or []):
        args = c.get("arguments", {})
        calls.append(
            {
                "id": c.get("id") or f"call_{base}_{i}",
                "type": "function",
                "function": {
                    "name": c["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    return calls


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scripted-openai/1"
    state: State

    def log_message(self, fmt: str, *args: Any) -> None:  # keep test output clean
        pass

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > MAX_BODY:
            raise ValueError("body too large")
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw or b"null")

    def _send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send_json(status, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self) -> None:
        if self.path == "/_requests":
            with self.state.lock:
                reqs = list(self.state.requests)
            self._send_json(200, {"requests": reqs})
        elif self.path in ("/v1/models", "/models"):
            self._send_json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "test"}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        try:
            body = self._read_json()
        except ValueError as e:
            self._error(400, f"bad body: {e}")
            return
        if self.path == "/_script":
            try:
                script = Script(body)
            except (ValueError, AttributeError) as e:
                self._error(400, str(e))
                return
            with self.state.lock:
                self.state.script = script
            self._send_json(200, {"ok": True})
        elif self.path == "/_reset":
            with self.state.lock:
                self.state.requests.clear()
            self._send_json(200, {"ok": True})
        elif self.path in ("/v1/chat/completions", "/chat/completions"):
            self._chat(body)
        else:
            self._error(404, f"no route {self.path}")

    def _chat(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._error(400, "messages is required")
            return
        if self.headers.get("Authorization", "") == "":
            self._error(401, "no API key")
            return
        with self.state.lock:
            self.state.requests.append(body)
            script = self.state.script
        turn = script.answer(body["messages"])
        n = self.state.next_id()
        model = body.get("model") or MODEL
        created = int(time.time())
        calls = _tool_calls(turn, n)
        content: Optional[str] = turn.get("content") if not calls else turn.get("content") or None
        finish = "tool_calls" if calls else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not body.get("stream"):
            message: Dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            self._send_json(
                200,
                {
                    "id": f"chatcmpl-{n}",
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": usage,
                },
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(delta: Dict[str, Any], finish_reason: Optional[str] = None) -> None:
            self._event(
                {
                    "id": f"chatcmpl-{n}",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
                }
            )

        chunk({"role": "assistant", "content": "" if not calls else None})
        if content:
            # Several pieces, as a real model streams them.
            step = max(1, len(content) // 4)
            for i in range(0, len(content), step):
                chunk({"content": content[i : i + step]})
        for idx, c in enumerate(calls):
            chunk({"tool_calls": [{"index": idx, "id": c["id"], "type": "function",
                                   "function": {"name": c["function"]["name"], "arguments": ""}}]})
            args = c["function"]["arguments"]
            half = len(args) // 2
            for piece in (args[:half], args[half:]):
                if piece:
                    chunk({"tool_calls": [{"index": idx, "function": {"arguments": piece}}]})
        chunk({}, finish)
        opts = body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage"):
            self._event({"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": created,
                         "model": model, "choices": [], "usage": usage})
        self._raw(b"data: [DONE]\n\n")
        self._raw(b"")

    def _event(self, obj: Dict[str, Any]) -> None:
        self._raw(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _raw(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def make_server(script: Dict[str, Any], port: int = 0) -> ThreadingHTTPServer:
    state = State(script)
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


class ScriptedOpenAI:
    """Runs this file as its own process and talks to it over HTTP.

    ``base_url`` is what ``OpenAI(api_base=...)`` wants; ``set_script`` loads another script;
    ``requests()`` returns the chat requests received.
    """

    def __init__(self, script: Optional[Dict[str, Any]] = None) -> None:
        self.script = script or DEFAULT_SCRIPT
        self.proc: Optional[subprocess.Popen] = None
        self.root = ""

    def start(self) -> "ScriptedOpenAI":
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--port", "0", "--script-json", json.dumps(self.script)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"scripted OpenAI server did not start: {line!r}")
        self.root = line.split(" ", 1)[1].rsplit("/v1", 1)[0]
        return self

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.root + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def set_script(self, script: Dict[str, Any]) -> None:
        self._call("POST", "/_script", script)

    def requests(self) -> List[Dict[str, Any]]:
        return self._call("GET", "/_requests")["requests"]

    def reset(self) -> None:
        self._call("POST", "/_reset", {})

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None

    def __enter__(self) -> "ScriptedOpenAI":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one)")
    ap.add_argument("--script", help="JSON script file")
    ap.add_argument("--script-json", help="JSON script given inline")
    args = ap.parse_args(argv)
    script = DEFAULT_SCRIPT
    if args.script:
        with open(args.script, encoding="utf-8") as f:
            script = json.load(f)
    elif args.script_json:
        script = json.loads(args.script_json)
    server = make_server(script, args.port)
    host, port = server.server_address[:2]
    print(f"listening http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
