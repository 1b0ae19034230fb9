"""What a restore writes to the audit log, without the stack: its pause as a hold taken and released,
and the saved (or journaled) agents it continues apart from those its level reruns from scratch."""

from __future__ import annotations

import asyncio
from types import MethodType, SimpleNamespace

import pytest

from turnkeep.controller.engines.engine_pool import Engine, EnginePool
from turnkeep.controller.pumps.rollout_pump import Continuation
from turnkeep.controller.restore.crash_restore import CrashRestore, CrashRestoreError
from turnkeep.controller.runtime import Controller
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.primitives.audit_log import AUDIT_FILE, AuditLog, read_audit
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.audit import Restored
from turnkeep.schemas.participant import HeldBoundary, RestoreReply
from turnkeep.schemas.recovery import RecoverySource, SourceKind
from turnkeep.schemas.rollout import Problem


class _Gate:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def __getattr__(self, name: str):
        calls = self.calls

        class _Remote:
            @staticmethod
            async def remote(holder: str) -> bool:
                calls.append((name, holder))
                return True

        return _Remote


def _restore(target) -> CrashRestore:
    return CrashRestore(None, target, SimpleNamespace(incarnation=4, run_id="r"), [])


def test_the_restore_pause_is_a_hold_taken_and_released_on_admission_and_the_policy_gate():
    changes, gate = [], []
    engines = EnginePool([Engine(0, _Gate(gate), "http://e0")])
    controller = SimpleNamespace(admission=HoldSet("admission"), audit_hold=lambda *args: changes.append(args),
                                 processes=SimpleNamespace(engines=engines))
    controller.pause = MethodType(Controller.pause, controller)
    controller.resume = MethodType(Controller.resume, controller)
    restore = _restore(controller)
    asyncio.run(restore._pause())
    assert not controller.admission.is_clear() and gate == [("close_admission", "recovery:4")]
    asyncio.run(restore.resume())
    assert changes == [("taken", "recovery:4", ["admission"]), ("released", "recovery:4", ["admission"])]
    assert controller.admission.is_clear() and gate[-1] == ("open_admission", "recovery:4")


def test_the_restored_event_names_the_saved_agents_rerun_from_scratch(tmp_path):
    audit = AuditLog(tmp_path / AUDIT_FILE, 4)
    ledger = GroupLedger()
    ledger.incarnation = 3
    ledger.admit("g0000007", Problem(question="Q 1+1", answer=2), 4)
    ledger.start_attempt("g0000007", 1)
    target = SimpleNamespace(audit=audit, data_plane=DataPlane(), next_group_index=9, ledger=ledger)
    source = RecoverySource(kind=SourceKind.SNAPSHOT, step=3, policy_version=3, checkpoint_dir="c", snapshot_dir="s",
                            reason="newest")
    state = {"cut_unix_s": 12.5, "group_ledger": {"groups": [{"group_id": "g0000007"}, {"group_id": "g0000008"}]}}
    continued = {("g0000007", 1): Continuation(rollout_id="g0000007.1.0", turn_index=2, segments=5,
                                               boundary_sha="abc")}
    _restore(target)._audit(source, state, continued, ["g0000008.1.0", "g0000008.0.2"])
    [event] = list(read_audit(tmp_path))
    assert isinstance(event, Restored) and event.cut_unix_s == 12.5 and event.next_group_index == 9
    assert [c.next_rollout_id for c in event.continuations] == ["g0000007.1.1"]
    assert event.continuations[0].started_by == 3  # the incarnation that started the saved attempt
    assert event.agents_not_continued == ["g0000008.0.2", "g0000008.1.0"]


def test_a_fresh_restart_keeps_the_first_journal_only_when_nothing_was_refused(tmp_path):
    from turnkeep.controller.journal.state_journal import START_FILE, incarnation_dir
    from turnkeep.schemas.recovery import SkippedCandidate

    def first(keep=True, incarnation=4, skipped=()):
        cfg = SimpleNamespace(run=SimpleNamespace(run_dir=tmp_path),
                              rollout_recovery=SimpleNamespace(keep_after_cut=keep))
        restore = CrashRestore(cfg, None, SimpleNamespace(incarnation=incarnation, run_id="r"), [])
        return restore._first_journal(RecoverySource(kind=SourceKind.FRESH, step=0, policy_version=0,
                                                     reason="no trainer checkpoint", skipped=list(skipped)))

    assert first() is None  # the first incarnation left no journal
    start = incarnation_dir(tmp_path, 1) / START_FILE
    start.parent.mkdir(parents=True)
    start.write_text("{}")
    assert first() == start
    assert first(keep=False) is None and first(incarnation=1) is None
    refused = SkippedCandidate(path=str(tmp_path / "checkpoints" / "step_4"), problem="fingerprint_differs",
                               detail="model.path changed")
    assert first(skipped=[refused]) is None


class _JournalServer:
    """An environment server's answer to a restore from its turn journal: it holds what it was asked for."""

    name = "env"

    def __init__(self) -> None:
        self.asked: dict = {}

    async def restore_from_journal(self, recovery_id: str, wanted: dict) -> RestoreReply:
        self.asked = dict(wanted)
        held = [HeldBoundary(rollout_id=rid, turn_index=1, segments=3, boundary_sha="b") for rid in sorted(wanted)]
        return RestoreReply(name=self.name, checkpoint_id=recovery_id, restored=sorted(wanted), held=held)


def test_a_journal_restore_names_the_running_agents_its_level_starts_over():
    """A group whose level keeps no turns (sibling, prompt_group) is never asked of the turn journal; the restore
    names its running agents as started over, so the audit accounts for every agent that was running."""
    ledger = GroupLedger()
    ledger.incarnation = 3
    for group_id in ("g0000001", "g0000002"):
        ledger.admit(group_id, Problem(question="Q 1+1", answer=2), 2)
        ledger.start_attempt(group_id, 0)
    levels = {"g0000001": True, "g0000002": False}
    target = SimpleNamespace(ledger=ledger,
                             level_plan=lambda group_id: SimpleNamespace(continues_saved_turns=levels[group_id]))
    server = _JournalServer()
    restore = CrashRestore(None, target, SimpleNamespace(incarnation=4, run_id="r"), [server])

    continuations, started_over = asyncio.run(restore._continue_journaled_agents(7))

    assert list(server.asked) == ["g0000001.0.0"]
    assert server.asked["g0000001.0.0"].max_version == 7 and server.asked["g0000001.0.0"].incarnation == 3
    assert list(continuations) == [("g0000001", 0)] and continuations[("g0000001", 0)].turn_index == 1
    assert started_over == ["g0000002.0.0"]


def test_a_trainer_rebuilt_before_the_first_checkpoint_is_kept_from_the_first_journal_or_refused(tmp_path):
    """No checkpoint yet, processes re-attached: a trainer the journals reach (loaded from its ranks' copies) goes on
    from the first journal's base with its steps kept; one they do not reach holds weights no restore can explain,
    and the restore refuses, as before."""
    async def pause(holder: str) -> None:
        return None

    cfg = SimpleNamespace(run=SimpleNamespace(run_dir=tmp_path), rollout_recovery=SimpleNamespace(keep_after_cut=True))
    restore = CrashRestore(cfg, SimpleNamespace(reused_processes=True, pause=pause),
                           SimpleNamespace(incarnation=2, run_id="r"), [])
    start = tmp_path / "start.json"
    restore._first_journal = lambda source: start
    fresh = RecoverySource(kind=SourceKind.FRESH, step=0, policy_version=0, reason="no trainer checkpoint yet")
    bases = []

    async def kept(source, base=None):
        bases.append(base)
        return (source.model_copy(update={"step": 7}), 7, {"step": 7}, None) if trainer_reached else None

    async def restored(source, version, state, past):
        return source.step, version

    restore._kept_trainer, restore._restore_state = kept, restored
    trainer_reached = True
    assert asyncio.run(restore.restore(fresh)) == (7, 7) and bases == [start]
    trainer_reached = False
    with pytest.raises(CrashRestoreError, match="the processes kept from the crashed controller hold trained weights"):
        asyncio.run(restore.restore(fresh))
