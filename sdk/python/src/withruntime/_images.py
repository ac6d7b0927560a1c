"""``runtime.images``: images built from a Dockerfile with a context folder or inline files, or from
a recipe (docs/images.md), under the published client's names: ``upload_context``, ``create``,
``build`` (with ``on_log``), ``get``, ``resolve``, ``logs``, ``list``, ``versions``, ``tag``,
``untag`` and ``delete``. The
bodies are generators of calls (see _drive.py); sandbox.py and async_sandbox.py make them
blocking and awaitable, and say which sleep they use."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Union
from urllib.parse import quote

from ._drive import Call
from .errors import APIError, InvalidRequestError

__all__ = ["ImagesOps", "RegistriesOps", "pack_context", "inline_files", "CHUNK_BYTES"]

CHUNK_BYTES = 1024 * 1024
# The daemon's bounds on a context (docs/images.md): checked here first, so that a folder too big
# is said before anything is sent.
CONTEXT_BYTES = 100 * 1024 * 1024
CONTEXT_FILES = 20000
Files = Union[List[Dict[str, Any]], Dict[str, Union[str, bytes]]]


def inline_files(files: Files) -> List[Dict[str, Any]]:
    """Inline files as the wire takes them: a list of ``{path, content, encoding?, mode?}`` as it
    is, or ``{path: text or bytes}`` with bytes in base64 (the published client's form)."""
    if isinstance(files, list):
        return files
    return [{"path": path, "content": base64.b64encode(content).decode(), "encoding": "base64"}
            if isinstance(content, (bytes, bytearray)) else {"path": path, "content": content}
            for path, content in files.items()]


_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _ignored(rules: List[tuple], path: str) -> bool:
    """Whether a .dockerignore's rules leave path out: the last rule that matches it, or one of
    the folders it is in, decides; ``!`` brings a path back."""
    out = False
    parts = path.split("/")
    for negate, pattern in rules:
        if any(pattern.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            out = not negate
    return out


def _rules(text: str) -> List[tuple]:
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
        if line in (".", ""):
            continue
        rx = ""
        i = 0
        while i < len(line):
            if line.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif line.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif line[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif line[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(line[i]), i + 1
        rules.append((negate, re.compile(rx + r"\Z")))
    return rules


def pack_context(folder: str, dockerignore: Optional[str] = None) -> Dict[str, Any]:
    """The folder as one gzipped tar: its regular files that the .dockerignore (the folder's own
    unless given) leaves in, in name order, with no owners, times or links, so that the same folder
    gives the same bytes and a rebuild sends nothing new. ``{"archive", "sha256", "chunks"}``."""
    root = os.path.abspath(folder)
    if not os.path.isdir(root):
        raise InvalidRequestError(f"context_dir {folder!r} is not a folder")
    if dockerignore is None:
        try:
            with open(os.path.join(root, ".dockerignore"), encoding="utf-8") as f:
                dockerignore = f.read()
        except OSError:
            dockerignore = ".git\n"
    rules = _rules(dockerignore)
    raw = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for here, dirs, files in os.walk(root):
            dirs.sort()
            rel_dir = os.path.relpath(here, root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(here, d))]
            for name in sorted(files):
                full = os.path.join(here, name)
                rel = rel_dir + name
                if os.path.islink(full) or not os.path.isfile(full) or _ignored(rules, rel):
                    continue
                count += 1
                if count > CONTEXT_FILES:
                    raise InvalidRequestError(f"the build context has more than {CONTEXT_FILES} files: leave some "
                                              "out with a .dockerignore")
                info = tarfile.TarInfo(rel)
                info.size = os.path.getsize(full)
                info.mode = os.stat(full).st_mode & 0o777
                info.mtime = 0
                with open(full, "rb") as f:
                    tar.addfile(info, f)
    archive = gzip.compress(raw.getvalue(), mtime=0)
    if len(archive) > CONTEXT_BYTES:
        raise InvalidRequestError(f"the build context is {len(archive) >> 20} MiB compressed, over "
                                  f"{CONTEXT_BYTES >> 20} MiB: leave files out with a .dockerignore")
    chunks = [archive[i:i + CHUNK_BYTES] for i in range(0, len(archive), CHUNK_BYTES)]
    return {"archive": archive, "sha256": hashlib.sha256(archive).hexdigest(), "chunks": chunks}


def _path(image_id: str, suffix: str = "") -> str:
    return f"/v1/images/{quote(image_id, safe='')}{suffix}"


class ImagesOps:
    """``runtime.images``. A build queues at once (``create``) or waits for its end (``build``);
    an image is named by its id, its name (the ``latest`` tag), ``name:tag`` or ``name@version``."""

    def upload_context(self, folder: str, *, dockerignore: Optional[str] = None) -> Dict[str, Any]:
        """Packs the folder and sends the chunks the daemon lacks. The ``context`` a build names."""
        packed = pack_context(folder, dockerignore)
        digests = [hashlib.sha256(c).hexdigest() for c in packed["chunks"]]
        missing = set((yield Call(self._http.request, "POST", "/v1/images/context/missing",
                                  json_body={"digests": digests}))["missing"])
        for digest, chunk in zip(digests, packed["chunks"]):
            if digest in missing:
                yield Call(self._http.request, "PUT", f"/v1/images/context/{digest}", content=chunk)
                missing.discard(digest)
        return {"archive": {"sha256": packed["sha256"], "size": len(packed["archive"]), "chunks": digests},
                "files": []}

    def create(self, *, name: Optional[str] = None, dockerfile: Optional[str] = None, image: Optional[str] = None,
               recipe: Optional[Dict[str, Any]] = None, files: Optional[Files] = None,
               context_dir: Optional[str] = None,
               context: Optional[Dict[str, Any]] = None, dockerignore: Optional[str] = None,
               tags: Optional[Sequence[str]] = None, labels: Optional[Dict[str, str]] = None,
               build_args: Optional[Dict[str, str]] = None, env: Optional[Dict[str, str]] = None,
               target: Optional[str] = None, build: Optional[Dict[str, Any]] = None,
               cache: Optional[bool] = None, start: Optional[Dict[str, Any]] = None, no_start: bool = False,
               secrets: Optional[Dict[str, str]] = None,
               idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Queues a build; the image, state ``queued``. ``dockerfile`` (with ``context_dir`` or
        small inline ``files``: ``{path: text or bytes}`` or ``[{path, content, encoding?,
        mode?}]``), ``image``: a registry's image as it is (``python:3.12-slim``,
        ``host:port/repo@sha256:...``), or ``recipe``: ``{base, env, workdir, apt, files, pip,
        npm, commands, user}`` made into a Dockerfile by the daemon (unnamed, it is named by it).
        ``build`` takes ``vcpu``, ``memory_mib``, ``disk_mib``, ``timeout_seconds`` and
        ``network`` (a sandbox's ``{"internet", "allow", "deny"}``: what the steps may reach; none
        unless given). A build made before is a new version sharing its disk (its steps logged
        ``CACHED``); ``cache=False`` runs every step. ``start`` sets what a sandbox from the image
        runs: ``command`` and ``ready_port``
        or ``ready_command``, ``ready_timeout_seconds``; ``no_start=True`` keeps none (not even
        the Dockerfile's CMD and HEALTHCHECK). ``secrets`` (``{id: value}``) are the build
        secrets a ``RUN --mount=type=secret,id=...`` reads while that step runs; kept nowhere,
        and not in the cache's keys (a changed value hits the cache)."""
        if sum(x is not None for x in (dockerfile, image, recipe)) != 1:
            raise InvalidRequestError("give dockerfile, image or recipe, one of them")
        if files is not None and context_dir is not None:
            raise InvalidRequestError("give files or context_dir, not both")
        if context_dir is not None:
            context = yield from ImagesOps.upload_context(self, context_dir, dockerignore=dockerignore)
        body: Dict[str, Any] = {} if name is None else {"name": name}
        if dockerfile is not None:
            body["dockerfile"] = dockerfile
        elif image is not None:
            body["image"] = image
        else:
            body["recipe"] = {k: v for k, v in recipe.items() if v is not None}
            if "files" in body["recipe"]:
                body["recipe"]["files"] = inline_files(body["recipe"]["files"])
        if files is not None:
            body["files"] = inline_files(files)
        for key, value in (("context", context), ("tags", None if tags is None else list(tags)),
                           ("labels", labels), ("buildArgs", build_args), ("env", env), ("target", target),
                           ("cache", cache), ("secrets", None if secrets is None else dict(secrets))):
            if value is not None:
                body[key] = value
        if build:
            names = {"vcpu": "vcpu", "memory_mib": "memoryMiB", "disk_mib": "diskMiB",
                     "timeout_seconds": "timeoutSeconds"}
            body["build"] = {names.get(k, k): v for k, v in build.items() if v is not None}
        if no_start:
            body["start"] = None
        elif start is not None:
            names = {"ready_port": "readyPort", "ready_command": "readyCommand",
                     "ready_timeout_seconds": "readyTimeoutSeconds"}
            body["start"] = {names.get(k, k): v for k, v in start.items() if v is not None}
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return dict((yield Call(self._http.request, "POST", "/v1/images", json_body=body, headers=headers)))

    def build(self, *, on_log: Optional[Callable[[Dict[str, Any]], Any]] = None, poll_seconds: float = 0.5,
              **fields: Any) -> Dict[str, Any]:
        """Builds and waits for the end, each log line to ``on_log``; the ready image. A failed
        build raises :class:`APIError` with code ``image_build_failed`` and its error."""
        image = yield from ImagesOps.create(self, **fields)
        after = 0
        while True:
            page = yield from ImagesOps.logs(self, image["id"], after)
            for line in page["lines"]:
                if on_log is not None:
                    on_log(line)
            after = page["nextAfter"]
            if page["done"]:
                break
            if not page["lines"]:
                yield Call(self._sleep, poll_seconds)
        image = yield from ImagesOps.get(self, image["id"])
        if image["state"] != "ready":
            raise APIError(f"image {image['id']} {image['state']}: {image.get('error') or 'no error given'}",
                                  code="image_build_failed", status=422,
                                  hint="read the whole log with runtime.images.logs(id)")
        return image

    def get(self, image_id: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "GET", _path(image_id))))

    def resolve(self, ref: str) -> Dict[str, Any]:
        """An image by id, name, name:tag or name@version."""
        if _ID.match(ref):
            return (yield from ImagesOps.get(self, ref))
        return dict((yield Call(self._http.request, "GET", "/v1/images/resolve", params={"ref": ref})))

    def logs(self, image_id: str, after: int = 0) -> Dict[str, Any]:
        """The log lines after seq ``after``: ``{"lines", "nextAfter", "done"}``."""
        return dict((yield Call(self._http.request, "GET", _path(image_id, "/logs"), params={"after": after})))

    def list(self, *, name: Optional[str] = None, state: Optional[str] = None, limit: Optional[int] = None,
             cursor: Optional[str] = None) -> Dict[str, Any]:
        """A page of the owner's images, newest first: ``{"data", "nextCursor"}``."""
        params = {k: v for k, v in (("name", name), ("state", state), ("limit", limit), ("cursor", cursor))
                  if v is not None}
        body = yield Call(self._http.request, "GET", "/v1/images", params=params)
        return {"data": body.get("data", []), "nextCursor": body.get("nextCursor")}

    def versions(self, name: str) -> Dict[str, Any]:
        """Every version of a name, newest first (a page of up to 100)."""
        return (yield from ImagesOps.list(self, name=name, limit=100))

    def _id(self, ref: str) -> Any:
        if _ID.match(ref):
            return ref
        return (yield from ImagesOps.resolve(self, ref))["id"]

    def tag(self, image: str, tag: str) -> Dict[str, Any]:
        """Points ``tag`` of the image's name at this version."""
        image_id = yield from ImagesOps._id(self, image)
        return dict((yield Call(self._http.request, "POST", _path(image_id, ":tag"), json_body={"tag": tag})))

    def untag(self, image: str, tag: str) -> Dict[str, Any]:
        image_id = yield from ImagesOps._id(self, image)
        return dict((yield Call(self._http.request, "POST", _path(image_id, ":untag"), json_body={"tag": tag})))

    def delete(self, image: str) -> Dict[str, Any]:
        """Deletes one version (by id, name:tag or name@version), its tags and its disk."""
        image_id = yield from ImagesOps._id(self, image)
        return dict((yield Call(self._http.request, "POST", _path(image_id, ":delete"), json_body={})))

    _sleep = staticmethod(time.sleep)


class RegistriesOps:
    """``runtime.images.registries``: the owner's credentials of private registries, which pulls
    use. The password is sealed on arrival and never returned."""

    def list(self) -> List[Dict[str, Any]]:
        """``[{"registry", "username", "updatedAt"}]``."""
        return list((yield Call(self._http.request, "GET", "/v1/images/registries"))["data"])

    def set(self, registry: str, *, username: str, password: str) -> Dict[str, Any]:
        """Stores (or replaces) a user name and a token or password for ``registry``."""
        return dict((yield Call(self._http.request, "POST", "/v1/images/registries",
                                json_body={"registry": registry, "username": username, "password": password})))

    def delete(self, registry: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "POST", "/v1/images/registries:delete",
                                json_body={"registry": registry})))
