"""The chaos command with journal snapshots (`snapshot.agents = "journal"`) at the `token` level: nothing is
parked, so every restore from a snapshot continues the running agents from the environment servers' turn
journals, a turn cut mid-generation from its journaled tokens. Kills land in the Gym phase (the journal mark),
at the cut and at a random moment of training; the invariants are checked from the audit log after each
restart."""

from __future__ import annotations

import pytest

from tests.run_command import EVERY_KIND, passing_chaos_run, small_run_settings
from turnkeep.primitives.audit_log import read_audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

POINTS = ["gym_prepare", "cut", "training"]


def test_kills_around_journal_snapshots_restore_running_agents_from_the_journals(stack_config) -> None:
    run_dir, report = passing_chaos_run(
        "tk-chaosj-", "--kills", str(len(POINTS)), "--points", ",".join(POINTS),
        "--steps", "30", "--seed", "5", "--phase-timeout-s", "240", *small_run_settings(stack_config),
        "--set", "snapshot.agents=journal",
        # Slower tools keep agents mid-rollout at every cut, so a restore has running agents to continue; every
        # environment kind at once, so rollouts last unlike lengths and do not all end together: with the
        # calculator alone every group of a step ran in lockstep, and the agents running at a checkpoint's cut were
        # the ones it had just admitted, with no turn yet.
        "--set", f"environments={EVERY_KIND}", "--set", "env.tool_latency_s=0.3",
        # The token level, its turns (16 tokens at most here) journaled in chunks of 4 tokens.
        "--set", "rollout_recovery.target_level=token", "--set", "env.journal_partial_tokens=4",
    )
    results = report["verdict"]["results"]
    assert all(r["ok"] for r in results), results

    events = list(read_audit(run_dir))
    restores = [e for e in events if e.event == "restored" and e.source != "fresh"]
    # Every trainer checkpoint is a snapshot: whether the newest one had a published snapshot under it yet
    # (source "snapshot") or not ("trainer_checkpoint") depends on where the kill landed, and either way its
    # running agents come from the turn journals.
    assert restores and all(e.agents_from == "journal" for e in restores), [(e.source, e.agents_from) for e in restores]
    assert {e.source for e in restores} <= {"snapshot", "trainer_checkpoint"}, [e.source for e in restores]
    # Admission never closed for a snapshot (a restore's own pause is a recovery holder).
    assert not [e for e in events if e.event == "hold_changed" and e.change == "taken" and "admission" in e.holds
                and e.holder.startswith("snapshot:")]
    # Each restore kept the journal past its cut (the default), and the invariant 7 check held it to what the
    # killed incarnation sealed and admitted after its cut.
    assert all(e.kept_after_cut is not None and e.kept_after_cut.stopped is None for e in restores), restores
    assert any(e.kept_after_cut.records > 0 for e in restores), [e.kept_after_cut for e in restores]
    # The steps a restore undid train again first, each on the batch the lost step trained.
    for restore in (e for e in restores if e.kept_after_cut.undone_steps):
        lost = {e.step: sorted(e.group_ids) for e in events if e.event == "step_trained" and e.inc < restore.inc
                and e.step in restore.kept_after_cut.undone_steps}
        again = {e.step: sorted(e.group_ids) for e in events if e.event == "step_trained" and e.inc == restore.inc
                 and e.step in lost}
        assert again == {step: lost[step] for step in again}, (restore.inc, lost, again)
    continued = [c for e in restores for c in e.continuations]
    assert continued, "no restore continued a running agent from a turn journal"
    # Each continued agent resumed from a turn its attempt committed, of the restored lineage (invariant 2's
    # journal check), and some sealed a row on that exact prefix.
    checked = [r for r in results if r["name"].startswith("journaled agents")]
    assert checked and checked[0]["checked"] >= 1, checked
    # The server flushes its audit log before each journal batch: every continued boundary is in it, kills or not.
    assert checked[0]["checked"] == len(continued) and not checked[0]["note"], checked
    assert report["verdict"]["counts"]["continuations_sealed"] >= 1
    # Turns streamed and were journaled in chunks; whichever moment the kills hit, no restore generated a durable
    # token again (the check holds for every kill; whether a kill cut a turn with durable tokens is up to it).
    assert any(e.event == "turn_tokens" and e.durable for e in events)
    tokens_kept = [r for r in results if r["name"] == "a cut turn continues from its journaled tokens"]
    assert tokens_kept and tokens_kept[0]["ok"] and not tokens_kept[0].get("unchecked"), tokens_kept
