"""A held-out evaluation's episode on an environment server: the run's agent loop at the evaluation's temperature.

It is not a training rollout: its turns are not journaled or audited, it is not parked by snapshots (its policy
calls wait at the engines' admission gate like every call) and its result needs no ACK. Its durability is the
controller's: the controller journals the reward when the episode ends and plays an episode a crash cut again from
its start, so no sample is scored twice (`controller/pumps/eval_pump.py`).
"""

from __future__ import annotations

import dataclasses

import aiohttp
from pydantic import ValidationError

from turnkeep.envs.agent_loop import for_environment, run_agent
from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.engine_router import EngineRouter
from turnkeep.envs.kinds import EnvironmentFactory
from turnkeep.envs.policy_client import PolicyCallError
from turnkeep.envs.turn_records import TurnRecords
from turnkeep.schemas.environments import RolloutLimits
from turnkeep.schemas.rollout import RolloutOutcome, RolloutRequest, RolloutResult


async def run_evaluation(request: RolloutRequest, factory: EnvironmentFactory, codec: TurnCodec,
                         policy: EngineRouter, limits: RolloutLimits) -> RolloutResult:
    assert request.evaluation_temperature is not None
    try:
        env = factory.make_for(request)
    except ValueError as err:
        return _failed(request, str(err))
    episode = dataclasses.replace(for_environment(limits, request.problem.env),
                                  temperature=request.evaluation_temperature, journal_partial_turns=False)
    try:
        return await run_agent(request, env, codec, policy, TurnRecords(), _no_park, episode)
    except (PolicyCallError, aiohttp.ClientError, ValidationError, RuntimeError) as err:
        return _failed(request, f"{type(err).__name__}: {err}")
    finally:
        policy.forget(request.rollout_id)
        await env.close()


async def _no_park() -> None:
    return None


def _failed(request: RolloutRequest, reason: str) -> RolloutResult:
    return RolloutResult(rollout_id=request.rollout_id, outcome=RolloutOutcome.FAILED, reason=reason)
