"""What a restore needs of the run it restores, and nothing more: pause it, load a state into it, read what the
state holds, and hand the continued rollouts back. The restore owns this interface; the controller implements it
(`controller.runtime.Controller`), and a test can hand in something smaller."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.primitives.audit_log import AuditLog

if TYPE_CHECKING:
    from turnkeep.controller.pumps.rollout_pump import Continuation
    from turnkeep.controller.rollout_levels import RolloutLevelPlan


class RestoreTarget(Protocol):
    ledger: GroupLedger
    """Read: the restored groups and siblings."""
    data_plane: DataPlane
    """Read: the restored rows."""
    audit: AuditLog | None

    @property
    def reused_processes(self) -> bool:
        """The trainer and the policy server were left running by a crashed controller (they hold trained weights)."""

    @property
    def next_group_index(self) -> int:
        """The restored dataloader's position."""

    async def pause(self, holder: str) -> None:
        """Close admission and the policy server's gate under `holder` (idempotent)."""

    async def resume(self, holder: str) -> None:
        """Reopen the policy server's gate, then admission."""

    async def load_trainer_checkpoint(self, directory: str, step: int) -> int:
        """Load the trainer's files; returns the policy version they hold."""

    async def trainer_progress(self) -> dict:
        """The trainer's policy version now and its last step (`TrainerActor.progress`)."""

    async def checkpoint_now(self, step: int) -> None:
        """A trainer checkpoint of the state held now, at `step` (the trainer's version)."""

    async def load_policy_weights(self, version: int) -> None:
        """The trainer's weights into the policy server (a run without Temporal; with it, `policy.load_weights`)."""

    def load_state(self, state: dict, policy_version: int, *, checkpointed: bool) -> None:
        """The dataloader, data plane and ledgers; `checkpointed`: the step has a trainer checkpoint of its own."""

    def start_journal(self, run_id: str, incarnation: int, restored_from: dict | None = None) -> None:
        """Journal every change from now on, from the state held now."""

    def level_plan(self, group_id: str) -> RolloutLevelPlan:
        """The recovery level of the group's environment."""

    def redispatch(self, continuations: dict[tuple[str, int], Continuation]) -> int:
        """Queue the unfinished groups again (`continuations` from their saved turn); returns the siblings queued."""
