"""RuntimeCodeInterpreterToolSpec: LlamaIndex's CodeInterpreterToolSpec, run in a sandbox.

Imported from :mod:`withruntime.tools` on first use, so that the SDK needs llama-index-core
only when this class is used.
"""

import base64
import os
import tempfile
from typing import Any, Dict, List, Optional

from llama_index.core.tools.tool_spec.base import BaseToolSpec

from .errors import APIConnectionError, APIError
from .interpreter import TABLE_MIME
from .sandbox import Sandbox

_DEFAULT_MAX_CHARS = 20_000


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]


def _table_text(table: Dict[str, Any], limit: int = 30) -> str:
    cols = table.get("columns") or []
    rows = (table.get("rows") or [])[:limit]
    lines = ["\t".join(str(c) for c in cols)]
    lines += ["\t".join("" if v is None else str(v) for v in row) for row in rows]
    total = table.get("totalRows", len(rows))
    if total > len(rows):
        lines.append(f"[{total} rows, {len(rows)} shown]")
    return "\n".join(lines)


class RuntimeCodeInterpreterToolSpec(BaseToolSpec):
    """A stateful Python interpreter in a Runtime sandbox, for a LlamaIndex agent.

    A drop-in for ``llama_index.tools.code_interpreter.CodeInterpreterToolSpec``: the same
    tool, ``code_interpreter(code)``, but the code runs in a sandbox instead of on the host,
    and variables persist between calls as in a notebook. Charts (matplotlib figures) are
    written as PNG files to ``image_dir`` on the host: their paths are in ``images`` and in
    the text the model reads. DataFrames come back as a tab-separated table.

    Pass a :class:`~withruntime.Sandbox`, or let the spec create one (``image="analysis"``
    has numpy, pandas and matplotlib) and delete it on :meth:`close`.
    """

    spec_functions = ["code_interpreter"]

    def __init__(self, sandbox: Optional[Sandbox] = None, *, context: Optional[str] = None,
                 timeout_seconds: int = 120, image_dir: Optional[str] = None,
                 max_output_chars: int = _DEFAULT_MAX_CHARS, **create_fields: Any) -> None:
        self._owned = sandbox is None
        self.sandbox = sandbox if sandbox is not None else Sandbox.create(**create_fields)
        self.context = context
        self.timeout_ms = int(timeout_seconds) * 1000
        self.image_dir = image_dir or tempfile.mkdtemp(prefix="runtime-charts-")
        self.max_output_chars = max_output_chars
        #: Host paths of every chart saved so far, oldest first.
        self.images: List[str] = []

    def code_interpreter(self, code: str) -> str:
        """Run Python code in a sandboxed, stateful interpreter and return its output.

        Variables, imports and loaded data persist between calls, like cells of a notebook.
        The value of the last expression is shown; matplotlib charts are saved as PNG files.

        Args:
            code (str): The Python code to run.
        """
        try:
            ex = self.sandbox.interpreter.run(code, context=self.context, timeout_ms=self.timeout_ms)
        except APIConnectionError as e:
            return f"error: the sandbox could not be reached: {e.message}"
        except APIError as e:
            return f"error: {e.code}: {e.message}" + (f" ({e.hint})" if e.hint else "")
        parts: List[str] = []
        if ex.get("stdout"):
            parts.append("stdout:\n" + ex["stdout"])
        if ex.get("stderr"):
            parts.append("stderr:\n" + ex["stderr"])
        for result in ex.get("results") or []:
            parts.append(self._describe(result))
        err = ex.get("error")
        if err:
            parts.append(f"error ({ex.get('status')}): {err['name']}: {err['value']}\n{err.get('traceback') or ''}")
        if not parts:
            parts.append("(no output)")
        return _cut("\n".join(p.rstrip("\n") for p in parts), self.max_output_chars)

    def _describe(self, result: Dict[str, Any]) -> str:
        data, refs = result.get("data") or {}, result.get("refs") or {}
        png: Optional[bytes] = None
        if "image/png" in data:
            png = base64.b64decode(data["image/png"])
        elif "image/png" in refs:
            png = self.sandbox.interpreter.result(refs["image/png"])
        if png is not None:
            path = os.path.join(self.image_dir, f"chart-{len(self.images) + 1}.png")
            with open(path, "wb") as f:
                f.write(png)
            self.images.append(path)
            return f"[chart saved to {path}]"
        if TABLE_MIME in data:
            return "table:\n" + _table_text(data[TABLE_MIME])
        if "text/plain" in data:
            return ("result:\n" if result.get("main") else "") + data["text/plain"]
        return "[a result of type " + ", ".join(sorted(set(data) | set(refs))) + "]"

    def close(self) -> None:
        """Delete the sandbox if this spec created it."""
        if self._owned:
            self.sandbox.delete()
            self.sandbox.close()
