"""The controller's journal records, and how replay applies them to a saved state.

Each change to the data plane, the group ledger, the dataloader position or the step is
one record, appended in the order the change happened (all of them on the event loop's
one thread). Replaying a base state plus the records up to a position therefore gives
exactly the state the controller held at that position: the same dict shape as
`Controller.state_dict()`, with no claims (a restore offers claimed groups again).
"""

from __future__ import annotations

from typing import Any

import orjson

ROW, REWARDS, ROWS_DELETED, GROUP, GROUPS_FINISHED, CURSOR, STEP = (
    "row", "rewards", "rows_deleted", "group", "groups_finished", "cursor", "step")


def encode(kind: str, value: Any) -> bytes:
    return orjson.dumps({"k": kind, "v": value})


class ReplayState:
    """A controller state being rebuilt record by record."""

    def __init__(self, base: dict) -> None:
        self.step = int(base["step"])
        self.dataloader = dict(base["dataloader"])
        self.rows: dict[str, dict[int, dict]] = {}
        for row in base["data_plane"]["rows"]:
            self.rows.setdefault(row["group_id"], {})[int(row["sibling"])] = row
        # Insertion order is the ledger's own order, so a replayed state lists groups as the live one does.
        self.groups: dict[str, dict] = {g["group_id"]: g for g in base["group_ledger"]["groups"]}

    def apply(self, payload: bytes) -> None:
        record = orjson.loads(payload)
        kind, value = record["k"], record["v"]
        if kind == ROW:
            self.rows.setdefault(value["group_id"], {}).setdefault(int(value["sibling"]), value)
        elif kind == REWARDS:
            siblings = self.rows[value["group_id"]]
            for sibling, reward in zip(sorted(siblings), value["rewards"]):
                siblings[sibling] = {**siblings[sibling], "reward": reward}
        elif kind == ROWS_DELETED:
            for group_id in value:
                self.rows.pop(group_id, None)
        elif kind == GROUP:
            self.groups[value["group_id"]] = value
        elif kind == GROUPS_FINISHED:
            for group_id in value:
                self.groups.pop(group_id, None)
        elif kind == CURSOR:
            self.dataloader = value
        elif kind == STEP:
            self.step = int(value)
        else:
            raise ValueError(f"unknown journal record kind {kind!r}")

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "dataloader": self.dataloader,
            "data_plane": {"rows": [self.rows[gid][s] for gid in sorted(self.rows) for s in sorted(self.rows[gid])]},
            "claim_ledger": {"claims": {}},
            "group_ledger": {"groups": list(self.groups.values())},
        }
