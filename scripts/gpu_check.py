"""The device check of a GPU node: what one trainer process does with the GPU config's model.

    python scripts/gpu_check.py                     # configs/gpu.toml on CUDA (on CPU if none)
    python scripts/gpu_check.py --small --out DIR   # a small shape, as the test suite runs it on CPU

It needs only PyTorch, transformers, safetensors, tokenizers, pydantic and orjson: no
vLLM, Ray or Temporal. It makes the config's model locally (random weights of the
configured shape, no warm start), builds the real `gpu_workers.trainer.Trainer` on the
configured device and prints, then writes to `<out>/gpu_check.json`:

- a GRPO train step (the real forward, backward, hold and optimizer step) on synthetic
  rows: seconds per step and tokens per second, after one warm-up step;
- a trainer checkpoint saved from and loaded back into device memory, in seconds;
- the refit's weight serialisation (device -> host safetensors bytes), in GB/s, against one in-memory copy of the
  same bytes (what a refit into N engines costs on top: the engines read one object);
- the hold before the optimizer step: with a holder in the trainer hold, a step
  computes but does not update the weights until the holder is released;
- with `--ranks`: one trainer group of 1 and of 2 ranks (`scripts/rank_check.py`, a process and a GPU per rank,
  NCCL between them; gloo on the CPU): step time on the same rows split between the ranks, a sharded checkpoint's
  save and load, each rank's peak memory; two ranks need two GPUs, and where there are fewer the report says so;
- with `--engines`: `turnkeep bench engines` on the same config (1 and 2 vLLM engines: tokens/s, refit into 1 and
  2 engines against one memory copy, an engine's death to its replacement's first turn), where the machine has
  vLLM and the GPUs for a trainer and two engines; otherwise the reason it was left out;
- with `--recipe`: `turnkeep run` of a GPU recipe (`--recipe-config`, default `configs/gpu_tool_chat.toml`: a real
  chat model on the `tool_chat` task with evaluation) for `--recipe-steps` steps (`scripts/recipe_check.py`), where
  the machine has vLLM, Ray, Temporal's SDK and the GPUs; otherwise what is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import orjson
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from turnkeep.config.loader import ConfigError, load_config, parse_overrides  # noqa: E402
from turnkeep.gpu_workers.tiny_model.tokenizer import SPECIAL_TOKENS  # noqa: E402
from turnkeep.gpu_workers.trainer import Trainer  # noqa: E402
from turnkeep.primitives.holds import HoldSet  # noqa: E402
from turnkeep.schemas.rollout import RolloutRow, Segment  # noqa: E402
from turnkeep.workers.model_maker import tiny_model_dir  # noqa: E402

SMALL = {
    "model.tiny.hidden_size": 64, "model.tiny.num_layers": 2, "model.tiny.num_heads": 2, "model.tiny.head_dim": 32,
    "model.tiny.num_kv_heads": 1, "model.tiny.intermediate_size": 128, "model.tiny.max_position_embeddings": 128,
    "train.prompts_per_step": 2, "rollout.group_size": 2,
}
BOS_ID = 1
HOLD_S = 1.0
"""How long the hold check keeps the optimizer step waiting."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        overrides = {**(SMALL if args.small else {}), "model.cache_dir": str(args.out / "models"),
                     **parse_overrides(args.set)}
        cfg = load_config(args.config, overrides)
    except ConfigError as err:
        print(f"gpu_check: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(_check(cfg, args.out, args.seq_len, args.steps, args.ranks))
    if args.engines:
        report["engines"] = _engines(args.config, args.set, args.out / "engines",
                                     cfg.placement.trainer_gpus + 2 * cfg.placement.policy_gpus)
    if args.recipe:
        from scripts.recipe_check import check_recipe

        report["recipe"] = check_recipe(load_config(args.recipe_config, parse_overrides(args.set)), args.recipe_config,
                                        args.set, args.out, args.recipe_steps)
    (args.out / "gpu_check.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0 if report["hold_check"]["held"] else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "gpu.toml")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "turnkeep-gpu-check")
    parser.add_argument("--small", action="store_true", help="a small model shape (the CPU test)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per row (default: model.tiny.max_position_embeddings)")
    parser.add_argument("--steps", type=int, default=3, help="timed train steps after the warm-up step")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--engines", action="store_true", help="also run `turnkeep bench engines` where it can")
    parser.add_argument("--ranks", action="store_true", help="also time a trainer group of 1 and of 2 ranks")
    parser.add_argument("--recipe", action="store_true", help="also run a GPU recipe for a few steps where it can")
    parser.add_argument("--recipe-config", type=Path, default=REPO / "configs" / "gpu_tool_chat.toml")
    parser.add_argument("--recipe-steps", type=int, default=5)
    return parser


async def _check(cfg, out: Path, seq_len: int | None, steps: int, ranks: bool = False) -> dict:
    made = time.perf_counter()
    model_dir = tiny_model_dir(cfg, eval_rollouts=0)
    made_s = time.perf_counter() - made
    trainer = Trainer(model_dir, cfg.train, cfg.model.dtype, cfg.run.seed, cfg.rollout.temperature, HoldSet("trainer"))
    params = sum(p.numel() for p in trainer.model.parameters())
    seq_len = seq_len or min(cfg.model.tiny.max_position_embeddings, 1024)
    rows = _rows(cfg.train.prompts_per_step * cfg.rollout.group_size, seq_len, trainer.model.config.vocab_size)
    report = {
        "device": _device_name(trainer.device), "dtype": cfg.model.dtype, "autocast_bf16": trainer.autocast,
        "gradient_checkpointing": cfg.train.gradient_checkpointing, "parameters": params,
        "model_made_s": round(made_s, 2), "rows_per_step": len(rows), "tokens_per_row": seq_len,
        "passes_per_batch": cfg.train.passes_per_batch,
    }
    report["numerics"] = _numerics(trainer, rows)
    report["train_step"] = await _time_steps(trainer, rows, steps)
    report["checkpoint"] = await _time_checkpoint(trainer, out / "checkpoint")
    report["refit_serialisation"] = await _time_serialisation(trainer, cfg.policy.dtype or cfg.model.dtype)
    report["hold_check"] = await _hold_check(trainer, rows)
    if trainer.device.type == "cuda":
        report["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if ranks:
        from scripts.rank_check import check_ranks

        del trainer  # its weights and optimizer state would sit beside the ranks' on the first GPU
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        report["ranks"] = check_ranks(cfg, model_dir, rows, steps)
    return report


def _engines(config: Path, sets: list[str], out: Path, gpus_needed: int) -> dict:
    """`turnkeep bench engines` on this config where it can run here, else why not."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "no vLLM on this machine (pip install -e '.[gpu]'); the engines are measured where it is"}
    have = torch.cuda.device_count()
    if have < gpus_needed:
        return {"skipped": f"a trainer and two engines need {gpus_needed} GPUs; this machine has {have}"}
    command = [sys.executable, "-m", "turnkeep", "bench", "engines", "--config", str(config), "--out", str(out),
               "--set", "placement.share_gpus=false", *[arg for pair in sets for arg in ("--set", pair)]]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        return {"failed": f"exit {done.returncode}", "output": done.stdout[-2000:] + done.stderr[-2000:]}
    return {"command": " ".join(command[2:]), "result": orjson.loads((out / "engines.json").read_bytes())}


def _rows(count: int, seq_len: int, vocab: int) -> list[RolloutRow]:
    """Synthetic groups: `<bos>`, a prompt of a quarter of the row, then policy turns, rewards half right.

    Token ids avoid the special tokens, as real conversations do: a `<pad>` (whose embedding
    row is zero) inside a sequence gives this model non-finite gradients.
    """
    rng = random.Random(0)
    prompt = seq_len // 4
    first = len(SPECIAL_TOKENS)
    rows = []
    for i in range(count):
        policy = seq_len - prompt
        segments = [
            Segment(kind="prompt", token_ids=[BOS_ID] + [rng.randrange(first, vocab) for _ in range(prompt - 1)]),
            Segment(kind="policy", token_ids=[rng.randrange(first, vocab) for _ in range(policy)],
                    logprobs=[-rng.random() * 3 for _ in range(policy)], policy_version=0),
        ]
        rows.append(RolloutRow(group_id=f"g{i // 2}", sibling=i % 2, attempt=0, segments=segments,
                               reward=float(i % 2), num_turns=1))
    return rows


def _numerics(trainer: Trainer, rows: list[RolloutRow]) -> dict:
    """Whether the forward pass is finite in full precision and under the trainer's autocast."""
    from turnkeep.gpu_workers.grpo import build_batch

    micro = build_batch(rows[:2], 0).to(trainer.device)
    found = {}
    with torch.no_grad():
        for name, autocast in (("full_precision", False), ("trainer_autocast", trainer.autocast)):
            with torch.autocast(device_type=trainer.device.type, dtype=torch.bfloat16, enabled=autocast):
                logits = trainer.model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
            found[name] = {"finite": bool(torch.isfinite(logits).all()), "max_abs": float(logits.float().abs().max())}
    found["weights_finite"] = all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    return found


async def _time_steps(trainer: Trainer, rows: list[RolloutRow], steps: int) -> dict:
    warm_up = await trainer.train_step(rows, trainer.step + 1)  # allocator, kernels, optimizer state
    _sync(trainer)
    seconds, tokens = [], 0
    for _ in range(steps):
        started = time.perf_counter()
        stats = await trainer.train_step(rows, trainer.step + 1)
        _sync(trainer)
        seconds.append(time.perf_counter() - started)
        tokens += sum(len(s.token_ids) for row in rows for s in row.segments)
    mean = sum(seconds) / len(seconds)
    return {"steps": steps, "step_s": round(mean, 4), "min_step_s": round(min(seconds), 4),
            "tokens_per_s": round(tokens / sum(seconds), 1), "loss": stats["loss"], "grad_norm": stats["grad_norm"],
            "nonfinite_steps_skipped": stats["nonfinite_steps_skipped"],
            "warm_up": {"loss": warm_up["loss"], "grad_norm": warm_up["grad_norm"]}}


async def _time_checkpoint(trainer: Trainer, directory: Path) -> dict:
    _sync(trainer)
    started = time.perf_counter()
    await trainer.save_checkpoint(directory)
    saved_at = time.perf_counter()
    checked = list(trainer.model.named_parameters())[:2]
    saved = {name: p.detach().clone() for name, p in checked}
    with torch.no_grad():
        for _, p in checked:
            p.add_(1.0)  # the load must bring the saved values back, not leave these
    _sync(trainer)
    loading = time.perf_counter()
    version = await trainer.load_checkpoint(directory, trainer.step)
    _sync(trainer)
    loaded = time.perf_counter()
    same = all(torch.equal(saved[name], p) for name, p in trainer.model.named_parameters() if name in saved)
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    return {"save_s": round(saved_at - started, 3), "load_s": round(loaded - loading, 3), "bytes": size,
            "weights_on": str(next(trainer.model.parameters()).device), "round_trip_equal": same,
            "policy_version": version}


async def _time_serialisation(trainer: Trainer, dtype: str, repeats: int = 3) -> dict:
    """As a refit sends the weights: cast to the policy server's dtype on the device, copied to host bytes."""
    seconds, size = [], 0
    for _ in range(repeats):
        _sync(trainer)
        started = time.perf_counter()
        blob = await trainer.weights_blob(dtype)
        seconds.append(time.perf_counter() - started)
        size = len(blob)
    best = min(seconds)
    copies = []
    for _ in range(repeats):
        started = time.perf_counter()
        bytearray(blob)  # one copy of the same bytes in host memory
        copies.append(time.perf_counter() - started)
    return {"dtype": dtype, "bytes": size, "best_s": round(best, 4), "gb_per_s": round(size / best / 1e9, 2),
            "one_memory_copy_s": round(min(copies), 6),
            "serialisation_over_copy": round(best / max(min(copies), 1e-9), 1)}


async def _hold_check(trainer: Trainer, rows: list[RolloutRow]) -> dict:
    """A held trainer computes its step, then waits at the hold and leaves the weights alone until the holder goes."""
    name, param = next(iter(trainer.model.named_parameters()))
    before = param.detach().clone()
    version = trainer.policy_version
    trainer.hold.add("snapshot:gpu-check")
    step = asyncio.get_running_loop().create_task(trainer.train_step(rows, trainer.step + 1))
    while trainer.hold_wait_clock.waiting_since is None and not step.done():
        await asyncio.sleep(0.01)  # the forward and backward run first
    await asyncio.sleep(HOLD_S)
    _sync(trainer)
    unchanged_while_held = torch.equal(before, param.detach()) and trainer.policy_version == version
    pending = not step.done()
    released_at = time.perf_counter()
    trainer.hold.release("snapshot:gpu-check")
    stats = await step
    _sync(trainer)
    return {
        "held": unchanged_while_held and pending and stats["hold_wait_s"] >= HOLD_S,
        "step_waited_s": stats["hold_wait_s"],
        "finished_after_release_s": round(time.perf_counter() - released_at, 3),
        "changed_after_release": not torch.equal(before, param.detach()), "parameter": name,
    }


def _sync(trainer: Trainer) -> None:
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


if __name__ == "__main__":
    sys.exit(main())
