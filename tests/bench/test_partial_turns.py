"""The partial-turns benchmark's chaos figures, read from a chaos report: tokens generated again per kill and the
cut turns' tokens kept."""

from __future__ import annotations

from turnkeep.bench.chaos_report import chaos_figures
from turnkeep.bench.partial_turns import _chaos_row


def report(regenerated: int, kept: int) -> dict:
    counts = {"tokens_generated": 10_000, "tokens_regenerated": regenerated, "tokens_regenerated_share":
              regenerated / 10_000, "cut_turn_tokens": 900, "cut_turn_tokens_kept": kept,
              "engine_cut_tokens": 1100,
              "median_restart_to_first_generation_s": 31.5,
              "restores_by_source": {"snapshot": 7, "trainer_checkpoint": 1, "fresh": 2}}
    return {"kills_by_point": {"random": 20}, "verdict": {"ok": True, "counts": counts}}


def test_the_figures_of_each_level_come_from_its_report():
    turn, token = chaos_figures(report(1000, 0)), chaos_figures(report(120, 780))
    assert (turn["per_kill"], token["per_kill"]) == (50.0, 6.0)
    assert (turn["cut_turn_tokens_kept"], token["cut_turn_tokens_kept"]) == (0, 780)
    row = _chaos_row(report(120, 780), 20)
    assert row == [20, "all hold", "7 / 1 / 2", "120 of 10000 (1.200%)", 6.0, "900 (1100) / 780", 31.5]
