"""`turnkeep bench replay`'s figures from a run's audit log: replays that matched, with their seconds against their
turns, and those that differed; an unknown ecosystem is refused in one line."""

from __future__ import annotations

import pytest

from turnkeep.bench.replay import _chosen, _row, replay_figures
from turnkeep.primitives.audit_log import AUDIT_FILE
from turnkeep.schemas.audit import ReplayChecked


def _line(rollout: str, turns: int, seconds: float, reason: str = "") -> bytes:
    event = ReplayChecked(t=1.0, inc=1, rollout_id=rollout, resumed_from="x", env="guess", turns=turns,
                          seconds=seconds, diverged_turn=1 if reason else None, reason=reason)
    return event.model_dump_json().encode() + b"\n"


def test_replay_figures_are_the_matched_replays_seconds_against_their_turns(tmp_path) -> None:
    (tmp_path / AUDIT_FILE).write_bytes(_line("a", 2, 0.02) + _line("b", 4, 0.08) + _line("c", 1, 0.5) +
                                        _line("d", 3, 0.01, reason="turn 1's observation differs"))
    figures = replay_figures(tmp_path)
    assert figures == {"replays": 4, "replays_matched": 3, "replays_differed": 1, "replay_s_median": 0.08,
                       "replay_s_max": 0.5, "replay_turns_median": 2, "replay_ms_per_turn_median": 20.0}
    row = _row({**figures, "kills": 4, "ok": True, "tokens_regenerated": 10, "tokens_generated": 1000,
                "share": 0.01, "per_kill": 2.5, "restart_median_s": 9.1})
    assert row == [4, "all hold", "10 of 1000 (1.000%)", 2.5, 9.1, "3 (1)", "0.08 (0.5)", 2, 20.0]
    assert replay_figures(tmp_path / "none")["replay_s_median"] is None


def test_an_unknown_ecosystem_is_refused_by_name() -> None:
    assert _chosen("openenv, verifiers") == ["openenv", "verifiers"]
    with pytest.raises(SystemExit, match=r"unknown ecosystem\(s\) \['gym'\]"):
        _chosen("gym,openenv")
