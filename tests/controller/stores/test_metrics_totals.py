"""The `*_total` counters of metrics.jsonl go on across incarnations: a restored run adds its own counts to the totals
its lineage had at the step it was restored to."""

from __future__ import annotations

import orjson

from turnkeep.controller.pumps.train_pump import StepReport
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.controller.stores.metrics import MetricsSink
from turnkeep.controller.stores.metrics_totals import add_totals, totals_at


def _line(step: int, rows: int, retries: int, dropped: dict, by_env: dict) -> dict:
    return {"kind": "train_step", "step": step, "rows_sealed_total": rows, "retries_total": retries,
            "siblings_dropped_total": dropped, "groups_discarded_total": {},
            "recovery_by_env_total": by_env}


def test_the_newest_line_of_the_restored_step_is_the_base_and_counts_add_key_by_key(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [_line(1, 8, 0, {}, {}), _line(2, 16, 1, {"stale": 1}, {"calc": {"resumed_from_turn": 2}}),
             _line(3, 24, 2, {"stale": 1}, {}),  # trained by an incarnation that died: the restore goes back to 2
             _line(2, 17, 3, {"stale": 2}, {"calc": {"resumed_from_turn": 3}})]  # the newer lineage's step 2
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines) + b'{"kind": "tra')
    base = totals_at(path, 2)
    assert base["rows_sealed_total"] == 17 and base["siblings_dropped_total"] == {"stale": 2}
    assert totals_at(path, 9) == {} and totals_at(tmp_path / "none.jsonl", 1) == {}
    added = add_totals(base, {"rows_sealed_total": 8, "retries_total": 0, "siblings_dropped_total": {"late": 1},
                              "groups_discarded_total": {}, "recovery_by_env_total": {"calc": {"resumed_from_turn": 1,
                                                                                               "rerun_from_scratch": 2}}})
    assert added["rows_sealed_total"] == 25 and added["retries_total"] == 3
    assert added["siblings_dropped_total"] == {"late": 1, "stale": 2}
    assert added["recovery_by_env_total"] == {"calc": {"rerun_from_scratch": 2, "resumed_from_turn": 4}}


def test_a_restored_sinks_first_line_continues_the_lineages_totals(tmp_path) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(orjson.dumps(_line(4, 32, 5, {}, {})) + b"\n")
    stats = RunStats(rows_sealed=8, retries=1)
    with open(tmp_path / "progress.txt", "w") as out:
        sink = MetricsSink(tmp_path, stats, max_steps=None, out=out)
        line = sink.step(StepReport(step=5, reward_mean=0.5, train_step_s=0.1, refit_s=0.1, refit_bytes=1,
                                    groups_trained=4, policy_version=5, staleness_max=0, trainer={}))
    assert (line["rows_sealed_total"], line["retries_total"]) == (40, 6) and sink.steps_trained == 1
