"""The examples in examples/ run as written, as a newcomer would run them: no OpenAI key, so
they start the scripted model themselves, against the real daemon; with our SDK, and with the
published withruntime client (its own venv, RUNTIME_API_URL), as `pip install withruntime` gives."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

pytest.importorskip("llama_index.core")
pytest.importorskip("llama_index.llms.openai")


@pytest.fixture(params=["ours", "published"])
def client(request):
    """Which withruntime the examples import: ours from the checkout, or the published client's
    venv (None: ours)."""
    return request.getfixturevalue("published_client") if request.param == "published" else None


def run_example(daemon, client, name: str, *args: str, **extra_env: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(daemon.env())
    env.update(extra_env)
    if client is None:
        python = sys.executable
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "sdk" / "python" / "src"), env.get("PYTHONPATH", "")])
    else:
        # The example imports whatever withruntime its interpreter has: the published one.
        python = str(client.python)
        env.pop("PYTHONPATH", None)
        env["RUNTIME_API_URL"] = daemon.base_url
    r = subprocess.run([python, str(EXAMPLES / name), *args], env=env, capture_output=True, text=True,
                       timeout=300, cwd=str(REPO))
    assert r.returncode == 0, f"{name} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_coder_example(daemon, client):
    out = run_example(daemon, client, "coder.py")
    assert "scripted OpenAI-compatible server" in out
    assert "tool call: runtime_write_file" in out and "tool call: runtime_exec {'command': 'python3 primes.py'}" in out
    assert "answer: primes.py ran in the sandbox and printed: 9592 99991" in out


def test_stream_events_example(daemon, client):
    out = run_example(daemon, client, "stream_events.py")
    assert "runtime_exec {'command': 'uname -sr; python3 --version'}" in out
    # Each client's tool reports the result its own way.
    assert ("exit code: 0" if client is None else "'exit_code': 0") in out
    answer = out.split("answer: ", 1)[1]
    assert "Linux" in answer and "Python 3." in answer


def test_analyst_example(daemon, client):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import analyst  # the example's own CSV generator, to know the expected figure
    finally:
        sys.path.remove(str(EXAMPLES))
    import csv
    import io

    total = 0.0
    for row in csv.DictReader(io.StringIO(analyst.make_csv(seed=11))):
        if row["status"] != "returned":
            total += int(row["units"]) * float(row["unit_price"])
    expected = f"{total:.2f}"
    out = run_example(daemon, client, "analyst.py", ANALYST_SEED="11")
    assert "sales_notes {'input':" in out and "runtime_exec {'command':" in out
    assert f"answer: Total revenue, returns excluded: {expected} EUR" in out
    assert f"/workspace/result.txt: {expected}" in out


def test_interpreter_agent_example(daemon, analysis_image, tmp_path):
    """Ours only: RuntimeCodeInterpreterToolSpec is this SDK's (the published client has none)."""
    chart = tmp_path / "units.png"
    out = run_example(daemon, None, "interpreter_agent.py", "--out", str(chart))
    # Three turns on one context: the DataFrame the first loaded serves the other two.
    assert out.count("user: ") == 3, out
    assert "18" in out.split("agent: ", 2)[1], out  # 6 months x 3 regions
    second = out.split("agent: ")[2]
    assert "region" in second and "NameError" not in out, out
    data = chart.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, data[:16]
    assert f"chart written to {chart}" in out
