"""The restore steps of a restarted run, in DESIGN.md's order.

The recovery workflow's activities call these (so each step shows in the Temporal UI);
with snapshots off they run directly. Everything happens while the run is paused: the
controller's admission gate and the policy server's gate are held by
`recovery:<incarnation>` from `restore` until `resume`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from turnkeep.controller.fingerprint import fingerprint_fields
from turnkeep.controller.journal.replay import PastCut, resolve_state, resolve_state_past_cut
from turnkeep.controller.journal.state_journal import START_FILE, incarnation_dir
from turnkeep.controller.pumps.rollout_pump import Continuation
from turnkeep.controller.restore.restore_source import choose_source
from turnkeep.controller.restore.restore_target import RestoreTarget
from turnkeep.controller.restore.run_identity import RunIdentity
from turnkeep.controller.snapshot.cut import AGENTS_FROM
from turnkeep.controller.state.continuations import read_saved_agents
from turnkeep.controller.state.group_ledger import SiblingState
from turnkeep.controller.state.sealing import seal_stored_rows
from turnkeep.participants.client import ParticipantClient
from turnkeep.participants.errors import ParticipantRefused
from turnkeep.primitives.atomic_files import remove_stale_staging
from turnkeep.primitives.audit_log import segments_digest
from turnkeep.primitives.chaos_points import reached
from turnkeep.primitives.segment_format import JournalCorrupt
from turnkeep.schemas.audit import ContinuationRef, KeptAfterCut, KeptStep, Restored, RowRef
from turnkeep.schemas.choices import AgentsFrom
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.names import recovery_holder, recovery_workflow_id
from turnkeep.schemas.participant import RunningAgent, SavedAgent
from turnkeep.schemas.recovery import RecoverySource, RestoreResult, SourceKind

log = logging.getLogger("turnkeep.recovery")


class CrashRestoreError(RuntimeError):
    """The chosen source could not be restored; the message says what disagreed."""


class CrashRestore:
    def __init__(
        self, cfg: TurnkeepConfig, target: RestoreTarget, identity: RunIdentity,
        environments: list[ParticipantClient],
    ) -> None:
        self._cfg = cfg
        self._target = target
        self._identity = identity
        self._environments = {env.name: env for env in environments}
        self.holder = recovery_holder(identity.incarnation)
        self.recovery_id = recovery_workflow_id(identity.run_id, identity.incarnation)
        self._paused_at: float | None = None

    def choose(self) -> RecoverySource:
        return choose_source(self._cfg.run.run_dir, self._identity.run_id, fingerprint_fields(self._cfg))

    async def restore(self, source: RecoverySource) -> RestoreResult:
        target = self._target
        for skipped in source.skipped:
            log.warning("not restoring from %s: %s: %s", skipped.path, skipped.problem, skipped.detail)
        await self._pause()
        _remove_partial_staging(self._cfg.run.run_dir)
        _set_aside_rejected(self._cfg.run.run_dir, source, self._identity.incarnation)
        if source.kind is SourceKind.FRESH:
            first = self._first_journal(source)
            # A trainer rebuilt from its ranks' copies before the run's first checkpoint goes on from the first
            # journal, its steps kept, as a kept trainer after a snapshot does.
            if target.reused_processes and first is not None and (kept := await self._kept_trainer(source, first)):
                return await self._restore_state(*kept)
            if target.reused_processes:
                raise CrashRestoreError(
                    f"no trainer checkpoint could be restored ({source.reason}), and the processes kept from the "
                    "crashed controller hold trained weights; run the same command again: they are stopped now "
                    "and a fresh start follows")
            if first is None:
                target.start_journal(self._identity.run_id, self._identity.incarnation)
                self._audit(source, None, {})
                return RestoreResult(step=0, policy_version=0, data_plane_rows=0, unfinished_groups=0,
                                     continuations=0, restarted_siblings=0)
            # No checkpoint, but the trainer's step 0 is the initial model the first incarnation started from: its
            # journal is kept as a checkpoint's would be, every train step in it undone.
            state, past = self._restored_state(source, first)
            return await self._restore_state(source, 0, state, past)
        if (kept := await self._kept_trainer(source)) is not None:
            await reached("restore", self._cfg.run.run_dir)
            return await self._restore_state(*kept)
        trainer_dir = Path(source.checkpoint_dir or "") / "trainer"
        version = await target.load_trainer_checkpoint(str(trainer_dir), source.step)
        if version != source.policy_version:
            raise CrashRestoreError(f"{trainer_dir} holds policy version {version}, its manifest says "
                                f"{source.policy_version}")
        await reached("restore", self._cfg.run.run_dir)
        state, past = self._restored_state(source, Path(source.controller_state or ""))
        return await self._restore_state(source, version, state, past)

    async def _kept_trainer(self, source: RecoverySource,
                            base: Path | None = None) -> tuple[RecoverySource, int, dict, PastCut] | None:
        """A controller that died alone left the trainer running at the step it reached (or a rebuilt trainer
        loaded its ranks' copies of it): when the journals hold the run up to that very step, the restore goes on
        from there with that trainer, and no step is undone. `base`: the state the journals go on from (the
        source's by default). (source at the trainer's step, version, state, what was kept past the cut), or
        None: restore as usual."""
        if not self._target.reused_processes or not self._cfg.rollout_recovery.keep_after_cut:
            return None
        path = base or Path(source.controller_state or "")
        try:
            raw = orjson.loads(path.read_bytes())
            if source.snapshot_dir and raw.get(AGENTS_FROM) != AgentsFrom.JOURNAL:
                return None  # parked agents are saved as of the cut: nothing after it can be kept
            progress = await self._target.trainer_progress()
            version = int(progress["version"])
            state, past = resolve_state_past_cut(self._cfg.run.run_dir, raw, self._identity.incarnation,
                                                 keep_steps=True, trained_since=progress.get("last_step"))
        except (OSError, orjson.JSONDecodeError, JournalCorrupt) as err:
            log.info("not keeping the surviving trainer's steps: %s", err)
            return None
        if past is None or past.stopped or int(state["step"]) != version or version < source.step:
            log.info("not keeping the surviving trainer's steps: it is at version %d, the journals reach step %s%s",
                     version, state["step"], f" (damaged: {past.stopped})" if past and past.stopped else "")
            return None
        steps = [step["step"] for step in past.kept_steps]
        which = "rebuilt from its ranks' copies" if progress.get("from_copies") else "that survived the controller"
        reason = (f"{source.reason}; the trainer {which} is at step {version}, which the journals reach: steps "
                  f"{steps} kept, none undone" if steps else source.reason)
        log.info("keeping the trainer %s at step %d: %d journal records after the cut applied, train steps %s kept",
                 which, version, past.records, steps)
        return source.model_copy(update={"step": version, "policy_version": version, "reason": reason}), version, \
            state, past

    async def _restore_state(self, source: RecoverySource, version: int, state: dict,
                             past: PastCut | None) -> RestoreResult:
        target = self._target
        kept = past is not None and bool(past.kept_steps)
        # Step 0 of a fresh restart has no checkpoint of its own yet; nor has a kept trainer's step.
        target.load_state(state, version, checkpointed=source.kind is not SourceKind.FRESH and not kept)
        # The restored state is the new journal's base; every change from here on (the reruns below) is journaled.
        # A kept trainer's state is no restore of its cut: a later restore of that cut must not go on from it.
        target.start_journal(self._identity.run_id, self._identity.incarnation,
                             restored_from=past.restored_from if past and not kept else None)
        if sealed := seal_stored_rows(target.data_plane, target.ledger):
            # The cut fell between their rows' store and their seal: the rows are in, they are never continued.
            log.info("%d siblings had their rows stored at the cut and are sealed now", len(sealed))
        if source.snapshot_dir and state.get(AGENTS_FROM) != AgentsFrom.JOURNAL:
            continuations = await self._continue_saved_agents(source, state)
        else:
            # A trainer checkpoint or a journal snapshot saved no agents: the environment servers' turn journals
            # hold them.
            # Kept turns may come from the policies of the undone steps: the newest of those bounds them.
            newest = max(version, past.newest_policy_version) if past else version
            continuations, started_over = await self._continue_journaled_agents(newest)
            self._audit(source, state, continuations, started_over, agents_from=AgentsFrom.JOURNAL, past=past)
        restarted = target.redispatch(continuations) - len(continuations)
        if kept:
            # Until its own checkpoint, a later crash restores the cut's and undoes these steps after all.
            await target.checkpoint_now(version)
        log.info("restored step %d (policy version %d) from %s: %s", source.step, version, source.kind, source.reason)
        return RestoreResult(
            step=source.step, policy_version=version, data_plane_rows=target.data_plane.num_rows(),
            unfinished_groups=target.ledger.inflight(), continuations=len(continuations), restarted_siblings=restarted,
            kept_after_cut_records=past.records if past else 0,
            undone_steps=[step["step"] for step in past.lost_steps] if past else [],
        )

    def _first_journal(self, source: RecoverySource) -> Path | None:
        """The first incarnation's journal base (an empty state at step 0), for a fresh restart that keeps what the
        journals hold; None when there is nothing to keep, or when trainer checkpoints were there and refused (the
        run then starts over as its reason says, keeping nothing of a run it cannot trust)."""
        start = incarnation_dir(self._cfg.run.run_dir, 1) / START_FILE
        if (not self._cfg.rollout_recovery.keep_after_cut or source.skipped or self._identity.incarnation <= 1
                or not start.is_file()):
            return None
        return start

    def _restored_state(self, source: RecoverySource, path: Path) -> tuple[dict, PastCut | None]:
        """The controller state at `path` (the source's, or the first journal's base for a fresh restart), carried on
        past its cut to the end of its journal (unless the config says otherwise, or the snapshot parked its agents:
        they are saved as of the cut)."""
        try:
            raw = orjson.loads(path.read_bytes())
            parked = bool(source.snapshot_dir) and raw.get(AGENTS_FROM) != AgentsFrom.JOURNAL
            if not self._cfg.rollout_recovery.keep_after_cut or parked:
                return resolve_state(self._cfg.run.run_dir, raw), None
            state, past = resolve_state_past_cut(self._cfg.run.run_dir, raw, self._identity.incarnation)
        except JournalCorrupt as err:
            raise CrashRestoreError(f"{path} cannot be rebuilt from the journal: {err}") from None
        if past is not None:
            if past.stopped:
                log.warning("the journal after the restored cut is damaged; the restore keeps the %d records before "
                            "the damage: %s", past.records, past.stopped)
            log.info("kept %d journal records after the cut; %d trainer steps after it are undone and train again "
                     "first", past.records, len(past.lost_steps))
        return state, past

    async def _continue_saved_agents(self, source: RecoverySource, state: dict) -> dict:
        """The snapshot's parked agents, held again by their environment servers."""
        saved = read_saved_agents(Path(source.snapshot_dir or ""))
        # Only environments at the `turn` level continue saved agents; the others rerun those siblings.
        every = self._continuations(saved)
        continuations = {key: cont for key, cont in every.items()
                         if self._target.level_plan(key[0]).continues_saved_turns}
        rerun = [cont.rollout_id for key, cont in every.items() if key not in continuations]
        self._audit(source, state, continuations, rerun)
        for path in source.agents_files:
            participant = self._environments.get(Path(path).parent.name)
            if participant is None:
                raise CrashRestoreError(f"{path} belongs to participant {Path(path).parent.name!r}, which this run lacks")
            await participant.restore(self.recovery_id, str(Path(path).parent))
        return continuations

    async def _continue_journaled_agents(self, version: int) -> tuple[dict, list[str]]:
        """Every rollout the restored ledger has running or cut short by a crash (cut short covers an incarnation
        that restored it and died before running it), continued from the newest boundary its server journaled
        under the incarnation that started it, with no turn of a policy newer than `version` (the consistent-cut
        rule: docs/snapshots.md, "Journal snapshots"). Returns the continuations, and the rollouts that start over because
        their level does not continue saved turns (restart_only environments are lowered to such a level), which
        the audit names."""
        ledger = self._target.ledger
        running = {rollout_id: (group_id, incarnation) for group_id in ledger.group_ids()
                   for rollout_id, incarnation in ledger.continuable_attempts(group_id).items()
                   if rollout_id not in ledger.abandoned(group_id)}
        wanted = {rollout_id: RunningAgent(max_version=version, incarnation=incarnation)
                  for rollout_id, (group_id, incarnation) in running.items()
                  if self._target.level_plan(group_id).continues_saved_turns}
        started_over = [rollout_id for rollout_id in running if rollout_id not in wanted]
        continuations: dict[tuple[str, int], Continuation] = {}
        if not wanted:
            return continuations, started_over
        for name, participant in sorted(self._environments.items()):
            try:
                reply = await participant.restore_from_journal(self.recovery_id, wanted)
            except ParticipantRefused as err:
                log.warning("environment server %s continues no agent from a turn journal (%s); its running "
                            "agents start over", name, err)
                continue
            for held in reply.held:
                group_id, sibling, _ = held.rollout_id.rsplit(".", 2)
                if held.rollout_id not in wanted:
                    raise CrashRestoreError(f"environment server {name} holds {held.rollout_id}, which the restored "
                                            "ledger does not have running")
                continuations[(group_id, int(sibling))] = Continuation(
                    rollout_id=held.rollout_id, turn_index=held.turn_index, segments=held.segments,
                    boundary_sha=held.boundary_sha, partial_tokens=held.partial_tokens)
        log.info("%d of %d running agents continue from the environment servers' turn journals",
                 len(continuations), len(wanted))
        return continuations, started_over

    async def load_policy_weights(self, version: int) -> None:
        """The restored trainer's weights into the policy server, through Ray (a run without Temporal;
        with it, the recovery workflow's `policy.load_weights` does this in the policy server's process)."""
        await self._target.load_policy_weights(version)

    async def resume(self) -> float:
        """Policy first, then agents (the controller's admission gate); seconds the run was paused."""
        await self._target.resume(self.holder)
        paused_s = 0.0 if self._paused_at is None else time.monotonic() - self._paused_at
        self._paused_at = None
        return round(paused_s, 3)

    async def _pause(self) -> None:
        await self._target.pause(self.holder)
        if self._paused_at is None:
            self._paused_at = time.monotonic()

    def _continuations(self, saved: list[SavedAgent]) -> dict[tuple[str, int], Continuation]:
        ledger = self._target.ledger
        continuations = {}
        for agent in saved:
            req = agent.request
            if req.rollout_id in ledger.abandoned(req.group_id):
                continue  # a whole-group rerun abandoned it after the snapshot's commit
            entry = ledger.sibling(req.group_id, req.sibling)
            if entry is None or entry.state is not SiblingState.RUNNING or entry.attempts != req.attempt + 1:
                raise CrashRestoreError(
                    f"saved agent {req.rollout_id} does not match the restored ledger ({entry}); the snapshot's "
                    "agents and controller state disagree"
                )
            continuations[(req.group_id, req.sibling)] = Continuation(
                rollout_id=req.rollout_id, turn_index=agent.boundary.turn_index,
                segments=len(agent.boundary.segments), boundary_sha=segments_digest(agent.boundary.segments),
            )
        return continuations

    def _audit(
        self, source: RecoverySource, state: dict | None, continuations: dict, rerun_agents: Sequence[str] = (),
        agents_from: AgentsFrom = AgentsFrom.SNAPSHOT, past: PastCut | None = None,
    ) -> None:
        target = self._target
        if target.audit is None:
            return
        rows = [RowRef(group_id=gid, sibling=row.sibling, rollout_id=f"{gid}.{row.sibling}.{row.attempt}")
                for gid in target.data_plane.group_ids() for row in target.data_plane.rows(gid)]
        refs = [
            ContinuationRef(
                rollout_id=cont.rollout_id, next_rollout_id=f"{gid}.{sib}.{_attempt_of(cont.rollout_id) + 1}",
                group_id=gid, sibling=sib, turn_index=cont.turn_index, boundary_sha=cont.boundary_sha,
                started_by=_started_by(target.ledger, gid, sib), partial_tokens=cont.partial_tokens,
            )
            for (gid, sib), cont in sorted(continuations.items())
        ]
        unfinished = [g["group_id"] for g in state["group_ledger"]["groups"]] if state else []
        target.audit.emit(
            Restored, source=source.kind, step=source.step, policy_version=source.policy_version,
            snapshot_dir=source.snapshot_dir, checkpoint_dir=source.checkpoint_dir, reason=source.reason,
            skipped=source.skipped, cut_unix_s=state.get("cut_unix_s") if state else None, rows=rows,
            continuations=refs, unfinished_groups=unfinished, next_group_index=target.next_group_index,
            agents_not_continued=sorted(rerun_agents), agents_from=agents_from,
            kept_after_cut=None if past is None else KeptAfterCut(
                records=past.records, undone_steps=[step["step"] for step in past.lost_steps],
                newest_policy_version=max(source.policy_version, past.newest_policy_version),
                journal=past.journal, stopped=past.stopped,
                kept_steps=[KeptStep(step=step["step"], group_ids=step["groups"]) for step in past.kept_steps]),
        )
        target.audit.flush()


def _started_by(ledger, group_id: str, sibling: int) -> int:
    entry = ledger.sibling(group_id, sibling)
    return 0 if entry is None else entry.incarnation


def _attempt_of(rollout_id: str) -> int:
    return int(rollout_id.rsplit(".", 1)[1])


def _remove_partial_staging(run_dir: Path) -> None:
    """Staging directories of the dead incarnation are never read; remove them so nothing piles up."""
    root = run_dir / "checkpoints"
    if root.is_dir():
        for parent in [root, *(p / "snapshots" for p in root.iterdir() if p.is_dir())]:
            remove_stale_staging(parent)


def _set_aside_rejected(run_dir: Path, source: RecoverySource, incarnation: int) -> None:
    """Move trainer checkpoints that failed verification out of the way, kept for inspection.

    The run writes those steps again; a rejected `step_N` left in place would block that.
    """
    aside = run_dir / "checkpoints" / "rejected"
    for skipped in source.skipped:
        path = Path(skipped.path)
        if path.parent == run_dir / "checkpoints" and path.exists():
            aside.mkdir(exist_ok=True)
            target = aside / f"{path.name}.incarnation-{incarnation}"
            path.rename(target)
            log.warning("trainer checkpoint %s failed verification (%s); moved to %s", path, skipped.problem, target)
