"""`replay` environments for the replay tests, held at a pinned turn while a file says so (the moment a test kills
the run): the calculator, one calculator whose tool replies change after a restart (an environment that is not
deterministic), and the OpenEnv example through its adapter (a real OpenEnv server, replayed on a fresh session).

Loaded by a run's environment server as `tests.envs.replay_envs:<Class>` (the repository is the run's cwd).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from turnkeep.envs.adapters.openenv_env import OpenEnvEnvironment, OpenEnvOptions
from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.calc_task import CalcCall, run_tool
from turnkeep.envs.environment import EnvContext, StepResult
from turnkeep.schemas.rollout import Problem

HOLD_FILE = "hold"
"""While `<hold_dir>/hold` exists, an episode's step of turn `at_turn` waits (for the test's kill)."""
RESTARTED_FILE = "restarted"
"""Once `<hold_dir>/restarted` exists, a `differs` calculator answers each call as if its second number were one
more."""


class HoldAtTurn:
    """Holds a live episode's step of turn `options.at_turn` while `<options.hold_dir>/hold` exists, after writing
    `held-<env>-...` there; a replay is never held."""

    def _start_holding(self, ctx: EnvContext, env_name: str) -> None:
        self._hold_dir, self._at_turn = Path(ctx.options.hold_dir), ctx.options.at_turn  # type: ignore[attr-defined]
        self._env_name, self._steps, self._replaying = env_name, 0, False

    async def replay(self, turns: list[str]) -> list[str | None]:
        self._replaying = True
        try:
            return await super().replay(turns)  # type: ignore[misc]
        finally:
            self._replaying = False

    async def step(self, turn_text: str) -> StepResult:
        if self._steps == self._at_turn and not self._replaying and (self._hold_dir / HOLD_FILE).exists():
            (self._hold_dir / f"held-{self._env_name}-{os.getpid()}-{id(self)}").touch()
            await asyncio.sleep(3600)  # until the test kills the run
        self._steps += 1
        return await super().step(turn_text)  # type: ignore[misc]


class HeldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    hold_dir: str
    at_turn: int = 1
    differs: bool = False


class HeldCalc(HoldAtTurn, CalcEnvironment):
    kind = "held_calc"
    recovery_mode = "replay"
    Options = HeldOptions

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        super().__init__(problem, ctx)
        self._start_holding(ctx, problem.env)
        self._differs = ctx.options.differs  # type: ignore[attr-defined]

    async def _call_tool(self, call: CalcCall) -> str:
        if self._differs and (self._hold_dir / RESTARTED_FILE).exists():
            return run_tool(CalcCall(call.a, call.op, call.b + 1))
        return run_tool(call)


class HeldGuessOptions(OpenEnvOptions):
    hold_dir: str
    at_turn: int = 1


class HeldGuess(HoldAtTurn, OpenEnvEnvironment):
    kind = "held_guess"
    Options = HeldGuessOptions

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        super().__init__(problem, ctx)
        self._start_holding(ctx, problem.env)
