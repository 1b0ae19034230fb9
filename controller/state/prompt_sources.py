"""Where the dataloader's prompts come from: any object with these few members.

A prompts file (`controller.state.prompt_files.PromptFile`) is one; the default task's
problem generator (`envs.calc_task.CalcProblems`) is another, handed in by the worker that
builds the run, so the controller never names a task. A record must be a pure function of
the source and the position: restoring the dataloader's position then resumes exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from turnkeep.schemas.rollout import PromptRecord


class PromptSource(Protocol):
    path: Path | None
    """The file it reads (None: generated); named in the dataloader's state and in its errors."""
    digest: str | None
    """sha256 of its records (None: generated); a restore over other records is refused."""

    @property
    def size(self) -> int | None:
        """Records in one pass (None: endless; a finite source is read in epochs, shuffled by seed)."""

    def record(self, position: int) -> PromptRecord:
        """Record `position` (below `size` when finite)."""
