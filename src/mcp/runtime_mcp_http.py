# The catalog's "http" MCP server (docs/mcp.md, "The catalog"), run by a
# sandbox's MCP gateway as `python3 -c PROGRAM` on the gateway's own Python,
# whose venv holds the MCP SDK. One tool, fetch: an HTTP request through the
# sandbox's egress policy. With HTTP_BEARER_TOKEN mapped to an egress secret
# at the start, the request carries `Authorization: Bearer` and the secret's
# placeholder, which the egress proxy replaces with the value for the
# secret's hosts alone: the value itself never enters the sandbox.
import os
import urllib.error
import urllib.request

from mcp.server.fastmcp import FastMCP

BODY_MAX = 256 * 1024
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")

app = FastMCP("http")


@app.tool()
def fetch(url: str, method: str = "GET", body: str | None = None, content_type: str = "application/json") -> str:
    """Sends one HTTP request and answers its status and up to 256 KiB of its body as text. The
    request goes through the sandbox's egress policy; with a token configured it carries it as
    Authorization: Bearer."""
    method = method.upper()
    if method not in METHODS:
        raise ValueError("method must be one of " + ", ".join(METHODS))
    if not url.startswith(("http://", "https://")):
        raise ValueError("url must be http:// or https://")
    data = body.encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    token = os.environ.get("HTTP_BEARER_TOKEN")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, got = resp.status, resp.read(BODY_MAX + 1)
    except urllib.error.HTTPError as e:
        status, got = e.code, e.read(BODY_MAX + 1)
    text = got[:BODY_MAX].decode("utf-8", "replace")
    return "HTTP %d\n\n%s%s" % (status, text, "\n[cut at 256 KiB]" if len(got) > BODY_MAX else "")


app.run()
