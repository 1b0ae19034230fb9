"""The device check's recipe run (`gpu_check.py --recipe`): `turnkeep run` of a GPU recipe (by default
`configs/gpu_tool_chat.toml`: a real chat model by hub id on the `tool_chat` task, with evaluation) for a few steps,
where the machine has what the run needs; otherwise what is missing, in one line.

It needs vLLM, Ray and the Temporal SDK (`pip install -e '.[gpu]'`), the GPUs the recipe's placement asks for, and
the model (in the Hugging Face cache, or a network to fetch it). The report: the command, its exit status, the train
steps, the first and last step's reward, and each evaluation's pass@1; on a failure, the end of its output.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import orjson
import torch

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 3600
NEEDED = {"vllm": "vLLM", "ray": "Ray", "temporalio": "the Temporal SDK"}


def missing_for(cfg) -> str | None:
    """What this machine lacks for the recipe's run (None: nothing)."""
    absent = [name for module, name in NEEDED.items() if importlib.util.find_spec(module) is None]
    if absent:
        return f"no {', '.join(absent)} on this machine: pip install -e '.[gpu]'"
    placement = cfg.placement
    gpus = 1 if placement.share_gpus else placement.trainer_gpus + placement.policy_gpus * cfg.policy.engines
    have = torch.cuda.device_count()
    if have < gpus:
        return f"the recipe's placement needs {gpus} CUDA GPU(s); this machine has {have}"
    return None


def check_recipe(cfg, config: Path, sets: list[str], out: Path, steps: int) -> dict:
    missing = missing_for(cfg)
    if missing is not None:
        return {"skipped": missing}
    run_dir = out / "recipe"
    command = [sys.executable, "-m", "turnkeep", "run", "--config", str(config), "--run-dir", str(run_dir),
               "--steps", str(steps), *[arg for pair in sets for arg in ("--set", pair)]]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"command": " ".join(command[2:]), "failed": f"still running after {RUN_TIMEOUT_S} s"}
    report = {"command": " ".join(command[2:]), "exit": done.returncode, **_figures(run_dir / "metrics.jsonl")}
    if done.returncode != 0:
        report["output"] = (done.stdout + done.stderr)[-3000:]
    return report


def _figures(metrics: Path) -> dict:
    lines = [orjson.loads(raw) for raw in metrics.read_bytes().splitlines()] if metrics.exists() else []
    steps = [line for line in lines if line.get("kind") == "train_step"]
    return {"train_steps": len(steps),
            "reward_first": steps[0]["reward_mean"] if steps else None,
            "reward_last": steps[-1]["reward_mean"] if steps else None,
            "eval_pass_at_1": {line["step"]: line["pass@1"] for line in lines if line.get("kind") == "eval"}}
