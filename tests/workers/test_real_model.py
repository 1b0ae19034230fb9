"""The packaged real model end to end, kept short: SmolLM2-135M-Instruct named by its package name is converted from
its GGUF file, trains two steps of `configs/smollm2.toml` with tiny lengths (a real run's processes: Temporal, Ray,
vLLM), and its export loads in vLLM and in transformers with the run's last weights."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from tests.run_command import metrics, short_run_dir, train_steps, turnkeep
from tests.workers.test_export_vllm import vllm_prompt_logprobs
from turnkeep.cli.main import main

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TINY_LENGTHS = {
    "rollout.group_size": 2, "train.prompts_per_step": 2, "rollout.max_tokens_per_turn": 8, "train.save_period": 2,
    "eval.before_training": "false", "eval.every_steps": 0, "snapshot.attempt_interval_s": 30,
    "temporal.port": 0, "temporal.ui_port": 0, "policy.kv_cache_memory_bytes": 64 << 20,
}


def test_the_packaged_smollm2_trains_two_steps_and_its_export_loads_in_vllm_and_transformers(tmp_path) -> None:
    run_dir = short_run_dir("tk-smollm2-")
    log = run_dir.parent / "run.log"
    settings = [arg for key, value in TINY_LENGTHS.items() for arg in ("--set", f"{key}={value}")]
    proc = turnkeep("run", "--config", str(ROOT / "configs" / "smollm2.toml"), "--run-dir", str(run_dir),
                    "--steps", "2", *settings, log=log)
    assert proc.wait(timeout=900) == 0, log.read_text()[-4000:]
    assert train_steps(run_dir) == 2
    saved = json.loads((run_dir / "config.json").read_text())
    folder = Path(saved["model"]["path"])
    assert folder.name.startswith("SmolLM2-135M-Instruct.Q4_1-") and (folder / "turnkeep-gguf.json").is_file()
    assert saved["train"]["rank_copies"] is False  # decided from the model's size: 538 MB of weights
    [step] = [m for m in metrics(run_dir, "train_step") if m["step"] == 2]
    assert step["refit_bytes"] > 500e6 and step["trainer_tokens"] > 0

    out = tmp_path / "export"
    assert main(["export", "--run-dir", str(run_dir), "--out", str(out)]) == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer  # late: only this test needs them here

    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3+4?"}], add_generation_prompt=True,
                                        tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
    expected = logits.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        before = base(torch.tensor([ids])).logits[0, :-1].log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])
    assert (expected - before[:, 0]).abs().max().item() > 0  # two steps moved the weights: the export is trained
    served = asyncio.run(vllm_prompt_logprobs(out, ids))
    difference = (served - expected).abs().max().item()
    print(f"\nSmolLM2 export: vLLM prompt logprobs vs transformers', max abs difference {difference:.3g}")
    assert difference < 1e-2
