"""The device check runs end to end on the CPU with a small shape and reports every figure."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_reports_step_checkpoint_refit_and_the_hold(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--small", "--out", str(tmp_path), "--steps", "1",
         "--engines", "--ranks", "--recipe"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = orjson.loads((tmp_path / "gpu_check.json").read_bytes())
    assert report["device"] == "cpu" and report["parameters"] > 0
    assert report["train_step"]["tokens_per_s"] > 0 and report["train_step"]["nonfinite_steps_skipped"] == 0
    assert report["checkpoint"]["round_trip_equal"] and report["checkpoint"]["load_s"] > 0
    assert report["refit_serialisation"]["gb_per_s"] > 0 and report["refit_serialisation"]["dtype"] == "bfloat16"
    assert report["refit_serialisation"]["one_memory_copy_s"] > 0
    # The engines need vLLM and three GPUs: here the report says which of them is missing instead of failing.
    assert "this machine has 0" in report["engines"]["skipped"] or "no vLLM" in report["engines"]["skipped"]
    # The recipe (a real chat model on tool_chat, with evaluation) needs a CUDA GPU beside vLLM, Ray and Temporal.
    assert report["recipe"]["skipped"] in ("the recipe's placement needs 1 CUDA GPU(s); this machine has 0",
                                           "no vLLM on this machine: pip install -e '.[gpu]'"), report["recipe"]
    hold = report["hold_check"]
    assert hold["held"] and hold["step_waited_s"] >= 1.0 and hold["changed_after_release"]
    # One and two ranks (gloo here), each a process: the same rows split between them train to the same loss.
    one, two = report["ranks"]["1"], report["ranks"]["2"]
    assert one["step_s"] > 0 and two["save_s"] > 0 and two["load_s"] > 0, report["ranks"]
    assert len(two["peak_memory_gib_per_rank"]) == 2 and two["loss"] == pytest.approx(one["loss"], rel=1e-4)


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_bad_config_or_set_flag_is_one_line_and_exit_2(tmp_path, capsys):
    """Before any model is made: the reason in one line, no traceback. The script as a process once (what a user
    sees), then each other refusal through its main (each process start imports torch: seconds)."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--out", str(tmp_path / "out"),
                           "--set", "train.lr"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("gpu_check: ") and "--set 'train.lr': expected KEY=VALUE" in line, line
    gpu_check = _gpu_check_module()
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[train\n")
    for args, named in ((["--set", "train.lrr=1e-3"], "train.lrr"),
                        (["--config", str(bad_toml)], "is not valid TOML"),
                        (["--config", str(tmp_path)], "is a directory")):
        assert gpu_check.main(["--out", str(tmp_path / "out"), *args]) == 2, args
        captured = capsys.readouterr()
        [line] = captured.err.strip().splitlines()
        assert line.startswith("gpu_check: ") and named in line, (args, line)
    assert not (tmp_path / "out").exists()
