"""TRL's GRPOTrainer on turnkeep's single-turn `tool_chat` task: the TRL side of a TRL-vs-turnkeep benchmark.

`python -m turnkeep.bench.peers_trl --model DIR --problems FILE.jsonl --out DIR --steps N [--save-steps K]
[--group-size 8] [--prompts-per-step 16] [--lr 1e-4] [--max-completion-length 32] [--temperature 1.0] [--seed 0]
[--resume]` trains the model folder turnkeep trains (its tiny chat model, or any chat model) with TRL 1.16 on the
CPU, on the same problems in the same order, scored by turnkeep's own environment:

- the problems file (`write_problems` writes it from a turnkeep config): one JSON record a line, {"question",
  "answer", "task" (the `[environments]` entry that runs it: turnkeep's `Problem.env`), "metadata" (the problem's
  metadata: the reasoning-gym entry under "reasoning_gym")}, drawn as turnkeep's dataloader draws its groups;
- each prompt is the user message alone, rendered by the model's chat template with the generation prompt and no
  tools: the ids turnkeep's `TurnCodec.conversation_start` gives (the same template, no special tokens added);
- generation stops on turnkeep's stop ids (`TurnCodec.stop_ids`: the template's end-of-turn token and the declared
  eos), set as the model's generation eos so that TRL both stops and masks there;
- a completion is scored as turnkeep scores a final turn: its ids decoded by `TurnCodec.turn_text` (specials kept,
  end-of-turn dropped), handed to a `ToolChatEnvironment` built over the record's `Problem`, rewarded by its
  `reward()` (the last `<answer>...</answer>` or the whole turn, checked by the reasoning-gym task's `score_answer`).
  A turn with a tool call has no final answer within one turn: 0, as in turnkeep with `rollout.max_turns = 1`.

One optimizer step = `prompts_per_step` prompts x `group_size` completions, generated and trained on at once
(TRL's generation batch = its train batch; `num_iterations = 1`). Each step appends one fsynced line to
`<out>/steps.jsonl`: {"step", "t", "wall_s" (since this process started), "reward_mean", "completion_tokens"
(generated this step, stop tokens included, as turnkeep counts a turn), "completions", "problems" (the step's
first and last problem index), "rss_mib" (peak), "cpu_s" (this process's CPU seconds so far), "resumed"}.
`<out>/meta.json` records the versions and the GRPOConfig settings; TRL's checkpoints go to
`<out>/trl/checkpoint-<step>` every `--save-steps`. `--resume` continues from the newest of them through
transformers' own resume path (`resume_from_checkpoint=True`: weights, AdamW, scheduler, RNG, and the dataloader
skipped to the step), or starts fresh when there is none; a resumed process's lines say "resumed": true, and the
steps after the checkpoint appear twice in steps.jsonl (a reader keeps a step's last line).

What differs from turnkeep by design: TRL is synchronous and on-policy (generate, then train, one process; the
PPO ratio is 1 at its only pass), turnkeep generates ahead up to `train.max_staleness` versions and takes the
groups that complete first; TRL divides by the group's std + 1e-4 (turnkeep: + 1e-6); TRL samples with
transformers' `generate`, turnkeep with its engine; a checkpoint TRL is killed while writing is not atomic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, GRPOTrainer

from turnkeep.config.loader import load_config
from turnkeep.controller.state.dataloader import PromptDataloader
from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.tool_chat_env import ToolChatEnvironment, ToolChatOptions
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import Problem
from turnkeep.workers.prompts import prompt_source

TORCH_THREADS = 2
"""Both cores: turnkeep's tiny run spends them on a trainer (`train.torch_threads = 1`) and a policy engine beside
it; TRL generates and trains in this one process, one after the other, so it gets both."""
SINGLE_TURN = ToolChatOptions(tools=[], max_tool_calls=0)
"""The environment's options in the single-turn run (the options only matter to a turn with a tool call, which
has no final answer within one turn either way)."""


def write_problems(cfg_path_or_config: Path | str | TurnkeepConfig, count: int, path: Path | str) -> list[dict]:
    """Problems 0..count-1 of a run, as its controller draws them (`workers.prompts.prompt_source` through the
    `PromptDataloader` the controller builds: group i is problem i), written to `path` as JSONL; returns them."""
    cfg = cfg_path_or_config
    if not isinstance(cfg, TurnkeepConfig):
        cfg = load_config(Path(cfg))
    loader = PromptDataloader(prompt_source(cfg), cfg.run.seed, cfg.environments, shuffle=cfg.data.shuffle)
    records = []
    for _ in range(count):
        _, problem = loader.next_group()
        records.append({"question": problem.question, "answer": problem.answer, "task": problem.env,
                        "metadata": problem.metadata})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return records


def read_problems(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def problems_dataset(records: list[dict]) -> datasets.Dataset:
    """TRL's conversational dataset: "prompt" (the user message) and what the reward needs; the answer and the
    metadata travel as JSON text (their types may differ from record to record, which Arrow refuses)."""
    return datasets.Dataset.from_dict({
        "prompt": [[{"role": "user", "content": record["question"]}] for record in records],
        "question": [record["question"] for record in records],
        "answer_json": [json.dumps(record.get("answer")) for record in records],
        "task": [record.get("task", "tool_chat") for record in records],
        "metadata_json": [json.dumps(record.get("metadata", {})) for record in records],
        "index": list(range(len(records))),
    })


async def _score_turn(problem: Problem, turn_text: str) -> float:
    env = ToolChatEnvironment(problem, EnvContext(options=SINGLE_TURN))
    await env.step(turn_text)
    return env.reward()


def score_turns(problems: list[Problem], turn_texts: list[str]) -> list[float]:
    """Each final turn's reward, as turnkeep's environment server gives it."""
    async def score_all() -> list[float]:
        return list(await asyncio.gather(*(_score_turn(p, t) for p, t in zip(problems, turn_texts, strict=True))))

    return asyncio.run(score_all())


class StepTally:
    """What the reward function saw since the last step line: rewards, generated tokens, problem indexes."""

    def __init__(self) -> None:
        self.rewards: list[float] = []
        self.tokens = 0
        self.indexes: list[int] = []

    def drain(self) -> dict[str, Any]:
        rewards, indexes = self.rewards, self.indexes
        summary = {"reward_mean": sum(rewards) / len(rewards) if rewards else None, "completion_tokens": self.tokens,
                   "completions": len(rewards), "problems": [min(indexes), max(indexes)] if indexes else None}
        self.rewards, self.tokens, self.indexes = [], 0, []
        return summary


class ToolChatReward:
    """TRL reward function: each completion's ids as turnkeep's environment sees the turn, scored by it."""

    __name__ = "tool_chat"

    def __init__(self, codec: TurnCodec, tally: StepTally | None = None) -> None:
        self._codec = codec
        self.tally = tally if tally is not None else StepTally()

    def __call__(self, prompts: list, completions: list, completion_ids: list[list[int]], question: list[str],
                 answer_json: list[str], task: list[str], metadata_json: list[str], index: list[int],
                 **_: Any) -> list[float]:
        problems = [Problem(question=q, answer=json.loads(a), env=t, metadata=json.loads(m))
                    for q, a, t, m in zip(question, answer_json, task, metadata_json, strict=True)]
        rewards = score_turns(problems, [self._codec.turn_text(list(ids)) for ids in completion_ids])
        self.tally.rewards += rewards
        self.tally.tokens += sum(len(ids) for ids in completion_ids)
        self.tally.indexes += list(index)
        return rewards


class StepLines(TrainerCallback):
    """One fsynced line per optimizer step in `path`."""

    def __init__(self, path: Path, tally: StepTally, resumed: bool) -> None:
        self._path = path
        self._tally = tally
        self._resumed = resumed

    def on_step_end(self, args, state, control, **kwargs):
        now = time.time()
        line = {"step": state.global_step, "t": round(now, 3), "wall_s": round(process_age_s(), 3),
                **self._tally.drain(), "rss_mib": round(peak_rss_mib(), 1), "cpu_s": round(cpu_seconds(), 3),
                "resumed": self._resumed}
        with open(self._path, "a") as out:
            out.write(json.dumps(line) + "\n")
            out.flush()
            os.fsync(out.fileno())
        return control


def process_age_s() -> float:
    """Seconds since this process started (Linux: its start tick against the boot clock, to 10 ms; psutil's
    create_time rounds the boot time to the second)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cpu_seconds() -> float:
    """This process's CPU time so far (user + system): a step's cost apart from what else the machine runs."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def grpo_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The GRPOConfig keywords, each as turnkeep's settings have it (the module docstring and meta.json)."""
    return dict(
        output_dir=str(Path(args.out) / "trl"),
        num_generations=args.group_size,                                     # rollout.group_size
        # TRL's batch counts completions: train.prompts_per_step x group_size of them, generated and trained on
        # at once (TRL's generation batch = its train batch: one generation per optimizer step).
        per_device_train_batch_size=args.group_size * args.prompts_per_step,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,                                                    # train.passes_per_batch = 1
        shuffle_dataset=False,                                               # the problems file's order
        loss_type="dapo",                                                    # algorithm.loss_agg = "token_mean"
        scale_rewards="group",                                               # algorithm.scale_rewards = "group"
        beta=0.0,                                                            # algorithm.kl_coef = 0
        epsilon=0.2,                                                         # train.clip_eps (clip_high = clip_low)
        mask_truncated_completions=False,                                    # algorithm.mask_truncated = false
        learning_rate=args.lr,                                               # train.lr
        lr_scheduler_type="constant", warmup_steps=0,                        # turnkeep's AdamW has no schedule
        weight_decay=0.0, max_grad_norm=1.0,                                 # train.weight_decay, max_grad_norm
        max_completion_length=args.max_completion_length,                    # rollout.max_tokens_per_turn
        temperature=args.temperature, top_p=1.0, top_k=0,                    # rollout.temperature, plain sampling
        use_vllm=False, use_cpu=True, bf16=False, fp16=False,                # float32 on the CPU, as the tiny run
        gradient_checkpointing=False,                                        # train.gradient_checkpointing = false
        max_steps=args.steps, logging_steps=1,
        save_strategy="steps", save_steps=args.save_steps,                   # train.save_period
        report_to="none", seed=args.seed, dataloader_num_workers=0, disable_tqdm=True,
    )


def load_policy(model_dir: Path) -> tuple[Any, Any, TurnCodec]:
    """(model, tokenizer, codec) of the folder; the model's generation eos is turnkeep's stop ids, so TRL stops
    where turnkeep's engine stops (the tiny template ends a turn on a newline, not on <eos>)."""
    codec = TurnCodec(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.eos_token_id = list(codec.stop_ids)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer, codec


def write_meta(out: Path, args: argparse.Namespace, settings: dict, config: GRPOConfig, checkpoint: str | None,
               codec: TurnCodec, problems: int) -> None:
    """meta.json: versions, settings, and each process start (a resume adds one)."""
    path = out / "meta.json"
    meta = json.loads(path.read_text()) if args.resume and path.exists() else {}
    meta.update({
        "trl_version": trl.__version__, "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "datasets_version": datasets.__version__, "torch_threads": TORCH_THREADS,
        "model": str(args.model), "problems_file": str(args.problems), "problems": problems,
        "grpo_config": settings, "stop_token_ids": list(codec.stop_ids),
        "derived": {"generation_batch_size": config.generation_batch_size,
                    "steps_per_generation": config.steps_per_generation, "shuffle_dataset": config.shuffle_dataset},
    })
    meta.setdefault("starts", []).append({"t": round(time.time() - process_age_s(), 3), "pid": os.getpid(),
                                          "resumed_from": checkpoint, "argv": sys.argv[1:]})
    path.write_text(json.dumps(meta, indent=2) + "\n")


def train(args: argparse.Namespace) -> Path:
    """Train as `args` say; returns the steps.jsonl path."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = grpo_settings(args)
    checkpoint = None
    if args.resume and Path(settings["output_dir"]).is_dir():
        checkpoint = get_last_checkpoint(settings["output_dir"])
    steps_path = out / "steps.jsonl"
    if checkpoint is None:
        steps_path.write_text("")  # a fresh start: its own lines only
    records = read_problems(Path(args.problems))
    needed = args.steps * args.prompts_per_step
    if len(records) < needed:
        print(f"peers_trl: {len(records)} problems for {needed} prompts: TRL goes over them again",
              file=sys.stderr)
    config = GRPOConfig(**settings)
    model, tokenizer, codec = load_policy(Path(args.model))
    tally = StepTally()
    trainer = GRPOTrainer(model=model, reward_funcs=ToolChatReward(codec, tally), args=config,
                          train_dataset=problems_dataset(records), processing_class=tokenizer,
                          callbacks=[StepLines(steps_path, tally, resumed=checkpoint is not None)])
    write_meta(out, args, settings, config, checkpoint, codec, len(records))
    trainer.train(resume_from_checkpoint=True if checkpoint is not None else None)
    return steps_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m turnkeep.bench.peers_trl", description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="model folder (e.g. `turnkeep make-model`'s)")
    parser.add_argument("--problems", type=Path, required=True, help="JSONL problems (write_problems)")
    parser.add_argument("--out", type=Path, required=True, help="steps.jsonl, meta.json and trl/ checkpoints")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps (max_steps)")
    parser.add_argument("--save-steps", type=int, default=5, help="checkpoint every this many steps")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--prompts-per-step", type=int, default=16, help="prompts per optimizer step")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUT/trl")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(TORCH_THREADS)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
