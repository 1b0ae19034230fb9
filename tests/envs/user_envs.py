"""Environment classes as a user would write them, good and broken, for the loader's tests."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.schemas.rollout import Problem, PromptRecord


class EchoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    turns: int = Field(default=2, ge=1)


class Echo(Environment):
    """Echoes each turn back; done after `options.turns` turns."""

    kind = "echo"
    recovery_mode = "stateless"
    Options = EchoOptions

    def __init__(self, problem: Problem, ctx: EnvContext) -> None:
        self._turns_left = ctx.options.turns
        self._problem = problem

    def prompt(self) -> str:
        return self._problem.question + "\n"

    async def step(self, turn_text: str) -> StepResult:
        self._turns_left -= 1
        return StepResult(observation=f"R {turn_text.strip()}\n", done=self._turns_left <= 0)

    def reward(self) -> float:
        return 1.0


class NoRecoveryMode(Echo):
    recovery_mode = None  # type: ignore[assignment]


class UnknownRecoveryMode(Echo):
    recovery_mode = "snapshotted"  # type: ignore[assignment]


class Abstract(Environment):
    kind = "abstract"
    recovery_mode = "stateless"


class NotAnEnvironment:
    pass


BROKEN_AT_IMPORT = False


class WithDataset(Echo):
    """Echo with a dataset of its own: three training rows, one held-out row."""

    kind = "echo_rows"

    @classmethod
    def dataset(cls, options: BaseModel, split: str) -> list[PromptRecord] | None:
        if split == "heldout":
            return [PromptRecord(prompt="held", answer=0, metadata={"row": "h0"})]
        return [PromptRecord(prompt=f"q{i}", answer=i, metadata={"row": i}) for i in range(3)]
