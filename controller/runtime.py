"""One training run: place the processes, wire the pumps, run until `steps`, stop.

The controller owns the pumps, the data plane, the ledgers, the dataloader, the
admission gate and the deadline registry; each is its own small object, so the snapshot
work can reach each piece without going through a god class.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from turnkeep.controller.checkpoint_announcements import CheckpointAnnouncements
from turnkeep.controller.journal.journal_flusher import flush_journal_forever
from turnkeep.controller.journal.journal_prune import prune_journals
from turnkeep.controller.journal.records import REPLAY_BATCHES
from turnkeep.controller.journal.replay import state_at
from turnkeep.controller.journal.state_journal import BASE_KEY, JournalRef, JournalSwitch, StateJournal, base_marker
from turnkeep.controller.processes import EnvServerEndpoint, Processes
from turnkeep.controller.pumps.env_client import EnvClient
from turnkeep.controller.pumps.env_router import EnvRouter, EnvServerLink
from turnkeep.controller.pumps.eval_pump import EvalPump
from turnkeep.controller.pumps.rollout_pump import RolloutPump
from turnkeep.controller.pumps.supervision import supervise_pumps
from turnkeep.controller.pumps.train_pump import StepReport, TrainPump
from turnkeep.controller.rollout_levels import RolloutLevelPlan
from turnkeep.controller.state.claim_ledger import ClaimLedger
from turnkeep.controller.state.cut_state import capture_cut
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.dataloader import PromptDataloader
from turnkeep.controller.state.eval_journal import EvalJournal
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.controller.state.prompt_sources import PromptSource
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.controller.stores.metrics import MetricsSink
from turnkeep.controller.stores.trainer_checkpoint import (
    CONTROLLER_STATE,
    CheckpointIdentity,
    write_trainer_checkpoint,
)
from turnkeep.primitives.audit_log import AuditLog
from turnkeep.primitives.deadlines import DeadlineRegistry
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.audit import CutTaken, HoldChanged, SnapshotPublished
from turnkeep.schemas.choices import CutKind
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import Problem

log = logging.getLogger("turnkeep.run")


@dataclass
class RunSummary:
    steps: int
    wall_s: float
    run_dir: Path
    last_metrics: dict | None
    peak_rss_mib: float
    preempted: str | None = None
    """What a preemption's final save left (None when the run was not preempted)."""
    steps_trained: int | None = None
    """Steps this process trained (`steps` is where the run stands: a restored run began past 0)."""


class Controller:
    def __init__(
        self, cfg: TurnkeepConfig, processes: Processes, session: aiohttp.ClientSession, max_steps: int | None, *,
        prompts: PromptSource, level_plans: dict[str, RolloutLevelPlan], audit: AuditLog | None = None,
        checkpoint_identity: CheckpointIdentity | None = None,
        checkpoint_announcements: CheckpointAnnouncements | None = None, eval_problems: list[Problem] = (),
    ):
        """`prompts`: where the dataloader's prompts come from; `level_plans`: each environment's recovery level,
        from what its server reports (`controller.rollout_levels.plan_levels`); `checkpoint_announcements`: where
        each trainer checkpoint is announced (the run workflow connects to it once it runs)."""
        self.cfg = cfg
        self.processes = processes
        self.audit = audit
        self._checkpoint_identity = checkpoint_identity
        self.checkpoint_announcements = checkpoint_announcements or CheckpointAnnouncements()
        self._stop_requested = asyncio.Event()
        self.stop_reason: str | None = None
        self.last_metrics: dict | None = None
        self._build_state(prompts, max_steps)
        self.env_client = _env_router(cfg, processes, session)
        self.rollouts = self._rollout_pump(level_plans)
        self.training = self._train_pump()
        self.evaluations = EvalPump(
            cfg.eval, list(eval_problems), self.env_client, EvalJournal(cfg.run.run_dir), self.admission,
            cfg.eval.concurrency(cfg.policy.engines, cfg.policy.max_num_seqs), cfg.rollout.rollout_timeout_s,
            self.metrics.evaluation, cfg.run.run_dir)

    def _build_state(self, prompts: PromptSource, max_steps: int | None) -> None:
        """The holds, the ledgers, the data plane and the dataloader the pumps share (the snapshot work reaches
        each one here, not through the pumps)."""
        cfg = self.cfg
        self.stats = RunStats()
        self.admission = HoldSet("admission")
        # Rollout clocks pause for their own holders (a snapshot, a colocated switch), not for a refit.
        self.deadline_holds = HoldSet("deadlines")
        self.deadlines = DeadlineRegistry(self.deadline_holds)
        self.journal = JournalSwitch()
        self.dataloader = PromptDataloader(prompts, cfg.run.seed, cfg.environments, shuffle=cfg.data.shuffle,
                                           journal=self.journal)
        self.ledger = GroupLedger(journal=self.journal)
        self.claims = ClaimLedger()
        self.data_plane = DataPlane(self.journal)
        self.metrics = MetricsSink(cfg.run.run_dir, self.stats, max_steps)

    def _rollout_pump(self, level_plans: dict[str, RolloutLevelPlan]) -> RolloutPump:
        # The train pump is built next: a settled group reaches it through `self.training` when it settles.
        return RolloutPump(
            self.cfg.rollout,
            self.cfg.inflight_group_limit(),
            self.dataloader,
            self.ledger,
            self.data_plane,
            self.env_client,
            self.admission,
            self.deadlines,
            self.stats,
            on_group_settled=lambda gid, ok: self.training.group_settled(gid, ok),
            plans=level_plans,
            audit=self.audit,
        )

    def _train_pump(self) -> TrainPump:
        return TrainPump(
            self.cfg.train,
            self.ledger,
            self.claims,
            self.data_plane,
            self.processes.trainer,
            self.processes.engines,
            self.admission,
            self.stats,
            on_groups_finished=self.rollouts.group_finished,
            write_checkpoint=self._checkpoint,
            announce_checkpoint=self.checkpoint_announcements.announce,
            on_step=self._on_step,
            audit=self.audit,
            drop_zero_signal=self.cfg.algorithm.drop_zero_signal,
            run_dir=self.cfg.run.run_dir,
        )

    def _on_step(self, report: StepReport) -> None:
        self.last_metrics = self.metrics.step(report, epoch=self.dataloader.epoch)
        self.evaluations.after_step(report.step)

    def state_dict(self) -> dict:
        return {
            "step": self.training.step,
            "dataloader": self.dataloader.state_dict(),
            "data_plane": self.data_plane.state_dict(),
            "claim_ledger": self.claims.state_dict(),
            "group_ledger": self.ledger.state_dict(),
            REPLAY_BATCHES: [list(batch) for batch in self.training.replay_batches],
        }

    # -- what a restore needs of the run (controller.restore.restore_target.RestoreTarget) --

    @property
    def reused_processes(self) -> bool:
        return self.processes.reused

    @property
    def next_group_index(self) -> int:
        return self.dataloader.next_index

    async def pause(self, holder: str) -> None:
        self.admission.add(holder)
        self.audit_hold("taken", holder, [self.admission.name])
        await self.processes.engines.close_admission(holder)

    async def resume(self, holder: str) -> None:
        await self.processes.engines.open_admission(holder)
        self.admission.release(holder)
        self.audit_hold("released", holder, [self.admission.name])

    async def load_trainer_checkpoint(self, directory: str, step: int) -> int:
        return await self.processes.trainer.load_checkpoint.remote(directory, step)

    async def trainer_progress(self) -> dict:
        return await self.processes.trainer.progress.remote()

    async def checkpoint_now(self, step: int) -> None:
        await self._checkpoint(step, "kept steps")
        self.training.checkpointed_step = step  # the anchor of the next snapshot: no second checkpoint of it

    async def load_policy_weights(self, version: int) -> None:
        await self.processes.engines.load_weights(self.processes.trainer.weights_blob.remote(), version)

    def load_state(self, state: dict, policy_version: int, *, checkpointed: bool) -> None:
        """Restore the dataloader, data plane and ledgers; claims are dropped so their groups are offered again."""
        self.dataloader.load_state_dict(state["dataloader"])
        self.data_plane.load_state_dict(state["data_plane"])
        self.ledger.load_state_dict(state["group_ledger"])
        self.claims.load_state_dict({"claims": {}})
        self.training.restore(int(state["step"]), policy_version, checkpointed=checkpointed,
                              replay_batches=state.get(REPLAY_BATCHES, []))
        self.training.hold_generation_during_replay()

    def level_plan(self, group_id: str) -> RolloutLevelPlan:
        return self.rollouts.groups.plan(group_id)

    def redispatch(self, continuations: dict) -> int:
        queued, settled = self.rollouts.restore(continuations)
        for group_id in settled:
            self.training.group_settled(group_id, bool(self.rollouts.settle(group_id)))
        return queued

    def audit_snapshot(self, checkpoint_id: str, step: int, snapshot_dir: str, cut_unix_s: float) -> None:
        if self.audit is not None:
            self.audit.emit(SnapshotPublished, checkpoint_id=checkpoint_id, step=step, snapshot_dir=snapshot_dir,
                            cut_unix_s=cut_unix_s)

    def audit_hold(self, change: str, holder: str, holds: list[str], lease_s: float | None = None) -> None:
        """A holder taken, renewed or released in the named hold sets (checked against its lease afterwards)."""
        if self.audit is not None:
            self.audit.emit(HoldChanged, change=change, holder=holder, holds=holds, lease_s=lease_s)

    def request_stop(self, reason: str) -> None:
        """Stop both pumps and return from `run` normally (a preemption that already saved)."""
        self.stop_reason = reason
        self._stop_requested.set()

    def start_journal(self, run_id: str, incarnation: int, restored_from: dict | None = None) -> None:
        """Journal every change from now on, from the state held now (the restored one, or a fresh run's empty one)."""
        if self.journal.started:
            self.journal.close()
        base = {**self.state_dict(), "claim_ledger": {"claims": {}}}
        self.journal.switch_to(StateJournal(self.cfg.run.run_dir, run_id, incarnation, base,
                                            restored_from=restored_from))
        self.ledger.begin_incarnation(incarnation)

    async def _checkpoint(self, step: int, trigger: str) -> None:
        """The trainer's files plus the controller's full state at one journal position, which later cuts replay
        from; the barrier only marks the position, the state is rebuilt from the journal outside it."""
        async with self.data_plane.barrier:
            capture = capture_cut(self, [])
            if self.audit is not None:
                self.audit.emit(CutTaken, kind=CutKind.TRAINER_CHECKPOINT, **capture.summary)
        journal = self.journal.current
        await journal.durable(capture.position.seq)
        ref = JournalRef.model_validate(capture.state["journal_ref"])
        state = await asyncio.to_thread(state_at, self.cfg.run.run_dir, ref)
        state["cut_unix_s"] = capture.state["cut_unix_s"]
        state[BASE_KEY] = base_marker(journal, capture.position)
        await write_trainer_checkpoint(
            self.cfg.run.run_dir, step, self.processes.trainer, state, self.cfg.train.keep_checkpoints,
            identity=self._checkpoint_identity,
            on_published=lambda final: journal.rebase(final / CONTROLLER_STATE, capture.position),
        )
        prune_journals(self.cfg.run.run_dir, journal)

    async def run(self, max_steps: int | None, watch: Awaitable[str] | None = None) -> None:
        """Run both pumps until `max_steps`; `watch` resolving (to a reason) stops the run early."""
        rollout_task = asyncio.create_task(self.rollouts.run(), name="rollout-pump")
        train_task = asyncio.create_task(self.training.run(max_steps), name="train-pump")
        stop_task = asyncio.create_task(self._stop_requested.wait(), name="stop-request")
        flush_task = asyncio.create_task(flush_journal_forever(lambda: self.data_plane.journal), name="journal-flush")
        eval_task = asyncio.create_task(self.evaluations.run(), name="evaluations")
        eval_task.add_done_callback(_log_crash)
        self.evaluations.before_training(self.training.step)
        try:
            await supervise_pumps(rollout_task, train_task, stop_task, watch)
            if not self._stop_requested.is_set() and not eval_task.done():
                await self.evaluations.finish()
        finally:
            flush_task.cancel()
            eval_task.cancel()
            await asyncio.gather(flush_task, eval_task, return_exceptions=True)


def _log_crash(task: asyncio.Task) -> None:
    # Evaluation never stops training: a failed one is logged, and the run goes on without it.
    if not task.cancelled() and task.exception() is not None:
        log.error("evaluations stopped: %s", task.exception(), exc_info=task.exception())


def _env_router(cfg: TurnkeepConfig, processes: Processes, session: aiohttp.ClientSession) -> EnvRouter:
    """One link per environment server of the run, each with its own client."""
    return EnvRouter(
        [EnvServerLink(EnvClient(ep.url, session, ep.token, ep.name), ep.environments, ep.attach,
                       revive=_reviver(processes, ep))
         for ep in processes.env_servers],
        absence_warn_s=cfg.env.absence_warn_s,
    )


def _reviver(processes: Processes, endpoint: EnvServerEndpoint):
    """The run's own environment server is started again when it dies; a stand-alone one is its operator's."""
    if endpoint.remote or processes.env is None:
        return None
    return processes.env.revive
