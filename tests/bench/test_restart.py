import argparse
from pathlib import Path

import pytest

from turnkeep.bench import restart
from turnkeep.bench.restart_phases import PHASES


def _args(tmp_path: Path, after: int) -> argparse.Namespace:
    return argparse.Namespace(out=tmp_path, set=[], config=restart.DEFAULT_CONFIG, restarts=1, after=after)


@pytest.mark.parametrize("after", [0, 20])
def test_a_kill_that_would_not_fall_between_two_snapshots_is_refused_before_anything_starts(tmp_path, after):
    with pytest.raises(SystemExit, match=r"--after .*between 1 and train.save_period - 1 \(19\)"):
        restart.run(_args(tmp_path, after))
    assert not (tmp_path / "restart").exists() or not any((tmp_path / "restart").iterdir())


def test_the_table_has_each_phase_s_median_and_the_cpu_of_each_kind_heaviest_first(tmp_path):
    def timed(first_turn: float, trainer_cpu: float) -> dict:
        phases = dict.fromkeys(PHASES)
        phases.update(process=-0.004, ray=5.0, engines=19.0, first_step=20.0, first_turn=first_turn)
        return {"phases": phases, "cpu_s": {"Ray": 5.0, "trainer": trainer_cpu}}

    result = restart._result(_args(tmp_path, 4), 20, [timed(24.0, 8.0), timed(26.0, 9.0), timed(30.0, 10.0)])
    lines = result.table.splitlines()
    assert "| first generated turn | 26.0 | 24.0-30.0 |" in lines
    assert "| controller process started | 0.0 | 0.0-0.0 |" in lines  # not "-0.0": a tick before the command
    assert not any(line.startswith("| trainer loaded") for line in lines)  # marked by no restart
    assert "| CPU s until the first turn (median) | trainer | Ray | all |" in lines
    assert "|  | 9.0 | 5.0 | 14.0 |" in lines
    assert "Median command -> first generated turn: 26.0 s" in result.notes[0]
