"""`replay` environments for the replay tests: the calculator, held at a pinned turn while a file says so (the moment
a test kills the run), and one whose tool replies change after a restart (an environment that is not deterministic).

Loaded by a run's environment server as `tests.envs.replay_envs:HeldCalc` (the repository is the run's cwd).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.calc_task import CalcCall, run_tool
from turnkeep.envs.environment import EnvContext, StepResult
from turnkeep.schemas.rollout import Problem

HOLD_FILE = "hold"
"""While `<hold_dir>/hold` exists, an episode's step of turn `at_turn` waits (for the test's kill)."""
RESTARTED_FILE = "restarted"
"""Once `<hold_dir>/restarted` exists, a `differs` environment answers each call one more than it should."""


class HeldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    hold_dir: str
    at_turn: int = 1
    differs: bool = False


class HeldCalc(CalcEnvironment):
    kind = "held_calc"
    recovery_mode = "replay"
    Options = HeldOptions

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        super().__init__(problem, ctx)
        self._options: HeldOptions = ctx.options  # type: ignore[assignment]
        self._dir = Path(self._options.hold_dir)
        self._replaying = False

    async def replay(self, turns: list[str]) -> list[str | None]:
        self._replaying = True
        try:
            return await super().replay(turns)
        finally:
            self._replaying = False

    async def step(self, turn_text: str) -> StepResult:
        if len(self.turns) == self._options.at_turn and not self._replaying and (self._dir / HOLD_FILE).exists():
            (self._dir / f"held-{self._problem.env}-{os.getpid()}-{id(self)}").touch()
            await asyncio.sleep(3600)  # until the test kills the run
        return await super().step(turn_text)

    async def _call_tool(self, call: CalcCall) -> str:
        reply = run_tool(call)
        if self._options.differs and (self._dir / RESTARTED_FILE).exists():
            return run_tool(CalcCall(call.a, call.op, call.b + 1))
        return reply
