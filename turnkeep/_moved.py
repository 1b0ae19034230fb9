"""Imports by the names turnkeep's folders had before they moved under `turnkeep` fail with the new name.

`import envs.environment` (an environment written for an older turnkeep) would otherwise fail as a missing module
with nothing to say where it went. The finder sits last on `sys.meta_path`: it answers only for a name that nothing
else found, so a package of the user's own called `envs` or `cli` imports as it always did.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder

MOVED = frozenset({"activities", "bench", "chaos", "cli", "controller", "envs", "gpu_workers", "participants",
                   "primitives", "schemas", "workers", "workflows"})
"""The top-level names turnkeep's folders were installed under before they moved under `turnkeep`."""


def moved_module_message(name: str) -> str | None:
    """The one-line error for an import of `name` by its old top-level path, or None when it never was turnkeep's."""
    if name.split(".")[0] not in MOVED:
        return None
    top = name.split(".")[0]
    return (f"No module named {name!r}: turnkeep's modules moved under the one name `turnkeep`: import "
            f"`turnkeep.{top}...` for `{top}...` (an environment's names: `from turnkeep import Environment, "
            f"EnvContext, Problem, StepResult`)")


class MovedModuleFinder(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if "." in fullname or (message := moved_module_message(fullname)) is None:
            return None
        raise ModuleNotFoundError(message, name=fullname)


def install_moved_module_finder() -> None:
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
