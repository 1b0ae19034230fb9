"""bench wasted: its runs park their agents (the Gym phase is where a slow participant costs), and runs whose attempts
had no Gym phase stop the benchmark in one line instead of a table of zeros (on synthetic run directories)."""

from __future__ import annotations

import argparse

import orjson
import pytest

from turnkeep.bench import wasted


def _stand_in_runs(phase: str, calls: list[list[str]]):
    def run_turnkeep(run_dir, config, steps, settings, log):
        calls.append(settings)
        run_dir.mkdir(parents=True, exist_ok=True)
        steps = [{"kind": "train_step", "wall_s": i, "rollout_tokens_per_s": 100.0, "reward_mean": 0.5,
                  "rss_tree_mib": 100} for i in range(5)]
        attempts = [{"kind": "snapshot", "outcome": "published", "reason": "published", "phase_s": {phase: 3.0},
                     "admission_closed_s": 3.1, "trainer_wait_s": 1.0}]
        (run_dir / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in steps + attempts))
        return 1.0
    return run_turnkeep


def _args(tmp_path) -> argparse.Namespace:
    return argparse.Namespace(steps=5, prepare_delay_s=3.0, interval_s=5.0, config=wasted.DEFAULT_CONFIG, set=[],
                              out=tmp_path)


def test_both_runs_park_their_agents_and_count_the_gym_phase(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(wasted, "run_turnkeep", _stand_in_runs("gym_prepare", calls))
    result = wasted.run(_args(tmp_path))
    assert len(calls) == 2 and all("snapshot.agents=parked" in settings for settings in calls)
    assert [run["attempts_with_gym_phase"] for run in result.data["runs"].values()] == [1, 1]


def test_attempts_without_a_gym_phase_stop_the_benchmark_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(wasted, "run_turnkeep", _stand_in_runs("gym_mark", []))
    with pytest.raises(SystemExit, match="none of the 1 snapshot attempts of .* had a Gym phase"):
        wasted.run(_args(tmp_path))
