"""`turnkeep eval --model DIR`: a model (the base one, or an export) played on held-out problems without training.

The model is served by the run's own policy server (vLLM, its HTTP endpoint on loopback), the episodes are played by
the run's agent loop against the run's environments, each problem `samples` times at `temperature`; a sample is
correct when its reward is at least `correct_at`. The result: mean reward, pass@k for each k the samples estimate
without bias, and the counts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from turnkeep.envs.agent_loop import LoopLimits, run_agent
from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.kinds import EnvironmentFactory
from turnkeep.envs.policy_client import PolicyClient
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.gpu_workers.policy_server import PolicyServer
from turnkeep.primitives.pass_at_k import estimable_ks, pass_at_k
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import Problem, RolloutRequest


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

    def line(self) -> str:
        passes = " ".join(f"pass@{k} {value:.3f}" for k, value in self.pass_at.items())
        return (f"eval: {self.prompts} prompts x {self.samples} samples: mean reward {self.mean_reward:.3f} {passes} "
                f"({self.seconds:.1f} s)")


async def evaluate(cfg: TurnkeepConfig, model_dir: Path, problems: list[Problem], settings: EvalSettings) -> EvalResult:
    started = time.monotonic()
    server = PolicyServer()
    policy_cfg = cfg.policy.model_copy(update={"dtype": cfg.policy.dtype or cfg.model.dtype, "host": "127.0.0.1",
                                               "port": 0})
    url = await server.start(model_dir, policy_cfg, seed=cfg.run.seed, control_token=None)
    try:
        rewards = await _play(cfg, model_dir, url, problems, settings)
    finally:
        await server.stop()
    correct = [sum(r >= settings.correct_at for r in per_prompt) for per_prompt in rewards]
    mean = sum(map(sum, rewards)) / max(1, sum(map(len, rewards)))
    return EvalResult(len(problems), settings.samples, mean,
                      {k: pass_at_k(correct, settings.samples, k) for k in estimable_ks(settings.samples)},
                      correct, time.monotonic() - started)


async def _play(cfg: TurnkeepConfig, model_dir: Path, url: str, problems: list[Problem],
                settings: EvalSettings) -> list[list[float]]:
    codec = TurnCodec(model_dir)
    factory = EnvironmentFactory.from_specs(cfg.environments, EnvContext(tool_latency_s=0.0))
    limits = LoopLimits(max_turns=cfg.rollout.max_turns, max_tokens_per_turn=cfg.rollout.max_tokens_per_turn,
                        max_model_len=cfg.policy.max_model_len, temperature=settings.temperature)
    gate = asyncio.Semaphore(settings.concurrency)

    async def episode(policy: PolicyClient, index: int, sample: int) -> float:
        async with gate:
            env = factory.make(problems[index])
            request = RolloutRequest(rollout_id=f"eval.{index}.{sample}.0", group_id=f"eval.{index}",
                                     sibling=sample, attempt=0, problem=problems[index])
            try:
                result = await run_agent(request, env, codec, policy, TurnRecords(), _no_park, limits)
            finally:
                await env.close()
            return result.row.reward

    async with aiohttp.ClientSession() as session:
        policy = PolicyClient(url, session)
        flat = await asyncio.gather(*(episode(policy, i, s) for i in range(len(problems))
                                      for s in range(settings.samples)))
    return [list(flat[i * settings.samples:(i + 1) * settings.samples]) for i in range(len(problems))]


async def _no_park() -> None:
    return None
