"""The store's nodes and their GPUs: what each node reported, its drain, each card's status
(maintenance outlives a restart of the head).
"""

from __future__ import annotations

import json

from .base import StoreBase


class Nodes(StoreBase):
    """The ``nodes`` and ``gpus`` tables."""

    def upsert_node(self, name: str, host: str, port: int, state: str, reason: str = "",
                    last_seen: float | None = None, info: dict | None = None) -> None:
        row = {"name": name, "host": host, "port": port, "state": state, "reason": reason}
        if last_seen is not None:
            row["last_seen"] = last_seen
        if info is not None:
            row["info"] = json.dumps(info)
        with self.transaction():
            self.db["nodes"].upsert(row, pk="name")

    def nodes(self) -> list[dict]:
        return [dict(r) for r in self.db["nodes"].rows_where(order_by="name")]

    def set_drained(self, name: str, drained: bool, reason: str, by: str, t: float) -> None:
        """An admin's drain or resume of a node; it outlives restarts of the head."""
        with self.transaction():
            self.db.execute("UPDATE nodes SET drained = ?, drain_reason = ? WHERE name = ?",
                            [int(drained), reason if drained else None, name])
            what = f"drained by {by}" + (f": {reason}" if reason else "") if drained else f"resumed by {by}"
            self._event(t, "admin", f"node {name} {what}", node=name, user=by)

    def register_gpus(self, node: str, descriptors: list[dict], t: float) -> None:
        """Record the GPUs a node reported (R2 descriptor fields), keeping their status."""
        with self.transaction():
            for d in descriptors:
                existing = self._gpu_status(d["uuid"])
                row = {**d, "node": node, "status": existing or "ok"}
                if existing is None:
                    row["registered_at"] = t
                self.db["gpus"].upsert(row, pk="uuid")

    def set_gpu_status(self, gpu_uuid: str, status: str, reason: str | None = None) -> None:
        """``maintenance`` (with why) or ``ok``: kept so a restart does not undo isolation."""
        with self.transaction():
            self.db.execute("UPDATE gpus SET status = ?, status_reason = ? WHERE uuid = ?",
                            [status, reason, gpu_uuid])

    def _gpu_status(self, gpu_uuid: str) -> str | None:
        row = self.db.execute("SELECT status FROM gpus WHERE uuid = ?", [gpu_uuid]).fetchone()
        return row[0] if row else None

    def gpus(self) -> list[dict]:
        return [dict(r) for r in self.db["gpus"].rows_where(order_by="node, idx")]
