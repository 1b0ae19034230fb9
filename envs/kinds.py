"""The environment kinds a run can configure, and what each reports about itself.

`[environments.<name>]` picks a kind per name; the server builds an episode's
environment from its problem's `env` name, and reports every configured environment's
recovery capabilities (`GET /environments`) for the controller to lower its level.
"""

from __future__ import annotations

from envs.calc_env import CalcEnvironment
from envs.environment import EnvContext, Environment
from envs.judge_env import JudgeEnvironment
from envs.lab_env import LabEnvironment
from envs.workspace_env import WorkspaceEnvironment
from schemas.config import EnvironmentSpec
from schemas.environments import EnvironmentCapabilities
from schemas.rollout import Problem

ENV_KINDS: dict[str, type[Environment]] = {
    cls.kind: cls for cls in (CalcEnvironment, WorkspaceEnvironment, LabEnvironment, JudgeEnvironment)
}


def environment_capabilities(
    environments: dict[str, EnvironmentSpec], group_size: int
) -> list[EnvironmentCapabilities]:
    reports = []
    for name, spec in sorted(environments.items()):
        cls = ENV_KINDS[spec.kind]
        reports.append(EnvironmentCapabilities(
            name=name, kind=spec.kind, recovery_mode=cls.recovery_mode, group_scored=cls.group_scored,
            group_size=(spec.group_size or group_size) if cls.group_scored else None,
        ))
    return reports


class EnvironmentFactory:
    """Builds the environment a problem names."""

    def __init__(self, environments: dict[str, EnvironmentSpec], ctx: EnvContext) -> None:
        self._environments = environments
        self._ctx = ctx

    def kind_of(self, env_name: str) -> type[Environment]:
        spec = self._environments.get(env_name)
        if spec is None:
            raise ValueError(
                f"problem names environment {env_name!r}, which this server does not run "
                f"(configured: {sorted(self._environments)}); start it with the run's [environments] table"
            )
        return ENV_KINDS[spec.kind]

    def make(self, problem: Problem) -> Environment:
        return self.kind_of(problem.env)(problem, self._ctx)
