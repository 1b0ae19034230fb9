"""Which complete groups the running train step has claimed.

Claimed groups stay in the data plane until the step commits, so a checkpoint or cut
taken while a step runs still holds them and a restart offers them again.
"""

from __future__ import annotations


class ClaimLedger:
    def __init__(self) -> None:
        self._claims: dict[int, list[str]] = {}

    def claim(self, step: int, group_ids: list[str]) -> None:
        if step in self._claims:
            raise RuntimeError(f"step {step} already holds a claim; commit or release it first")
        self._claims[step] = list(group_ids)

    def commit(self, step: int) -> list[str]:
        """The step's optimizer update landed: its groups are consumed."""
        return self._claims.pop(step)

    def release(self, step: int) -> list[str]:
        """The step did not land: its groups may be claimed again."""
        return self._claims.pop(step, [])

    def claimed(self) -> list[str]:
        return [gid for groups in self._claims.values() for gid in groups]

    def state_dict(self) -> dict:
        return {"claims": {str(step): groups for step, groups in self._claims.items()}}

    def load_state_dict(self, state: dict) -> None:
        self._claims = {int(step): list(groups) for step, groups in state["claims"].items()}
