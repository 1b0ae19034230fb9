"""The chaos command on the real stack: a SIGKILL of the whole process tree inside every
attempt phase, during a restore, in the middle of a trainer checkpoint and of a prune, a
restart after each, then the invariants from the audit log; and the checker fails loudly
once an invariant is broken on purpose."""

from __future__ import annotations

import shutil
from collections import Counter

import orjson
import pytest

from tests.run_command import EVERY_KIND, short_run_dir, small_run_settings, turnkeep
from turnkeep.chaos.invariants.continuations import committed_turns
from turnkeep.chaos.verdict import check_run_dir
from turnkeep.controller.state.dataloader import PromptDataloader
from turnkeep.primitives.audit_log import AUDIT_FILE, read_audit
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.prompts import prompt_source

# Nine starts of the whole stack (eight kills and the last run): each start of Ray, vLLM and Temporal takes
# 40 to 90 s on a 2-core machine, more than the suite's 600 s per test in all.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

POINTS = ["gym_prepare", "gym_commit", "cut", "publish", "resume", "restore", "checkpoint_write", "prune"]


@pytest.fixture(scope="module")
def chaos_run(stack_config):
    run_dir = short_run_dir("tk-chaos-")
    log = run_dir.parent / "chaos.log"
    proc = turnkeep(
        "chaos", "--run-dir", str(run_dir), "--kills", str(len(POINTS)), "--points", ",".join(POINTS),
        "--steps", "48", "--seed", "3", "--phase-timeout-s", "240", *small_run_settings(stack_config),
        # Every environment kind at once: each must come back at its own recovery level.
        "--set", f"environments={EVERY_KIND}",
        # This run checks parked snapshots (test_chaos_journal.py the default journal ones).
        "--set", "snapshot.agents=parked",
        # Slower tools keep generation behind training, so the snapshot the `resume` kill restores has agents in
        # flight; with generation ahead, the data plane fills, the pump waits, and a snapshot may park none.
        "--set", "env.tool_latency_s=0.3", log=log,
    )
    code = proc.wait(timeout=1800)
    return run_dir, code, log.read_text()


def test_a_kill_in_every_phase_restores_and_keeps_every_invariant(chaos_run) -> None:
    run_dir, code, output = chaos_run
    assert code == 0, output[-4000:]
    assert "chaos: PASS" in output
    report = orjson.loads((run_dir / "chaos" / "report.json").read_bytes())
    assert report["kills_by_point"] == {point: 1 for point in POINTS}
    assert report["final_run"]["exit_code"] == 0
    assert report["newest_snapshot_problems"] == []
    rows = report["verdict"]["results"]
    assert all(r["ok"] for r in rows), rows
    # Invariant 2 has four checks: the one that follows each continuation to its seal is the one asked for here.
    checks = {r["name"]: r for r in rows}
    assert checks[next(r["name"] for r in rows if r["number"] == 1)]["checked"] > 0
    # No restore fell back to rows only: each came from a snapshot or a trainer checkpoint, whichever was newest
    # where the kill landed (a restore from a parked snapshot is pinned down in test_remote_env_servers.py).
    # Continued agents resumed exactly (invariant 2).
    counts = report["verdict"]["counts"]
    assert set(counts["restores_by_source"]) <= {"fresh", "snapshot", "trainer_checkpoint"}, counts
    assert counts["continuations_sealed"] >= 1 and checks["restored siblings resume at their saved turn"]["checked"] >= 1
    # The engines' own count sees every token a kill cut, at least what the turns' progress reports saw.
    assert counts["engine_tokens_generated"] > 0 and counts["engine_cut_tokens"] >= counts["cut_turn_tokens"], counts
    # Kills inside the cut and the publish land inside a workflow task (those phases are local activities): the next
    # incarnation's cancel of the dead attempt waits for that task to time out, not for Temporal's default 10 s.
    lines = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    cancels = [line["seconds"]["cancel_stale"] for line in lines if line["kind"] == "recovery"]
    assert len(cancels) >= len(POINTS) - 1 and max(cancels) < 5.0, cancels


def test_each_environment_kind_came_back_at_its_own_level(chaos_run) -> None:
    run_dir, _, _ = chaos_run
    first_start = (run_dir / "chaos" / "incarnation-1.log").read_text()
    assert "environment 'lab' (lab, restart_only): recovery level lowered from 'turn' to 'sibling'" in first_start
    events = list(read_audit(run_dir))
    env_of = _env_of_every_group(run_dir, events)
    assert set(env_of.values()) == {"calc", "workspace", "lab", "judge"}
    continued = Counter(env_of[c.group_id] for e in events if e.event == "restored" for c in e.continuations)
    assert continued["lab"] == 0 and sum(continued.values()) >= 1, continued  # restart_only never continues
    trained = {g for e in events if e.event == "step_trained" for g in e.group_ids}
    assert {env_of[g] for g in trained} == {"calc", "workspace", "lab", "judge"}
    # A group-scored group is trained only with every sibling sealed in its final round, checked at each step. A
    # restore's rows are what is sealed from then on: it keeps rows its journal sealed after the cut, whose audit
    # lines a kill inside the audit log's flush interval may have lost.
    sealed: dict[str, set[int]] = {}
    short: list[tuple[int, str, set[int]]] = []
    for e in events:
        if e.event == "restored":
            sealed = {}
            for row in e.rows:
                sealed.setdefault(row.group_id, set()).add(row.sibling)
        elif e.event == "group_rerun":
            sealed.pop(e.group_id, None)
        elif e.event == "sibling_sealed":
            sealed.setdefault(e.group_id, set()).add(e.sibling)
        elif e.event == "step_trained":
            short += [(e.step, g, sealed.get(g, set())) for g in e.group_ids
                      if env_of[g] == "judge" and len(sealed.get(g, ())) != 4]
    assert short == [], short
    resumed = Counter(env_of[e.group_id] for e in events if e.event == "sibling_started" and e.resumed_from)
    assert resumed["lab"] == 0 and sum(resumed.values()) >= 1, resumed
    lines = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    totals = [line["recovery_by_env_total"] for line in lines if line["kind"] == "train_step"]
    assert all("resumed_from_turn" not in t.get("lab", {}) for t in totals)
    assert any(sum(counts.get("resumed_from_turn", 0) for counts in t.values()) for t in totals), totals[-1]


def _env_of_every_group(run_dir, events) -> dict[str, str]:
    """Each group's environment, as the run's dataloader assigns it (seeded by the group's index). A group a restore
    kept open may lack its `group_admitted` line: a kill inside the audit log's flush interval took it while the
    controller journal kept the admission. Every line that is there must agree."""
    cfg = TurnkeepConfig.model_validate_json((run_dir / "config.json").read_bytes())
    dataloader = PromptDataloader(prompt_source(cfg), cfg.run.seed, cfg.environments, shuffle=cfg.data.shuffle)
    named = {getattr(e, "group_id", None) for e in events} | {g for e in events for g in getattr(e, "group_ids", ())}
    named |= {g for e in events if e.event == "restored" for g in e.unfinished_groups}
    env_of = {}
    for index in range(max(int(g.removeprefix("g")) for g in named if g) + 1):
        dataloader.advance_to(index)
        group_id, problem = dataloader.next_group()
        env_of[group_id] = problem.env
    admitted = {e.group_id: e.env for e in events if e.event == "group_admitted"}
    assert all(env_of[g] == env for g, env in admitted.items())
    return env_of


def test_every_resumed_row_kept_the_policy_version_of_each_saved_turn(chaos_run) -> None:
    run_dir, code, _ = chaos_run
    events = list(read_audit(run_dir))
    # Per attempt, the policy of each committed turn, a continuation's first turns reached back for along the
    # chain of restores (a restore may continue a continuation, which committed only the turns after its boundary).
    committed = committed_turns(events)
    checked = 0
    for restored in (e for e in events if e.event == "restored"):
        for cont in restored.continuations:
            sealed = [e for e in events if e.event == "sibling_sealed" and e.rollout_id == cont.next_rollout_id
                      and e.inc == restored.inc]
            if not sealed:
                continue  # killed before the continuation sealed
            # The environment server flushes its audit log before every journal batch, so a journaled boundary's
            # turns are always in it (a KeyError here means a turn the journal kept but the audit log lost).
            turns = committed[(cont.rollout_id, cont.started_by)]
            saved = [turns[turn] for turn in range(1, cont.turn_index + 1)]
            versions = sealed[0].policy_versions
            assert versions[: cont.turn_index] == saved
            # The next turn came from the restored policy, never an older one.
            assert all(v >= restored.policy_version for v in versions[cont.turn_index:])
            checked += 1
    assert checked >= 1


def test_the_checker_fails_loudly_when_a_group_is_trained_twice(chaos_run, tmp_path) -> None:
    run_dir, _, _ = chaos_run
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(run_dir / AUDIT_FILE, broken / AUDIT_FILE)
    events = list(read_audit(broken))
    trained = [e for e in events if e.event == "step_trained"]
    last = trained[-1]
    # A bug that trains an already trained group again at the next step, on the same lineage.
    again = last.model_copy(update={"step": last.step + 1, "group_ids": trained[-2].group_ids[:1], "t": last.t + 1})
    with open(broken / AUDIT_FILE, "ab") as f:
        f.write(orjson.dumps(again.model_dump(mode="json"), option=orjson.OPT_APPEND_NEWLINE))

    assert check_run_dir(run_dir).ok
    verdict = check_run_dir(broken)
    assert not verdict.ok
    first = verdict.results[0]
    assert not first.ok and any(trained[-2].group_ids[0] in v for v in first.violations)
    assert "INVARIANT BROKEN" in verdict.format()


@pytest.mark.parametrize("damage, problem", [
    ("truncate", "truncated"),
    ("flip_byte", "digest_mismatch"),
    ("foreign_run", "foreign_run"),
    ("newer_schema", "newer_schema"),
    ("other_settings", "fingerprint_differs"),
])
def test_a_damaged_newest_snapshot_of_a_real_run_is_named_and_skipped(chaos_run, tmp_path, damage, problem) -> None:
    from turnkeep.controller.fingerprint import fingerprint_fields
    from turnkeep.controller.restore.restore_source import choose_source
    from turnkeep.schemas.config import TurnkeepConfig
    from turnkeep.schemas.recovery import SourceKind

    run_dir, _, _ = chaos_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir / "checkpoints", copy / "checkpoints", ignore=shutil.ignore_patterns("rejected"))
    shutil.copytree(run_dir / "journal", copy / "journal")  # snapshots name journal positions: part of the state
    cfg = TurnkeepConfig.model_validate_json((run_dir / "config.json").read_bytes())
    run_id = orjson.loads((run_dir / "run.json").read_bytes())["run_id"]
    fields = fingerprint_fields(cfg)
    # Newer checkpoints without a snapshot (the run ended before their attempt) are set aside.
    for step_dir in sorted((copy / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]), reverse=True):
        if any((p / "manifest.json").exists() for p in (step_dir / "snapshots").glob("[0-9]*")):
            break
        shutil.rmtree(step_dir)
    before = choose_source(copy, run_id, fields)
    assert before.kind is SourceKind.SNAPSHOT and not before.skipped
    newest = copy / "checkpoints" / f"step_{before.step}" / "snapshots" / before.snapshot_dir.rsplit("/", 1)[1]
    # The controller state always has content (agents.jsonl is empty when no agent was parked).
    agents = newest / "controller" / "state.json"
    manifest = orjson.loads((newest / "manifest.json").read_bytes())
    if damage == "truncate":
        agents.write_bytes(agents.read_bytes()[:-10])
    elif damage == "flip_byte":
        data = bytearray(agents.read_bytes())
        data[len(data) // 2] ^= 0x01
        agents.write_bytes(bytes(data))
    else:
        manifest.update({"foreign_run": {"run_id": "someone-else"}, "newer_schema": {"schema_version": 99},
                         "other_settings": {"config_fingerprint": "0" * 16}}[damage])
        (newest / "manifest.json").write_bytes(orjson.dumps(manifest))

    after = choose_source(copy, run_id, fields)
    assert [s.problem for s in after.skipped] == [problem]
    assert after.skipped[0].path == str(newest)
    assert after.kind in (SourceKind.OLDER_SNAPSHOT, SourceKind.TRAINER_CHECKPOINT)
    assert after.step == before.step and problem in after.reason
