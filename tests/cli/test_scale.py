"""`turnkeep scale` says in one line why it cannot scale a run that is not there or not running (the scaling of a
running run is in tests/workers/test_engines.py), and `turnkeep status` shows each engine."""

from __future__ import annotations

import argparse
import json

from turnkeep.cli.scale import run_scale
from turnkeep.cli.status import _engines_line


def test_a_folder_that_is_no_run_or_a_stopped_run_is_named(tmp_path, capsys) -> None:
    assert run_scale(argparse.Namespace(run_dir=tmp_path, engines=2)) == 2
    assert "is not a run directory" in capsys.readouterr().err
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "run-1", "incarnation": 1}))
    assert run_scale(argparse.Namespace(run_dir=tmp_path, engines=2)) == 2
    err = capsys.readouterr().err
    assert "is not running" in err and "policy.engines" in err and len(err.strip().splitlines()) == 1


def test_status_shows_each_engine_with_its_rate_and_restarts() -> None:
    engines = [{"engine": 0, "state": "live", "version": 12, "restarts": 0},
               {"engine": 1, "state": "starting", "version": 0, "restarts": 1}]
    line = _engines_line(engines, {"engine_tokens_per_s": {"0": 310.0}})
    assert line == "  engines 1 of 2 live: 0 live v12 (310 tok/s), 1 starting v0 (restarts 1)"
