"""What the `verifiers` adapter takes from an installed verifiers (v1) environment, and what it refuses.

A verifiers environment is a taskset package found by its id (`vf-vault` imports `vf_vault`, whose `__all__`
exports one `Taskset` subclass; verifiers' own `taskset_class` resolves it): its config (`env_args`), its tasks
(the prompts), each task's toolsets (MCP tool servers, here served in-process) and its `@vf.reward` / `@vf.metric`
functions (the rubric). What needs more than that cannot run under turnkeep's engine and is refused at start-up:
a package that brings its own Env (`run()` plays its agents: a user simulator, a game engine) or its own Harness
(an outside agent such as claude_code or codex), a task that needs a container or a runtime (setup, finalize or a
scoring function taking `runtime`), a judge model, a toolset served at a URL or in another runtime.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.envs.single_agent import SingleAgentEnv
from verifiers.v1.runtimes import SubprocessConfig
from verifiers.v1.state import state_cls
from verifiers.v1.utils.loaders import (
    default_harness_id,
    environment_class,
    taskset_class,
    taskset_config_type,
)

FIX = "pick a verifiers environment whose tasks score from the conversation and in-process tools"


@dataclass(frozen=True)
class LoadedTaskset:
    taskset: vf.Taskset
    task_cls: type[vf.Task]
    state_cls: type[vf.State]


@cache
def load(env_id: str, args_json: str) -> LoadedTaskset:
    """The environment's taskset built from its config (one per process: tasksets are values); ValueError names
    what cannot be mapped."""
    try:
        cls = taskset_class(env_id)
        config = taskset_config_type(env_id).model_validate({**json.loads(args_json), "id": env_id})
    except (ImportError, AttributeError, TypeError, ValueError) as err:
        first = " ".join(str(err).split())[:300] or type(err).__name__
        raise ValueError(f"verifiers environment {env_id!r} does not load ({first}); install its package "
                         f"(pip install {env_id}) and check env_args") from None
    taskset = cls(config)
    task_cls = cls.task_type()
    _refuse_unmappable(env_id, taskset, task_cls)
    return LoadedTaskset(taskset, task_cls, state_cls(task_cls))


def _refuse_unmappable(env_id: str, taskset: vf.Taskset, task_cls: type[vf.Task]) -> None:
    env_cls = environment_class(env_id)
    if env_cls is not SingleAgentEnv:
        raise ValueError(f"verifiers environment {env_id!r} brings its own Env ({env_cls.__name__}.run drives its "
                         f"agents: a user simulator or a game), which turnkeep's turns cannot play; {FIX}")
    if default_harness_id(env_id) == env_id:
        raise ValueError(f"verifiers environment {env_id!r} brings its own Harness (an outside agent program), "
                         f"which turnkeep's engine replaces; {FIX}")
    if task_cls.NEEDS_CONTAINER:
        raise ValueError(f"verifiers environment {env_id!r}: {task_cls.__name__} needs a container (a sandbox "
                         f"turnkeep does not start); {FIX}")
    for hook in ("setup", "finalize", "stage_verifier"):
        if getattr(task_cls, hook) is not getattr(vf.Task, hook):
            raise ValueError(f"verifiers environment {env_id!r}: {task_cls.__name__}.{hook} works in a runtime "
                             f"(a sandbox turnkeep does not start); {FIX}")
    task_config = taskset.config.task
    if task_config.judges:
        raise ValueError(f"verifiers environment {env_id!r} scores with a judge model "
                         f"({', '.join(j.id for j in task_config.judges)}), an outside service; {FIX}")
    probe = task_cls(task_cls.data_type().model_construct(), task_config)
    for kind in ("reward", "metric", "stop"):
        for fn in probe.hooks(kind):
            if "runtime" in inspect.signature(fn).parameters:
                raise ValueError(f"verifiers environment {env_id!r}: the {kind} {fn.__name__} reads a runtime "
                                 f"(a sandbox turnkeep does not start); {FIX}")
    for toolset in [*task_cls.toolsets(task_config), *type(taskset).toolsets(taskset.config)]:
        config: Any = toolset.config
        if getattr(config, "url", None) or not isinstance(getattr(config, "runtime", SubprocessConfig()),
                                                          SubprocessConfig):
            raise ValueError(f"verifiers environment {env_id!r}: toolset {type(toolset).__name__} runs at a URL or "
                             f"in a remote runtime, an outside service; {FIX}")


def task_of(loaded: LoadedTaskset, row: dict[str, Any]) -> vf.Task:
    """A task rebuilt from its wire data (a prompt record's metadata)."""
    data = loaded.task_cls.data_type().model_validate(row)
    return loaded.task_cls(data, loaded.taskset.config.task)
