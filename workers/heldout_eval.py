"""`turnkeep eval --model DIR`: a model (the base one, or an export) played on held-out problems without training.

The model is served by the run's own policy server (vLLM, its HTTP endpoint on loopback), the episodes are played by
the run's agent loop against the run's environments (the episode of an in-run evaluation: `envs/eval_agent.py`),
each problem `samples` times at `temperature`; a sample is correct when its reward is at least `correct_at`, and one
that failed scores 0 and is counted. The result: mean reward, pass@k for each k the samples estimate without bias,
and the counts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.engine_router import EngineRouter
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.eval_agent import run_evaluation
from turnkeep.envs.kinds import EnvironmentFactory
from turnkeep.gpu_workers.policy_server import PolicyServer
from turnkeep.primitives.pass_at_k import correct_counts, estimable_ks, pass_at_k
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import Problem, RolloutRequest, RolloutResult


@dataclass(frozen=True)
class EvalSettings:
    samples: int = 4
    temperature: float = 1.0
    correct_at: float = 1.0
    concurrency: int = 32


@dataclass
class EvalResult:
    prompts: int
    samples: int
    mean_reward: float
    pass_at: dict[int, float]
    correct: list[int] = field(default_factory=list)
    seconds: float = 0.0
    failed: int = 0
    """Samples whose episode failed (they score 0)."""

    def line(self) -> str:
        passes = " ".join(f"pass@{k} {value:.3f}" for k, value in self.pass_at.items())
        failed = f", {self.failed} samples failed" if self.failed else ""
        return (f"eval: {self.prompts} prompts x {self.samples} samples: mean reward {self.mean_reward:.3f} {passes} "
                f"({self.seconds:.1f} s{failed})")


async def evaluate(cfg: TurnkeepConfig, model_dir: Path, problems: list[Problem], settings: EvalSettings) -> EvalResult:
    started = time.monotonic()
    server = PolicyServer()
    policy_cfg = cfg.policy.model_copy(update={"dtype": cfg.policy.dtype or cfg.model.dtype, "host": "127.0.0.1",
                                               "port": 0})
    url = await server.start(model_dir, policy_cfg, seed=cfg.run.seed, control_token=None)
    try:
        rewards, failed = await _play(cfg, model_dir, url, problems, settings)
    finally:
        await server.stop()
    correct = correct_counts(rewards, settings.correct_at)
    mean = sum(map(sum, rewards)) / max(1, sum(map(len, rewards)))
    return EvalResult(len(problems), settings.samples, mean,
                      {k: pass_at_k(correct, settings.samples, k) for k in estimable_ks(settings.samples)},
                      correct, time.monotonic() - started, failed)


async def _play(cfg: TurnkeepConfig, model_dir: Path, url: str, problems: list[Problem],
                settings: EvalSettings) -> tuple[list[list[float]], int]:
    """Each problem's rewards, and how many samples failed."""
    codec = TurnCodec(model_dir)
    factory = EnvironmentFactory.from_specs(cfg.environments, EnvContext(tool_latency_s=0.0))
    gate = asyncio.Semaphore(settings.concurrency)

    async def episode(policy: EngineRouter, index: int, sample: int) -> RolloutResult:
        async with gate:
            request = RolloutRequest(rollout_id=f"eval.{index}.{sample}.0", group_id=f"eval.{index}",
                                     sibling=sample, attempt=0, problem=problems[index],
                                     evaluation_temperature=settings.temperature)
            return await run_evaluation(request, factory, codec, policy, cfg.rollout_limits())

    async with aiohttp.ClientSession() as session:
        policy = EngineRouter([url], session)
        results = await asyncio.gather(*(episode(policy, i, s) for i in range(len(problems))
                                         for s in range(settings.samples)))
    rewards = [result.row.reward if result.row is not None else 0.0 for result in results]
    return ([rewards[i * settings.samples:(i + 1) * settings.samples] for i in range(len(problems))],
            sum(result.row is None for result in results))
