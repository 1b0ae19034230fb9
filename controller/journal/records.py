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

ROW, REWARDS, ROWS_DELETED, GROUP, GROUPS_FINISHED, CURSOR, STEP, TRAINED, REPLAY_CLEARED = (
    "row", "rewards", "rows_deleted", "group", "groups_finished", "cursor", "step", "trained", "replay_cleared")
REPLAY_BATCHES = "replay_batches"
"""In a state: the batches of trainer steps a crash lost, oldest first, which the train pump trains again first."""


def encode(kind: str, value: Any) -> bytes:
    return orjson.dumps({"k": kind, "v": value})


class ReplayState:
    """A controller state being rebuilt record by record.

    Past the cut (`past_cut()`), the records of a run that went on after its snapshot are replayed on top of it
    for a trainer that is back at the cut's step: rows, groups and the dataloader go on as they went, while each
    train step after the cut is undone. Its groups keep their rows and stay unfinished, and its batch joins
    `replay_batches`, so the train pump trains the same groups in the same order again. For a trainer that is not
    back at the cut but survived at the journal's last step (a controller that died alone), `past_cut(keep_steps=
    True)` keeps them instead: the records apply as before the cut, and the steps are listed in `kept_steps`."""

    def __init__(self, base: dict) -> None:
        self.step = int(base["step"])
        self.replay_batches: list[list[str]] = [list(batch) for batch in base.get(REPLAY_BATCHES, [])]
        self.lost_steps: list[dict] = []
        """Train steps after the cut, undone: {"step", "policy_version", "groups"} in training order."""
        self.kept_steps: list[dict] = []
        """Train steps after the cut, kept (`past_cut(keep_steps=True)`): the same shape."""
        self._past_cut = False
        self._keep_steps = False
        self._kept_groups: set[str] = set()
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
                if group_id not in self._kept_groups:
                    self.rows.pop(group_id, None)
        elif kind == GROUP:
            self.groups[value["group_id"]] = value
        elif kind == GROUPS_FINISHED:
            for group_id in value:
                if group_id not in self._kept_groups:
                    self.groups.pop(group_id, None)
        elif kind == CURSOR:
            self.dataloader = value
        elif kind == STEP:
            if not self._past_cut or self._keep_steps:
                self.step = int(value)
        elif kind == TRAINED:
            self._trained(value)
        elif kind == REPLAY_CLEARED:
            self.replay_batches = []
        else:
            raise ValueError(f"unknown journal record kind {kind!r}")

    def past_cut(self, keep_steps: bool = False) -> None:
        """The records from here on came after the cut the trainer is restored to (`keep_steps`: after the cut,
        by the trainer that is kept)."""
        self._past_cut, self._keep_steps = True, keep_steps

    def _trained(self, value: dict) -> None:
        groups = list(value["groups"])
        trained = set(groups)
        self.replay_batches = [kept for batch in self.replay_batches if (kept := [g for g in batch if g not in trained])]
        if self._past_cut:
            step = {"step": int(value["step"]), "policy_version": int(value["policy_version"]), "groups": groups}
            if self._keep_steps:
                self.kept_steps.append(step)
                return
            self.lost_steps.append(step)
            self._kept_groups |= trained

    KEYS = ("step", REPLAY_BATCHES, "dataloader", "data_plane", "claim_ledger", "group_ledger")
    """The keys `state_dict` gives (anything else in a saved state is the saver's own)."""

    def state_dict(self) -> dict:
        batches = [step["groups"] for step in self.lost_steps] + self.replay_batches
        return {
            "step": self.step,
            REPLAY_BATCHES: batches,
            "dataloader": self.dataloader,
            "data_plane": {"rows": [self.rows[gid][s] for gid in sorted(self.rows) for s in sorted(self.rows[gid])]},
            "claim_ledger": {"claims": {}},
            "group_ledger": {"groups": list(self.groups.values())},
        }
