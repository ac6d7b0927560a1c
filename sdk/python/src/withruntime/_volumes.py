"""The bodies of ``runtime.volumes``: disks of a fixed size that outlive sandboxes (docs/
volumes.md), under the published client's names and answering what the daemon answers (docs/
api.md, "Volumes"). Written once as generators of steps (_drive.py) for both clients; the classes
are in sandbox.py and async_sandbox.py. Private."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from ._drive import Call
from ._observability import _item_path, _present
from ._process import idempotency_headers


def _volume_path(volume_id: str, suffix: str = "") -> str:
    return _item_path("/v1/volumes", volume_id, "volume_id", suffix)


class VolumesOps:
    """``runtime.volumes``: create one, attach it at a sandbox's create with
    ``volumes=[{"volume_id": vol["id"], "path": "/data"}]`` (``"read_only": True`` for a
    read-only view), and it stays when the sandbox is deleted."""

    def create(self, size_mib: Optional[int] = None, *, name: Optional[str] = None,
               labels: Optional[Mapping[str, str]] = None, shared: Optional[bool] = None,
               idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """A new volume of ``size_mib`` MiB (1024 when left out), ready. ``shared=True`` lets
        any number of sandboxes write it at once; otherwise one at a time."""
        body = _present(sizeMiB=size_mib, name=name, labels=None if labels is None else dict(labels),
                        shared=shared)
        return dict((yield Call(self._http.request, "POST", "/v1/volumes", json_body=body,
                                headers=idempotency_headers(idempotency_key))))

    def get(self, volume_id: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "GET", _volume_path(volume_id))))

    def list(self, *, name: Optional[str] = None, state: Optional[str] = None, cursor: Optional[str] = None,
             limit: Optional[int] = None) -> Dict[str, Any]:
        """One page, oldest first: ``{"data": [volume, ...], "nextCursor"}``; pass
        ``nextCursor`` back as ``cursor`` for the next."""
        params = _present(name=name, state=state, cursor=cursor, limit=limit)
        return dict((yield Call(self._http.request, "GET", "/v1/volumes", params=params or None)))

    def resize(self, volume_id: str, size_mib: int, *, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Grows a volume no sandbox holds; a smaller size is refused."""
        return dict((yield Call(self._http.request, "POST", _volume_path(volume_id, ":resize"),
                                json_body={"sizeMiB": size_mib}, headers=idempotency_headers(idempotency_key))))

    def delete(self, volume_id: str, *, force: bool = False) -> Dict[str, Any]:
        """``{"id", "deleted": True}``; its bytes are gone for good. Refused while attached unless
        ``force``."""
        body = {"force": True} if force else {}
        return dict((yield Call(self._http.request, "POST", _volume_path(volume_id, ":delete"), json_body=body)))

    def attach(self, volume_id: str, sandbox_id: str, path: str, *, read_only: Optional[bool] = None,
               idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """Attaches the volume to a running sandbox at ``path`` (every driver; on the microVM a
        disk put in an empty slot of its guest): the attachment, whose ``id`` ``detach`` and
        ``get_attachment`` take."""
        return dict((yield Call(self._http.request, "POST", _volume_path(volume_id, ":attach"),
                                json_body=_present(sandboxId=sandbox_id, path=path, readOnly=read_only),
                                headers=idempotency_headers(idempotency_key))))

    def detach(self, volume_id: str, attachment_id: str) -> Dict[str, Any]:
        """Unmounts it from the sandbox; refused (409) while a process there uses it."""
        path = _volume_path(volume_id) + _item_path("/attachments", attachment_id, "attachment_id", ":detach")
        return dict((yield Call(self._http.request, "POST", path, json_body={})))

    def get_attachment(self, volume_id: str, attachment_id: str) -> Dict[str, Any]:
        path = _volume_path(volume_id) + _item_path("/attachments", attachment_id, "attachment_id")
        return dict((yield Call(self._http.request, "GET", path)))

    def backup(self, volume_id: str, *, retention_days: Optional[int] = None, name: Optional[str] = None,
               idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """A copy of the volume as it is now, kept until deleted, or ``retention_days`` (1 to 365)
        days (docs/volumes.md, "Backups")."""
        return dict((yield Call(self._http.request, "POST", _volume_path(volume_id, ":backup"),
                                json_body=_present(retentionDays=retention_days, name=name),
                                headers=idempotency_headers(idempotency_key))))

    def set_backup_policy(self, volume_id: str, *, daily: Optional[bool] = None,
                          retention_days: Optional[int] = None, every_minutes: Optional[int] = None,
                          cron: Optional[str] = None, keep: Optional[Mapping[str, int]] = None,
                          no_schedule: bool = False, no_keep: bool = False) -> Dict[str, Any]:
        """Turns the daemon's automatic backups of the volume on (``daily=True``) or off
        (``daily=False``), backs it up every ``every_minutes`` (15 or more) or at the times of a
        five-field UTC ``cron`` instead, or goes back to daily (``no_schedule=True``); each kept
        ``retention_days``. ``keep`` counts (``last``, ``hourly``, ``daily``, ``weekly``,
        ``monthly``, ``yearly``) prune the scheduled backups; ``no_keep=True`` clears them. What
        is left out keeps its value. The volume, with its ``backupPolicy``."""
        if sum([every_minutes is not None, cron is not None, no_schedule]) > 1:
            raise ValueError("Give one of every_minutes, cron and no_schedule.")
        if keep is not None and no_keep:
            raise ValueError("Give one of keep and no_keep.")
        body: Dict[str, Any] = _present(daily=daily, retentionDays=retention_days,
                                        keep=None if keep is None else dict(keep))
        if every_minutes is not None:
            body["schedule"] = {"everyMinutes": every_minutes}
        elif cron is not None:
            body["schedule"] = {"cron": cron}
        elif no_schedule:
            body["schedule"] = None
        if no_keep:
            body["keep"] = None
        return dict((yield Call(self._http.request, "POST", _volume_path(volume_id, ":backup-policy"),
                                json_body=body)))

    def backups(self, volume_id: Optional[str] = None, *, cursor: Optional[str] = None,
                limit: Optional[int] = None) -> Dict[str, Any]:
        """One page of backups, newest first (of one volume when ``volume_id`` is given):
        ``{"data", "nextCursor"}``."""
        params = _present(volumeId=volume_id, cursor=cursor, limit=limit)
        return dict((yield Call(self._http.request, "GET", "/v1/volume-backups", params=params or None)))

    def get_backup(self, backup_id: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "GET", _item_path("/v1/volume-backups", backup_id,
                                                                      "backup_id"))))

    def delete_backup(self, backup_id: str) -> Dict[str, Any]:
        return dict((yield Call(self._http.request, "POST", _item_path("/v1/volume-backups", backup_id, "backup_id",
                                                                       ":delete"), json_body={})))

    def restore(self, backup_id: str, *, name: Optional[str] = None,
                idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """A new volume of the backup's size with its files."""
        return dict((yield Call(self._http.request, "POST", "/v1/volumes",
                                json_body=_present(fromBackup=backup_id, name=name),
                                headers=idempotency_headers(idempotency_key))))
