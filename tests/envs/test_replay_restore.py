"""A whole-tree kill mid-rollout, and a restart that continues the agents of `replay` environments by replaying their
journaled turns on fresh instances: the calculator, and the OpenEnv example through its adapter.

One run, two environments of the calculator (`tests/envs/replay_envs.py`): `calc` is deterministic, `odd` answers
differently after the restart. Both hold their agents at their second step once the run has trained two steps, so
the kill lands while agents sit mid-rollout with a journaled turn (a pinned moment, not a timed one). After the
restart every `calc` agent continues from its saved turn through a replay that matched; every `odd` agent's replay
differs at a named turn, is named in the log and the audit, and its sibling reruns from scratch; every invariant of
`turnkeep chaos` holds (nothing trained twice, no journaled turn lost). The OpenEnv example's agents, held the same
way, continue after a replay on fresh sessions of a new server, reset with their seeds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.envs.replay_envs import HOLD_FILE, RESTARTED_FILE
from tests.run_command import short_run_dir, small_run_settings, train_steps, turnkeep, wait_until
from turnkeep.chaos.targets import kill_everything
from turnkeep.chaos.verdict import check_run_dir
from turnkeep.config.loader import load_config
from turnkeep.primitives.audit_log import read_audit
from turnkeep.schemas.audit import ReplayChecked, Restored, SiblingStarted

pytestmark = pytest.mark.integration

ENTRY = "tests.envs.replay_envs:HeldCalc"
OPENENV_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openenv_guess" / "config.toml"


def _command(stack_config, run_dir: Path, hold_dir: Path, steps: int) -> list[str]:
    environments = {name: {"kind": "python", "entry": ENTRY, "options": {"hold_dir": str(hold_dir),
                                                                         "differs": name == "odd"}}
                    for name in ("calc", "odd")}
    return ["run", *small_run_settings(stack_config), "--set", f"run.run_dir={run_dir}", "--set", f"run.steps={steps}",
            "--set", "train.save_period=2", "--set", f"environments={json.dumps(environments)}",
]


def _held(hold_dir: Path, env: str) -> int:
    return len(list(hold_dir.glob(f"held-{env}-*")))


def test_a_kill_mid_rollout_continues_replay_agents_and_reruns_the_ones_whose_replay_differs(stack_config) -> None:
    run_dir = short_run_dir("tk-replay-")
    hold_dir = run_dir.parent / "hold"
    hold_dir.mkdir()
    log = run_dir.parent / "run.log"
    first = turnkeep(*_command(stack_config, run_dir, hold_dir, 50), log=log)
    _kill_while_held(first, run_dir, hold_dir, ("calc", "odd"))
    (hold_dir / RESTARTED_FILE).touch()

    # Three steps past the kill: the continued agents' groups are trained.
    again = turnkeep(*_command(stack_config, run_dir, hold_dir, train_steps(run_dir) + 3), log=log)
    assert again.wait(timeout=900) == 0, log.read_text()[-4000:]
    events = list(read_audit(run_dir))
    restored = [e for e in events if isinstance(e, Restored)]
    assert restored and restored[-1].continuations, "the restart continued no agent"
    checked = [e for e in events if isinstance(e, ReplayChecked)]
    matched = [e for e in checked if e.env == "calc"]
    differed = [e for e in checked if e.env == "odd"]
    assert matched and all(e.diverged_turn is None and not e.reason and e.turns >= 1 for e in matched), matched
    assert differed and all(e.diverged_turn is not None for e in differed if e.turns), differed
    named = [e for e in differed if e.diverged_turn is not None]
    assert named, differed  # an agent of `odd` whose replay met a tool reply, which changed after the restart
    output = log.read_text()
    for event in named:
        assert f"rollout {event.resumed_from} cannot continue by replay, turn {event.diverged_turn}'s observation " \
               "differs from the journaled one" in output
        assert "environment 'odd' (held_calc)" in output
    # The continuing attempt of a diverged agent failed; the sibling's next attempt starts from scratch.
    starts = [e for e in events if isinstance(e, SiblingStarted)]
    for event in named:
        group, sibling, attempt = event.rollout_id.rsplit(".", 2)
        rerun = f"{group}.{sibling}.{int(attempt) + 1}"
        assert any(s.rollout_id == rerun and s.resumed_from is None for s in starts), (rerun, event)
    resumed = [s for s in starts if s.resumed_from is not None and s.rollout_id in {e.rollout_id for e in matched}]
    assert resumed and all(s.resumed_turn >= 1 for s in resumed)
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()


def _kill_while_held(first, run_dir: Path, hold_dir: Path, envs: tuple[str, ...]) -> None:
    wait_until(lambda: train_steps(run_dir) >= 2, 600, "two train steps", first)
    (hold_dir / HOLD_FILE).touch()
    wait_until(lambda: all(_held(hold_dir, env) for env in envs), 300, f"agents held in {envs}", first)
    kill_everything(run_dir, first.pid)
    first.wait(timeout=60)
    (hold_dir / HOLD_FILE).unlink()


def test_the_openenv_examples_agents_cut_by_a_kill_continue_through_replay_on_a_new_server(stack_config) -> None:
    run_dir = short_run_dir("tk-replay-openenv-")
    hold_dir = run_dir.parent / "hold"
    hold_dir.mkdir()
    log = run_dir.parent / "run.log"
    options = {**load_config(OPENENV_EXAMPLE).environments["guess"].options, "hold_dir": str(hold_dir)}
    guess = {"guess": {"kind": "python", "entry": "tests.envs.replay_envs:HeldGuess", "options": options}}

    def command(steps: int) -> list[str]:
        return ["run", "--config", str(OPENENV_EXAMPLE), "--run-dir", str(run_dir), "--steps", str(steps),
                *small_run_settings(stack_config), "--set", "model.tiny.warm_start_steps=100",
                "--set", "train.save_period=2", "--set", "eval.every_steps=0",
                "--set", f"environments={json.dumps(guess)}"]

    first = turnkeep(*command(50), log=log)
    _kill_while_held(first, run_dir, hold_dir, ("guess",))
    again = turnkeep(*command(train_steps(run_dir) + 3), log=log)
    assert again.wait(timeout=900) == 0, log.read_text()[-4000:]
    events = list(read_audit(run_dir))
    checked = [e for e in events if isinstance(e, ReplayChecked)]
    assert checked and all(e.diverged_turn is None and not e.reason and e.turns >= 1 for e in checked), checked
    starts = {s.rollout_id: s for s in events if isinstance(s, SiblingStarted)}
    assert all(starts[e.rollout_id].resumed_turn == e.turns for e in checked)
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()
