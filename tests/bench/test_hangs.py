"""The hangs benchmark's figures of one freeze, read from the run's metrics lines: the probe's verdict, the
replacement, the next train step and the steps the repair undid."""

from __future__ import annotations

from turnkeep.bench.hangs import freeze_figures


def _steps(pairs: list[tuple[int, float]]) -> list[dict]:
    return [{"kind": "train_step", "step": step, "t": t} for step, t in pairs]


def test_an_engine_freeze_is_noticed_replaced_and_undoes_nothing():
    lines = [*_steps([(1, 100.0), (2, 110.0)]),
             {"kind": "hang", "t": 131.0, "target": "engine 0", "probe": "engine core token"},
             {"kind": "engine_restart", "t": 150.0, "engine": 0}, *_steps([(3, 160.0), (4, 170.0)])]
    round_ = {"target": "freeze-engine", "outcome": "repaired", "at_unix_s": 111.0}
    assert freeze_figures(round_, lines) == {
        "target": "freeze-engine", "outcome": "repaired", "probe": "engine core token", "noticed_s": 20.0,
        "replaced_s": 39.0, "trained_again_s": 49.0, "steps_undone": 0}


def test_a_rank_freeze_rebuilt_from_an_older_snapshot_counts_the_steps_trained_again():
    lines = [*_steps([(4, 100.0), (5, 110.0), (6, 120.0)]),
             {"kind": "hang", "t": 141.0, "target": "trainer ranks", "probe": "collective timeout"},
             {"kind": "trainer_rebuild", "t": 142.0}, *_steps([(5, 180.0), (6, 185.0)])]
    figures = freeze_figures({"target": "freeze-rank", "outcome": "repaired", "at_unix_s": 121.0}, lines)
    assert (figures["noticed_s"], figures["replaced_s"], figures["steps_undone"]) == (20.0, 21.0, 2)


def test_a_freeze_nothing_caught_has_no_figures_but_its_outcome():
    lines = _steps([(1, 100.0), (2, 110.0)])
    figures = freeze_figures({"target": "freeze-temporal", "outcome": "hung", "at_unix_s": 105.0}, lines)
    assert figures["outcome"] == "hung" and figures["noticed_s"] is None and figures["replaced_s"] is None
    assert figures["trained_again_s"] is None and figures["steps_undone"] is None
