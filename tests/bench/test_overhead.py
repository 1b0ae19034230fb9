"""bench overhead's report: ratios taken within each alternating pair, the median with its spread, per mode
(on synthetic run directories; the runs themselves are the benchmark)."""

from __future__ import annotations

import argparse

import orjson

from turnkeep.bench import overhead


def write_run(run_dir, tokens_per_s: float, steps_per_min: float, closed_s: list[float]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    step_s = 60 / steps_per_min
    steps = [{"kind": "train_step", "wall_s": i * step_s, "rollout_tokens_per_s": tokens_per_s, "reward_mean": 0.5,
              "rss_tree_mib": 100} for i in range(12)]
    attempts = [{"kind": "snapshot", "outcome": "published", "admission_closed_s": s, "trainer_wait_s": 0.1}
                for s in closed_s]
    (run_dir / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in steps + attempts))


def test_each_mode_is_compared_with_the_off_run_of_its_own_pair(tmp_path) -> None:
    runs = {}
    speeds = {1: (1000, 950, 990), 2: (800, 700, 796), 3: (900, 882, 900)}  # off, parked, journal per pair
    for pair, (off, parked, journal) in speeds.items():
        for label, tokens, closed in (("off", off, []), ("on", parked, [0.3, 0.5]), ("on-journal", journal, [0.0])):
            run_dir = overhead._run_dir(tmp_path, label, pair)
            write_run(run_dir, tokens, 60.0, closed)
            runs[f"{label} #{pair}"] = {"rollout_tokens_per_s": tokens, "train_steps_per_min": 60.0, "wall_s": 1,
                                        "reward_last10": 0.5, "run_dir": str(run_dir)}
    args = argparse.Namespace(pairs=3, steps=12, interval_s=5.0)
    result = overhead._report(args, ["parked", "journal"], runs)
    parked, journal = result.data["modes"]["parked"], result.data["modes"]["journal"]
    # Within pairs: 0.95, 0.875, 0.98; across pairs the slow second pair would have dragged a pooled ratio down.
    assert parked["rollout_tokens_per_s"] == {"median": 0.95, "low": 0.875, "high": 0.98, "pairs": [0.95, 0.875, 0.98]}
    assert journal["rollout_tokens_per_s"]["median"] == 0.995 and journal["rollout_tokens_per_s"]["low"] == 0.99
    assert parked["admission_closed_s"]["median"] == 0.4 and journal["admission_closed_s"]["max"] == 0.0
    assert parked["attempts"] == 6 and journal["attempts"] == 3
    assert result.data["ratio_rollout_tokens_per_s"] == 0.95
    assert "on-journal / off (journal), median (low-high) | 0.995 (0.990-1.000)" in result.table


def test_unknown_modes_are_refused_in_one_line(tmp_path) -> None:
    import pytest

    with pytest.raises(SystemExit, match="give distinct modes among parked, journal"):
        overhead._modes("parked,paused")
