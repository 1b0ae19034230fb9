"""The calc task with a stateful tool whose state lives in files on disk.

Replaying the policy turns cannot rebuild such an environment in general (a real tool's
files depend on more than the turns), so it exercises the `exported` recovery path: a
snapshot carries the files themselves, and the reward reads them back from disk, so a
restore that loses the files is caught by a reward of 0 rather than passing silently.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from turnkeep.envs.calc_env import CalcEnvironment
from turnkeep.envs.calc_task import CalcCall, apply_op, expected_calls, run_tool, score
from turnkeep.envs.environment import EnvContext
from turnkeep.schemas.rollout import Problem

TAPE = "tape"
"""The file the calculator appends each result to, one per line."""


class WorkspaceEnvironment(CalcEnvironment):
    """Calc, but each computed result is also appended to a `tape` file in a private folder."""

    kind = "workspace"
    recovery_mode = "exported"

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        super().__init__(problem, ctx)
        self._workspace_root = ctx.workspace_root
        self._dir: Path | None = None
        """Created on first use, so episodes that never call the tool leave nothing on disk."""

    async def _call_tool(self, call: CalcCall) -> str:
        with open(self._workspace() / TAPE, "a", encoding="utf-8") as tape:
            tape.write(f"{apply_op(call.a, call.op, call.b)}\n")
            tape.flush()
        return run_tool(call)

    def reward(self) -> float:
        if score(self._problem, self._turns) != 1.0:
            return 0.0
        expected = [str(apply_op(c.a, c.op, c.b)) for c in expected_calls(self._problem)]
        return float(self._read_tape() == expected)

    def export_state(self) -> dict[str, Any]:
        return {"turns": list(self._turns), "files": self._read_files()}

    def restore_state(self, state: dict[str, Any]) -> None:
        if self._turns or self._dir is not None:
            raise RuntimeError("restore_state needs a fresh workspace environment")
        turns, files = _validated(state)
        self._turns = turns
        if files:
            folder = self._workspace()
            for name, content in files.items():
                (folder / name).write_text(content, encoding="utf-8")

    async def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    @property
    def workspace(self) -> Path | None:
        """The episode's folder (None until the tool first writes, and after close)."""
        return self._dir

    def _workspace(self) -> Path:
        if self._dir is None:
            if self._workspace_root is not None:
                Path(self._workspace_root).mkdir(parents=True, exist_ok=True)
            self._dir = Path(tempfile.mkdtemp(prefix="ws-", dir=self._workspace_root))
        return self._dir

    def _read_tape(self) -> list[str]:
        if self._dir is None or not (self._dir / TAPE).is_file():
            return []
        return (self._dir / TAPE).read_text(encoding="utf-8").splitlines()

    def _read_files(self) -> dict[str, str]:
        if self._dir is None:
            return {}
        files: dict[str, str] = {}
        for entry in sorted(self._dir.iterdir()):
            # Only plain files round-trip through JSON; anything else would be lost silently.
            if entry.is_symlink() or not entry.is_file():
                raise RuntimeError(f"workspace holds {entry.name!r}, which is not a plain file")
            files[entry.name] = entry.read_text(encoding="utf-8")
        return files


def _validated(state: Any) -> tuple[list[str], dict[str, str]]:
    """The state's turns and files, or ValueError naming the first thing wrong with it.

    Strict because the state comes back from a snapshot on disk: a file name must not
    be able to write outside the episode's folder.
    """
    if not isinstance(state, dict):
        raise ValueError(f"workspace state must be a dict, got {type(state).__name__}")
    for key in ("turns", "files"):
        if key not in state:
            raise ValueError(f"workspace state is missing {key!r}")
    if extra := sorted(set(state) - {"turns", "files"}):
        raise ValueError(f"workspace state has unknown keys {extra}")
    turns, files = state["turns"], state["files"]
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise ValueError("workspace state 'turns' must be a list of strings")
    if not isinstance(files, dict):
        raise ValueError(f"workspace state 'files' must be a dict, got {type(files).__name__}")
    for name, content in files.items():
        if not isinstance(name, str) or not name or name in (".", "..") or any(c in name for c in "/\\\0"):
            raise ValueError(f"workspace state has a bad file name {name!r} (a plain name is required)")
        if not isinstance(content, str):
            kind = type(content).__name__
            raise ValueError(f"workspace state file {name!r} must have string contents, got {kind}")
    return list(turns), dict(files)
