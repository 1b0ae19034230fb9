"""Train pump: claim complete groups -> train step (the trainer waits on its hold before
the optimizer step) -> commit (step += 1, consumed groups deleted) -> refit the policy
server -> a trainer checkpoint every `save_period` steps.

Bounded staleness: a complete group is trained only while its oldest turn was generated
by a policy at most `max_staleness` versions behind the trainer; older groups are
discarded with the reason `stale` and their slot goes back to the rollout pump (with
`algorithm.drop_zero_signal`, so are groups whose rewards are all equal: `zero_signal`). A step
takes the complete groups nearest to that bound first. After a
restore the undone steps are trained again first; admission stays closed (`REPLAY_HOLDER`)
while a turn generated with the policy of the moment could not be trained before it went
stale, behind the undone steps left and the groups already open.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from turnkeep.controller.engines.engine_pool import EnginePool
from turnkeep.controller.journal.records import REPLAY_CLEARED, STEP, TRAINED
from turnkeep.controller.state.claim_ledger import ClaimLedger
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.primitives.audit_log import AuditLog
from turnkeep.primitives.chaos_points import reached
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.audit import GroupsDiscarded, StepTrained
from turnkeep.schemas.choices import Trigger
from turnkeep.schemas.config import TrainConfig
from turnkeep.schemas.names import PREEMPTION_HOLDER, REFIT_HOLDER, REPLAY_HOLDER
from turnkeep.schemas.rollout import RolloutRow

log = logging.getLogger("turnkeep.train")
PREEMPTION_HOLD_LEASE_S = 600.0
"""The preemption's trainer hold expires by itself if its controller dies without releasing it."""


@dataclass
class StepReport:
    step: int
    policy_version: int
    groups_trained: int
    reward_mean: float
    staleness_max: int
    train_step_s: float
    refit_s: float
    """Serialising on the trainer, moving through Ray and loading into vLLM, end to end."""
    refit_bytes: int
    trainer: dict
    engine_tokens: dict[int, int] = field(default_factory=dict)
    """Tokens each live engine has generated since it started (engine index -> count), as of this step's refit."""
    engines_live: int = 1
    reward_parts_mean: dict[str, float] = field(default_factory=dict)
    """Each named reward part's mean over the rows that have it (an adapted rubric's functions)."""


def reward_parts_mean(rows: list[RolloutRow]) -> dict[str, float]:
    parts: dict[str, list[float]] = {}
    for row in rows:
        for name, value in row.reward_parts.items():
            parts.setdefault(name, []).append(value)
    return {name: sum(values) / len(values) for name, values in sorted(parts.items())}


class TrainPump:
    def __init__(
        self,
        cfg: TrainConfig,
        ledger: GroupLedger,
        claims: ClaimLedger,
        data_plane: DataPlane,
        trainer,
        engines: EnginePool,
        admission: HoldSet,
        stats: RunStats,
        on_groups_finished: Callable[[], None],
        write_checkpoint: Callable[[int, str], Awaitable[None]],
        announce_checkpoint: Callable[[int, str, bool], Awaitable[None]],
        on_step: Callable[[StepReport], None],
        audit: AuditLog | None = None,
        drop_zero_signal: bool = False,
        run_dir: Path | None = None,
    ) -> None:
        """`drop_zero_signal`: discard complete groups whose rewards are all equal (`algorithm.drop_zero_signal`);
        `run_dir`: where a chaos kill point announces itself (None: no kill point)."""
        self._cfg = cfg
        self._run_dir = run_dir
        self._drop_zero_signal = drop_zero_signal
        self._ledger = ledger
        self._claims = claims
        self._data_plane = data_plane
        self._trainer = trainer
        self._engines = engines
        self._admission = admission
        self._stats = stats
        self._on_groups_finished = on_groups_finished
        self._write_checkpoint = write_checkpoint
        self._announce_checkpoint = announce_checkpoint
        """(step, trigger, repeat): ties a snapshot attempt to the checkpoint; `repeat` when it was announced before."""
        self._on_step = on_step
        self._audit = audit
        self._group_settled = asyncio.Event()
        self._untrainable: list[str] = []
        self._checkpoint_request: str | None = None
        self.checkpointed_step: int | None = None
        """Step of the newest trainer checkpoint written or restored: the anchor of every snapshot."""
        self.step = 0
        self.policy_version = 0
        """Policy version of the committed step (the trainer's, reported with each step)."""
        self._frozen = False
        self.step_running = False
        """A train step is on the trainer (claimed, not yet committed)."""
        self._preemption_save: asyncio.Future | None = None  # a reference, so the loop keeps the task until it ends
        self.replay_batches: deque[list[str]] = deque()
        """Batches of steps a crash undid (`ReplayState`), trained again first, in their order, so the steps
        after the restore train what the lost ones trained and each policy version keeps its meaning."""
        self.waiting_on = "starting"
        """What the pump waits on now, in words (the stall watchdog's warning names it)."""

    def group_settled(self, group_id: str, trainable: bool) -> None:
        if not trainable:
            self._untrainable.append(group_id)
        self._group_settled.set()

    def continue_from(self, step: int, policy_version: int) -> None:
        """Go on training a trainer that is already at `step` (with no checkpoint of it in this run yet)."""
        self.step = step
        self.policy_version = policy_version

    def restore(self, step: int, policy_version: int, *, checkpointed: bool = True,
                replay_batches: list[list[str]] | None = None) -> None:
        """Continue after a restore at `step`. `checkpointed`: its checkpoint exists, so none is written for it
        again. `replay_batches`: the batches of the steps the restore undid, trained again first."""
        self.continue_from(step, policy_version)
        self.checkpointed_step = step if checkpointed else None
        self.replay_batches = deque(list(batch) for batch in replay_batches or [])

    def has_checkpoint_of_current_step(self) -> bool:
        return self.checkpointed_step == self.step

    def freeze(self) -> None:
        """Start no new step; the running one finishes and checkpoint requests are still served.

        A preemption freezes training before it asks for the final snapshot, so no later
        step (and no later checkpoint without a snapshot) can supersede what it saves.
        """
        self._frozen = True
        self._group_settled.set()

    def request_checkpoint(self, trigger: str) -> None:
        """Write a trainer checkpoint at the current step as soon as no step is running (a preemption's: at once).

        A snapshot must be filed under a checkpoint of the current step; this lets a
        periodic or operator snapshot get one instead of being skipped.
        """
        if trigger == Trigger.PREEMPTION and self.step_running and self.checkpointed_step != self.step:
            self._preemption_save = asyncio.ensure_future(self._checkpoint_under_running_step(trigger))
            return
        self._checkpoint_request = trigger
        self._group_settled.set()  # wakes a train pump that is waiting for data

    async def _checkpoint_under_running_step(self, trigger: str) -> None:
        """A checkpoint of the last finished step now, while a step still computes (a scheduler's grace is shorter
        than a real model's step): the trainer hold keeps the running step from its optimizer step, so the weights
        stay the finished step's and the running step's groups stay untrained (claimed, so a restart trains them).
        When the running step has moved the weights already (a second pass), it finishes first, as before."""
        step, version = self.step, self.policy_version
        await self._trainer.hold_add.remote(PREEMPTION_HOLDER, PREEMPTION_HOLD_LEASE_S)
        if self.step == step and self.step_running and await self._trainer.holds_weights_of.remote(version):
            log.info("preemption: checkpointing step %d while step %d waits before its optimizer step", step, step + 1)
            await self._checkpoint(step, trigger)
            return
        await self._trainer.hold_release.remote(PREEMPTION_HOLDER)
        self._checkpoint_request = trigger
        self._group_settled.set()

    async def release_preemption_hold(self) -> None:
        """At the run's end: the held step is abandoned by then, and no hold outlives the run."""
        await self._trainer.hold_release.remote(PREEMPTION_HOLDER)

    def hold_generation_during_replay(self) -> None:
        """After a restore: close admission while a turn generated now could not be trained in time."""
        if self._generation_now_goes_stale():
            log.info("admission waits while the trainer trains %d undone steps again (max_staleness=%d, %d other "
                     "groups open)", self._replay_steps_left(), self._cfg.max_staleness, self._open_outside_replay())
            self._admission.add(REPLAY_HOLDER)

    def _generation_now_goes_stale(self) -> bool:
        """A group generated now (with the policy of the step trained last) is trainable for `max_staleness + 1`
        steps. The undone steps still to train take the first of them, and the other open groups, complete or
        not, at least one more step each `prompts_per_step` (the oldest go first). Once no undone step is left,
        the policy is the newest there is and waiting would gain nothing."""
        left = self._replay_steps_left()
        if left == 0:
            return False
        steps_for_the_rest = max(1, -(-self._open_outside_replay() // self._cfg.prompts_per_step))
        return left + steps_for_the_rest > self._cfg.max_staleness + 1

    def _replay_steps_left(self) -> int:
        return sum(1 for batch in self.replay_batches if any(self._ledger.has_group(gid) for gid in batch))

    def _open_outside_replay(self) -> int:
        replaying = {gid for batch in self.replay_batches for gid in batch if self._ledger.has_group(gid)}
        return self._ledger.inflight() - len(replaying)

    def _release_replay_hold_once_fresh(self) -> None:
        if not self._generation_now_goes_stale():
            self._admission.release(REPLAY_HOLDER)

    async def run(self, max_steps: int | None) -> None:
        try:
            while max_steps is None or self.step < max_steps:
                await self._serve_checkpoint_request()
                await self.train_one_step()
        finally:
            self._admission.release(REPLAY_HOLDER)
        if self.checkpointed_step != self.step:
            # A finished run can be extended later (`--steps` higher, same run directory) from where it ended.
            await self._checkpoint(self.step, "trainer_checkpoint")

    async def _serve_checkpoint_request(self) -> None:
        trigger, self._checkpoint_request = self._checkpoint_request, None
        if trigger is None:
            return
        if self.checkpointed_step != self.step:
            await self._checkpoint(self.step, trigger)
        else:
            # The request raced a save_period checkpoint of this very step: the requester
            # (a preemption, an operator) still waits for an attempt under it, so announce it again.
            await self._announce_checkpoint(self.step, trigger, True)

    async def _checkpoint(self, step: int, trigger: str) -> None:
        self.waiting_on = f"writing the trainer checkpoint of step {step}"
        await self._write_checkpoint(step, trigger)
        # Recorded before the announcement: the attempt it starts reads its anchor from here.
        self.checkpointed_step = step
        await self._announce_checkpoint(step, trigger, False)

    async def train_one_step(self) -> StepReport:
        group_ids = await self._claim_batch()
        self.waiting_on = f"the trainer: train step {self.step + 1} (it waits while the trainer hold is held)"
        target = self.step + 1
        rows = [row for gid in group_ids for row in self._data_plane.rows(gid)]
        staleness = self.step - min(v for row in rows for v in row.policy_versions())
        self._claims.claim(target, group_ids)
        started, self.step_running = time.monotonic(), True
        try:
            trainer_stats = await self._trainer.train_step.remote([row.model_dump() for row in rows], target)
        except BaseException:
            self._claims.release(target)
            raise
        finally:
            self.step_running = False
        train_step_s = time.monotonic() - started
        async with self._data_plane.barrier:
            if self._audit is not None:
                # Durable before the step counts: a checkpoint never runs ahead of the audit log.
                self._audit.emit(StepTrained, step=target, policy_version=trainer_stats["policy_version"],
                                 group_ids=group_ids)
                self._audit.flush()
            self._claims.commit(target)
            # Before the deletions it explains: a restore past this record undoes the step and keeps its groups.
            self._data_plane.journal.record(TRAINED, {"step": target, "policy_version": trainer_stats["policy_version"],
                                                      "groups": group_ids})
            self._data_plane.delete(group_ids)
            self._ledger.finish(group_ids)
            self.step = target
            self._data_plane.journal.record(STEP, target)
            self.policy_version = trainer_stats["policy_version"]
        self._on_groups_finished()
        self.waiting_on = f"the policy server: loading policy version {trainer_stats['policy_version']}"
        refit_s, refit_bytes, engine_tokens = await self._refit(trainer_stats["policy_version"])
        self._release_replay_hold_once_fresh()  # after the refit: generation goes on with the newer policy
        if self.step % self._cfg.save_period == 0:
            # A pending request (a preemption, an operator) is served by this checkpoint: keep its trigger.
            trigger, self._checkpoint_request = self._checkpoint_request or "trainer_checkpoint", None
            await self._checkpoint(self.step, trigger)
        report = StepReport(
            step=self.step,
            policy_version=trainer_stats["policy_version"],
            groups_trained=len(group_ids),
            reward_mean=sum(row.reward for row in rows) / len(rows),
            reward_parts_mean=reward_parts_mean(rows),
            staleness_max=staleness,
            train_step_s=train_step_s,
            refit_s=refit_s,
            refit_bytes=refit_bytes,
            trainer=trainer_stats,
            engine_tokens=engine_tokens,
            engines_live=len(self._engines.live()),
        )
        self._on_step(report)
        if self._run_dir is not None and self.checkpointed_step is not None and self.checkpointed_step < self.step:
            await reached("trained", self._run_dir)  # a chaos kill point: the trainer idle, past a checkpoint
        return report

    async def _claim_batch(self) -> list[str]:
        while True:
            await self._serve_checkpoint_request()
            if self._frozen:
                self._group_settled.clear()
                self.waiting_on = "a restore or a stop (frozen)"
                await self._group_settled.wait()  # a checkpoint request wakes it; a new group only re-checks
                continue
            fresh = await self._drop_unusable_groups()
            if (replayed := self._next_replay_batch(fresh)) is not None:
                return replayed
            if len(fresh) >= self._cfg.prompts_per_step:
                return fresh[: self._cfg.prompts_per_step]
            self.waiting_on = f"finished groups for step {self.step + 1}: {len(fresh)} of {self._cfg.prompts_per_step}"
            self._group_settled.clear()
            await self._group_settled.wait()

    def _next_replay_batch(self, fresh: list[str]) -> list[str] | None:
        """The oldest undone step's groups once all of them that are still open are complete; None to train as
        usual. Groups discarded since (stale, too few siblings) leave the batch; one the pumps are still working
        on (its group was rerun) ends the replay, and training picks its batches as usual from then on."""
        ready = set(fresh)
        while self.replay_batches:
            batch = [gid for gid in self.replay_batches[0] if self._ledger.has_group(gid)]
            if not batch:
                self.replay_batches.popleft()
                continue
            if all(gid in ready for gid in batch):
                self.replay_batches.popleft()
                return batch
            log.warning("the undone step's group %s is not complete; %d undone steps train in the usual order",
                        next(gid for gid in batch if gid not in ready), len(self.replay_batches))
            self.replay_batches.clear()
            self._data_plane.journal.record(REPLAY_CLEARED, None)
            self._admission.release(REPLAY_HOLDER)
        return None

    async def _drop_unusable_groups(self) -> list[str]:
        if self._untrainable:
            await self._discard(self._untrainable, "too_few_siblings")
            self._untrainable = []
        claimed = set(self._claims.claimed())
        oldest: dict[str, int] = {}
        stale = []
        for gid in self._ledger.complete_group_ids():
            if gid in claimed:
                continue
            versions = [v for row in self._data_plane.rows(gid) for v in row.policy_versions()]
            oldest[gid] = min(versions, default=self.step)
            if self.step - oldest[gid] > self._cfg.max_staleness:
                stale.append(gid)
                del oldest[gid]
        if stale:
            log.info("discarding %d groups older than max_staleness=%d", len(stale), self._cfg.max_staleness)
            await self._discard(stale, "stale")
        if self._drop_zero_signal and (flat := [gid for gid in oldest if self._no_signal(gid)]):
            # Dynamic sampling (DAPO): equal rewards give every sibling advantage 0; the step takes other groups.
            await self._discard(flat, "zero_signal")
            for gid in flat:
                del oldest[gid]
        # The nearest to going stale first (stable: admission order among equals). After a restore the ledger holds
        # more complete groups than a step takes, and a group whose turns were continued with an older policy
        # than its neighbours' would otherwise wait behind them until it is too stale to train.
        return sorted(oldest, key=oldest.__getitem__)

    def _no_signal(self, group_id: str) -> bool:
        rewards = {row.reward for row in self._data_plane.rows(group_id)}
        return len(rewards) == 1

    async def _discard(self, group_ids: list[str], reason: str) -> None:
        async with self._data_plane.barrier:
            if self._audit is not None:
                # Durable before the deletions journal it: a restore that keeps them is never ahead of the audit
                # log (a kill between the two once left a restored discard the checker took for a lost group).
                self._audit.emit(GroupsDiscarded, group_ids=group_ids, reason=reason)
                self._audit.flush()
            self._data_plane.delete(group_ids)
            self._ledger.finish(group_ids)
        self._stats.groups_discarded[reason] += len(group_ids)
        self._on_groups_finished()

    async def _refit(self, version: int) -> tuple[float, int, dict[int, int]]:
        """Trainer weights into every live engine, in place and in parallel: (seconds, bytes of one copy, each
        engine's tokens generated so far). The
        bytes are serialized once, in the trainer's process, and go to the engines through Ray's object store,
        never through this one."""
        started = time.monotonic()
        self._admission.add(REFIT_HOLDER)
        try:
            blob = self._trainer.weights_blob.remote()
            loaded = await self._engines.load_weights(blob, version)
        finally:
            self._admission.release(REFIT_HOLDER)
        tokens = {int(one["engine"]): int(one["tokens_generated"]) for one in loaded if "engine" in one}
        return time.monotonic() - started, max((int(one["bytes"]) for one in loaded), default=0), tokens
