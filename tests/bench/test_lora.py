"""`turnkeep bench lora`'s figures from a run directory: medians of the step lines, the trainer checkpoint's bytes,
and the table with one row per variant."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from turnkeep.bench.lora import VARIANTS, _report, measure


def _run_dir(root: Path, refit_bytes: int, refit_s: list[float]) -> Path:
    lines = [{"kind": "train_step", "step": i + 1, "wall_s": 10.0 * i, "rollout_tokens_per_s": 100.0,
              "reward_mean": 0.5, "rss_tree_mib": 900 + i, "refit_bytes": refit_bytes, "refit_s": s,
              "trainer_compute_s": 0.2} for i, s in enumerate(refit_s)]
    (root / "checkpoints" / "step_3" / "trainer" / "shards").mkdir(parents=True)
    (root / "checkpoints" / "step_3" / "trainer" / "shards" / "__0_0.distcp").write_bytes(b"x" * refit_bytes)
    (root / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return root


def test_each_variant_is_its_runs_medians_and_the_note_compares_the_adapters_with_the_full_refit(tmp_path):
    full = measure(_run_dir(tmp_path / "full", 1_000_000, [0.3, 0.5, 0.4]), 3)
    adapters = measure(_run_dir(tmp_path / "adapters", 50_000, [0.1, 0.2, 0.12]), 3)
    assert (full["refit_bytes"], full["refit_s"], full["checkpoint_bytes"]) == (1_000_000, 0.4, 1_000_000)
    assert full["train_steps_per_min"] == 6.0 and full["peak_rss_tree_mib"] == 902
    runs = {"full": [full], "lora merged": [full], "lora adapters": [adapters]}
    args = argparse.Namespace(rounds=1, steps=3, rank=8, config=Path("configs/tool_chat.toml"))
    result = _report(args, runs)
    assert [line.split(" | ")[0].lstrip("| ") for line in result.table.splitlines()[2:]] == list(VARIANTS)
    assert "sends 5.0% of the full refit's bytes in 30% of its time" in result.notes[1]
