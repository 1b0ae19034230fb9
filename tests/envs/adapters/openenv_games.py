"""The OpenEnv example's game as the adapter's tests play it: its app, its options, an episode of a seed."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
from pathlib import Path

import pytest

from turnkeep.envs.adapters.openenv_env import OpenEnvEnvironment, OpenEnvOptions
from turnkeep.envs.environment import EnvContext, StepResult
from turnkeep.schemas.rollout import Problem

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "openenv_guess"
INSTALLED = importlib.util.find_spec("turnkeep_example_openenv_guess") is not None
if not INSTALLED:  # pip install -e examples/openenv_guess installs it; else its source folder
    sys.path.insert(0, str(EXAMPLE / "src"))

APP = "turnkeep_example_openenv_guess.server:app"
GAME = dict(app=APP, action_tool="guess", observation_fields=["message"],
            demonstrator="turnkeep_example_openenv_guess.demo:play")


@pytest.fixture(autouse=True)
def example_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers the adapter starts (and `turnkeep run`'s processes) import the example package too."""
    if not INSTALLED:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXAMPLE / "src"),
                                                                        os.environ.get("PYTHONPATH")])))


def secret_of(seed: int) -> int:
    return random.Random(seed).randint(1, 8)


def guess(number: object) -> str:
    return f'<tool_call>{{"name": "guess", "arguments": {{"number": {json.dumps(number)}}}}}</tool_call>'


def episode(seed: int = 3, ctx_seed: int = 0, **options) -> OpenEnvEnvironment:
    problem = Problem(question=f"openenv episode seed {seed}", env="guess", metadata={"seed": seed})
    return OpenEnvEnvironment(problem, EnvContext(options=OpenEnvOptions(**{**GAME, **options}), seed=ctx_seed))


async def play(env: OpenEnvEnvironment, turns: list[str]) -> list[StepResult]:
    try:
        return [await env.step(turn) for turn in turns]
    finally:
        await env.close()
