"""Where the daemon is and which key to use: arguments, then the environment, then the
daemon's own admin key file on this machine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .errors import ConfigurationError

if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_BASE_URL = "http://127.0.0.1:7878"
# Keys are "rt_" + 40 hex characters; anything much longer in a key file is not a key.
_MAX_KEY_FILE_BYTES = 4096


@dataclass(frozen=True)
class Endpoint:
    """A resolved daemon address.

    ``url`` is the HTTP base URL requests go to; ``uds`` the unix socket path when the daemon
    listens on one (the URL's host is then only a placeholder); ``display`` is what error
    messages show.
    """

    url: str
    uds: Optional[str]
    display: str


def resolve_endpoint(base_url: Optional[str] = None) -> Endpoint:
    raw = base_url if base_url is not None else os.environ.get("RUNTIME_BASE_URL", "")
    raw = raw.strip() or DEFAULT_BASE_URL
    if raw.startswith("unix:"):
        path = raw[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ConfigurationError(
                f"RUNTIME_BASE_URL {raw!r} names no socket path",
                hint="use unix:/path/to/runtimed.sock",
            )
        return Endpoint(url="http://runtimed", uds=path, display=f"unix:{path}")
    if not (raw.startswith("http://") or raw.startswith("https://")):
        raise ConfigurationError(
            f"base URL {raw!r} is neither http(s):// nor unix:",
            hint=f"for example {DEFAULT_BASE_URL} or unix:/run/runtime/runtimed.sock",
        )
    return Endpoint(url=raw.rstrip("/"), uds=None, display=raw.rstrip("/"))


def _state_dir() -> str:
    # os.path rather than pathlib: the key file is found on the first call, and pathlib's
    # import costs more than the rest of this module.
    env = os.environ.get("RUNTIME_STATE_DIR")
    if env:
        return env
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "/var/lib/runtime"
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return os.path.join(xdg, "runtime")
    return os.path.join(os.path.expanduser("~"), ".local", "state", "runtime")


def default_state_dir() -> Path:
    from pathlib import Path

    return Path(_state_dir())


def resolve_api_key(api_key: Optional[str] = None) -> str:
    if api_key:
        return api_key
    env = os.environ.get("RUNTIME_API_KEY", "").strip()
    if env:
        return env
    key_file = os.path.join(_state_dir(), "admin.key")
    try:
        with open(key_file, "rb") as f:
            data = f.read(_MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigurationError(
            f"no API key: RUNTIME_API_KEY is not set and {key_file} does not exist",
            hint="export RUNTIME_API_KEY=rt_... (the daemon writes its admin key to "
            "<state-dir>/admin.key on first start), or set RUNTIME_STATE_DIR",
        ) from None
    except PermissionError:
        raise ConfigurationError(
            f"no API key: RUNTIME_API_KEY is not set and {key_file} is not readable by this user",
            hint="export RUNTIME_API_KEY=rt_..., or run as the daemon's user",
        ) from None
    except OSError as e:
        raise ConfigurationError(
            f"no API key: RUNTIME_API_KEY is not set and {key_file} could not be read ({e.strerror})",
            hint="export RUNTIME_API_KEY=rt_...",
        ) from None
    key = data.decode("utf-8", "replace").strip()
    if not key or len(data) > _MAX_KEY_FILE_BYTES or any(c.isspace() for c in key):
        raise ConfigurationError(
            f"{key_file} does not hold an API key",
            hint="export RUNTIME_API_KEY=rt_...",
        )
    return key
