"""`turnkeep bench peers`' figures from either framework's step lines: the moving reward, the time to a fixed reward
and the reward at a fixed time, tokens/s and steps/min; the target both frameworks reach; the report's rows."""

from __future__ import annotations

import argparse

import pytest

from turnkeep.bench.peers_figures import moving_rewards, reward_at, side_figures, target_reward
from turnkeep.bench.peers_report import report
from turnkeep.schemas.config import TurnkeepConfig


def _found(rewards: list[float], every_s: float, tokens: int | None = None) -> dict:
    lines = [{"step": i + 1, "t": 1000.0 + 20 + every_s * i, "reward_mean": r, "rss_mib": 500 + i,
              **({"tokens": tokens} if tokens is not None else {"tokens_per_s": 50.0})} for i, r in enumerate(rewards)]
    return {"started": 1000.0, "ended": lines[-1]["t"] + 5, "lines": lines}


def test_the_moving_reward_the_time_to_a_target_and_the_reward_at_a_time():
    found = _found([0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0], every_s=2.0, tokens=100)
    assert moving_rewards(found["lines"])[:3] == pytest.approx([0.2, 0.3, 0.4])
    assert moving_rewards(found["lines"])[-1] == pytest.approx(0.88)  # the last 5 steps
    figures = side_figures(found, target=0.6)
    assert figures["to_target_s"] == 20 + 2.0 * 4  # the 5-step mean first reaches 0.6 at step 5
    assert figures["tokens_per_s"] == 50.0 and figures["steps_per_min"] == 30.0 and figures["peak_rss_mib"] == 506
    assert figures["first_step_s"] == 20 and reward_at(figures, 23.0) == pytest.approx(0.3)
    assert reward_at(figures, 10.0) is None
    assert side_figures(found, target=0.95)["to_target_s"] is None


def test_the_target_is_one_both_frameworks_reach_and_the_report_has_a_row_each():
    runs = {"turnkeep": [_found([0.2, 0.6, 0.9, 0.9, 0.9], 1.0)], "trl": [_found([0.2, 0.3, 0.5, 0.5, 0.5], 3.0, 80)]}
    target = target_reward(runs)
    assert target == pytest.approx(round(0.95 * 0.4, 3))  # TRL's best 5-step mean is 0.4
    figures = {side: [side_figures(found, target) for found in found_runs] for side, found_runs in runs.items()}
    kills = {side: [{"steps_lost": 2, "restart_to_next_step_s": 9.0}] for side in runs}
    args = argparse.Namespace(pairs=1, steps=5, save_steps=5)
    result = report(args, figures, kills, target, "1.16.0", TurnkeepConfig())
    rows = result.table.splitlines()[2:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == ["turnkeep", "TRL 1.16.0 GRPOTrainer"]
    assert result.data["fixed_s"] == 29.0  # the shorter run's wall time: 20 s to its first step, 4 steps, 5 s to exit
