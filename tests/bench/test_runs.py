"""What the benchmarks read back from a run's metrics.jsonl."""

from __future__ import annotations

import orjson
import pytest

from turnkeep.bench.report import markdown_table
from turnkeep.bench.runs import percentile, run_id_of, throughput


def write_metrics(run_dir, lines) -> None:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


def test_throughput_weights_each_steps_rate_by_its_interval(tmp_path) -> None:
    steps = [{"kind": "train_step", "step": i + 1, "wall_s": float(w), "rollout_tokens_per_s": rate,
              "reward_mean": 0.5, "rss_tree_mib": 100 + i} for i, (w, rate) in enumerate([(10, 0), (11, 1000), (13, 100)])]
    write_metrics(tmp_path / "run", [{"kind": "snapshot"}, *steps])
    figures = throughput(tmp_path / "run")
    assert figures["rollout_tokens_per_s"] == pytest.approx((1000 * 1 + 100 * 2) / 3, abs=0.1)
    assert figures["train_steps_per_min"] == pytest.approx(2 / 3 * 60, abs=0.01)
    assert figures["peak_rss_tree_mib"] == 102


def test_too_short_a_run_is_refused_with_the_fix(tmp_path) -> None:
    write_metrics(tmp_path / "run", [{"kind": "train_step", "wall_s": 1.0}])
    with pytest.raises(SystemExit, match="raise --steps"):
        throughput(tmp_path / "run")


def test_percentile_and_table() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile([], 0.9) == 0.0
    table = markdown_table(["a", "b"], [["x", 0.12345], ["y", 12345.0]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| x | 0.123 |", "| y | 12,345 |"]


def test_a_directory_without_run_json_is_named_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        run_id_of(tmp_path)

    assert f"{tmp_path} is not a run directory (no run.json)" in str(exit_.value)


def test_the_run_id_comes_from_run_json(tmp_path):
    (tmp_path / "run.json").write_bytes(orjson.dumps({"run_id": "r-1"}))

    assert run_id_of(tmp_path) == "r-1"
