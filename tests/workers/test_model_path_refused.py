"""A model.path that holds no model is found where the model is made (a node of the Ray cluster) and ends the run
in one line, no traceback, and leaves no process of the run behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from primitives.pid_files import live_pids
from tests.run_command import short_run_dir

pytestmark = pytest.mark.integration


def test_a_model_path_without_a_model_is_one_line_and_nothing_is_left_running(tmp_path):
    run_dir = short_run_dir("tk-modelpath-")
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--run-dir", str(run_dir), "--steps", "1",
         "--set", f"model.path={tmp_path}", "--set", "temporal.port=0", "--set", "temporal.ui_port=0"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"turnkeep: model.path = '{tmp_path}' holds no config.json. Point model.path at a Hugging Face model "
        "directory (config.json, weights, tokenizer files), or remove model.path to use the made-up tiny model.")
    assert live_pids(run_dir) == {}
