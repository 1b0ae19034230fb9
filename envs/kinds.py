"""The environment classes a server runs, resolved from the run's `[environments]` table.

A built-in kind (`calc`, `workspace`, `lab`, `judge`, `tool_chat`), an ecosystem's adapter (`verifiers`,
`nemo_gym`, `openenv`: `envs/adapters/`) and a `python` entry resolve the same way, to a class of the public API
(`envs/environment.py`) and its validated options; `remote` environments are served elsewhere (`turnkeep
env-server`) and are skipped here. The server reports every environment it runs (`GET /environments` via its
capabilities) for the controller to lower its recovery level.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import logging

from turnkeep.envs.adapters import ADAPTERS
from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.environment import EnvContext, Environment
from turnkeep.envs.judge_env import JudgeEnvironment
from turnkeep.envs.lab_env import LabEnvironment
from turnkeep.envs.loading import EnvironmentLoadError, LoadedEnvironment, check_options, load_environment
from turnkeep.envs.tool_chat_env import ToolChatEnvironment
from turnkeep.envs.workspace_env import WorkspaceEnvironment
from turnkeep.schemas.choices import EnvironmentKind, RecoveryMode
from turnkeep.schemas.config import EnvironmentSpec
from turnkeep.schemas.environments import EnvironmentCapabilities
from turnkeep.schemas.rollout import Problem, RolloutRequest

log = logging.getLogger("turnkeep.env")

ENV_KINDS: dict[str, type[Environment]] = {
    cls.kind: cls for cls in (CalcEnvironment, WorkspaceEnvironment, LabEnvironment, JudgeEnvironment,
                              ToolChatEnvironment)
}


def resolve(name: str, spec: EnvironmentSpec) -> LoadedEnvironment:
    """The class and options of one local environment; EnvironmentLoadError names what is wrong."""
    if spec.kind in ADAPTERS:
        return _resolve_adapter(name, spec)
    if spec.kind == EnvironmentKind.PYTHON:
        assert spec.entry is not None  # the config refuses a python environment without one
        return load_environment(spec.entry, spec.options, where=f"environments.{name}.entry")
    cls = ENV_KINDS[spec.kind]
    return LoadedEnvironment(cls, check_options(cls, spec.options, where=f"environments.{name}"))


def _resolve_adapter(name: str, spec: EnvironmentSpec) -> LoadedEnvironment:
    entry, install = ADAPTERS[spec.kind]
    module_name = entry.partition(":")[0]
    try:
        importlib.import_module(module_name)
    except ImportError as err:
        raise EnvironmentLoadError(
            f"environments.{name}: kind = {str(spec.kind)!r} needs its ecosystem's package, which does not import "
            f"({type(err).__name__}: {err}); install it: {install}") from None
    return load_environment(entry, spec.options, where=f"environments.{name}")


def local_environments(environments: dict[str, EnvironmentSpec]) -> dict[str, EnvironmentSpec]:
    """The environments the run's own environment server runs (every kind but `remote`)."""
    return {name: spec for name, spec in environments.items() if spec.kind != EnvironmentKind.REMOTE}


def capabilities_of(name: str, loaded: LoadedEnvironment, group_size: int | None) -> EnvironmentCapabilities:
    cls = loaded.cls
    return EnvironmentCapabilities(
        name=name, kind=cls.kind, recovery_mode=cls.recovery_mode_for(loaded.options), group_scored=cls.group_scored,
        group_size=group_size if cls.group_scored else None,
    )


def environment_capabilities(
    environments: dict[str, EnvironmentSpec], group_size: int
) -> list[EnvironmentCapabilities]:
    return [
        capabilities_of(name, resolve(name, spec), spec.group_size or group_size)
        for name, spec in sorted(local_environments(environments).items())
    ]


class EnvironmentFactory:
    """Builds the environment a problem names; every class is resolved (and checked) once, at construction."""

    def __init__(self, loaded: dict[str, LoadedEnvironment], ctx: EnvContext, answer_any_name: bool = False) -> None:
        """`answer_any_name`: a stand-alone server runs one environment, whatever name the run gives it."""
        self._loaded = loaded
        self._ctx = ctx
        self._answer_any_name = answer_any_name and len(loaded) == 1

    @classmethod
    def from_specs(cls, environments: dict[str, EnvironmentSpec], ctx: EnvContext) -> "EnvironmentFactory":
        return cls({name: resolve(name, spec) for name, spec in local_environments(environments).items()}, ctx)

    @property
    def answers_any_name(self) -> bool:
        return self._answer_any_name

    def names(self) -> list[str]:
        return sorted(self._loaded)

    def loaded(self, env_name: str) -> LoadedEnvironment:
        found = self._loaded.get(env_name)
        if found is None and self._answer_any_name:
            [found] = self._loaded.values()
        if found is None:
            raise ValueError(
                f"problem names environment {env_name!r}, which this server does not run "
                f"(configured: {sorted(self._loaded)}); start it with the run's [environments] table"
            )
        return found

    def kind_of(self, env_name: str) -> type[Environment]:
        return self.loaded(env_name).cls

    def mode_of(self, env_name: str) -> RecoveryMode:
        loaded = self.loaded(env_name)
        return loaded.cls.recovery_mode_for(loaded.options)

    def warm_up(self) -> list[asyncio.Task]:
        """Each class's `warm_up` started in the background; a failure is logged here and met again, named, by the
        first episode that needs what it started."""
        tasks = [asyncio.create_task(loaded.cls.warm_up(loaded.options), name=f"warm-up {name}")
                 for name, loaded in sorted(self._loaded.items())]
        for task in tasks:
            task.add_done_callback(_log_warm_up)
        return tasks

    def make(self, problem: Problem, seed: int = 0) -> Environment:
        loaded = self.loaded(problem.env)
        ctx = EnvContext(self._ctx.tool_latency_s, self._ctx.workspace_root, loaded.options, seed)
        return loaded.cls(problem, ctx)

    def make_for(self, request: RolloutRequest) -> Environment:
        """The episode of one rollout, made with its sibling's seed (every attempt of a sibling gets the same)."""
        return self.make(request.problem, episode_seed(request.group_id, request.sibling))


def _log_warm_up(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s failed (%s); the first episode retries it", task.get_name(), task.exception())


def episode_seed(group_id: str, sibling: int) -> int:
    """A sibling's environment seed: a replay remakes its episode with it, so it must not change across restores."""
    return int.from_bytes(hashlib.sha256(f"{group_id}/{sibling}".encode()).digest()[:4], "big")
