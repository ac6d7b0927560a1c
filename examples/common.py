"""What the examples share: the model they talk to, and finding the SDK in a checkout.

With OPENAI_API_KEY set the examples use OpenAI (model from OPENAI_MODEL, default
gpt-4o-mini). Without it they start the repository's scripted OpenAI-compatible server
(tests/llm/scripted_openai.py) on 127.0.0.1, which plays the tool calls a model would make,
so the whole path, agent -> tool call -> sandbox -> answer, runs with no account anywhere.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent

try:
    import withruntime  # noqa: F401
except ImportError:  # running from a checkout without `pip install ./sdk/python`
    sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))


def make_llm(script: Dict[str, Any]) -> Tuple[Any, Callable[[], None], Optional[Any]]:
    """Returns (llm, stop, scripted_server): ``stop()`` shuts the scripted server down (a no-op
    for OpenAI); ``scripted_server`` is None when a real model answers."""
    from llama_index.llms.openai import OpenAI

    if os.environ.get("OPENAI_API_KEY"):
        model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
        print(f"model: OpenAI {model}")
        return OpenAI(model=model), lambda: None, None
    sys.path.insert(0, str(REPO / "tests" / "llm"))
    from scripted_openai import ScriptedOpenAI

    server = ScriptedOpenAI(script).start()
    print(f"model: scripted OpenAI-compatible server at {server.base_url} (set OPENAI_API_KEY for a real one)")
    llm = OpenAI(api_base=server.base_url, api_key="scripted", model="gpt-4o-mini")
    return llm, server.stop, server
