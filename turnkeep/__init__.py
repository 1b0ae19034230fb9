"""turnkeep: asynchronous GRPO for tool-using LLM agents whose in-flight rollouts survive crashes.

Installed, every folder of the repository is a subpackage of this one name (`turnkeep.envs`, `turnkeep.controller`,
...; see setup.py), so turnkeep claims no other top-level name. What an environment author needs is here:

    from turnkeep import EnvContext, Environment, Problem, StepResult

The names load on first use, so `import turnkeep.schemas...` (the workflows' sandbox, every process) stays as cheap
as the module it asks for.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from turnkeep._moved import install_moved_module_finder

if TYPE_CHECKING:
    from turnkeep.envs.environment import EnvContext, Environment, NoOptions, StepResult
    from turnkeep.envs.tool_calls import ToolCall, ToolCallError, format_tool_call, format_tool_result, parse_tool_calls
    from turnkeep.schemas.rollout import Problem

PUBLIC = {
    "Environment": "turnkeep.envs.environment",
    "EnvContext": "turnkeep.envs.environment",
    "StepResult": "turnkeep.envs.environment",
    "NoOptions": "turnkeep.envs.environment",
    "Problem": "turnkeep.schemas.rollout",
    "ToolCall": "turnkeep.envs.tool_calls",
    "ToolCallError": "turnkeep.envs.tool_calls",
    "parse_tool_calls": "turnkeep.envs.tool_calls",
    "format_tool_call": "turnkeep.envs.tool_calls",
    "format_tool_result": "turnkeep.envs.tool_calls",
}
"""The environment author's API: each name and the module that defines it (the same names as `__all__`)."""

__all__ = ["EnvContext", "Environment", "NoOptions", "Problem", "StepResult", "ToolCall", "ToolCallError",
           "format_tool_call", "format_tool_result", "parse_tool_calls"]


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'turnkeep' has no attribute {name!r} (its public names: {', '.join(__all__)})")
    value = getattr(importlib.import_module(PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


install_moved_module_finder()

# os.path, not pathlib: the workflows' sandbox imports this package again and refuses Path.resolve at import.
_here = os.path.dirname(os.path.abspath(__file__))
_checkout = os.path.dirname(_here)
if not os.path.isdir(os.path.join(_here, "schemas")) and os.path.isfile(os.path.join(_checkout, "setup.py")):
    # A source checkout run without an install (a copy of the tree on a GPU machine, `PYTHONPATH=.`): the folders
    # sit beside this one. Installed (a wheel, or editable), setup.py's mapping finds them instead.
    __path__.append(_checkout)
