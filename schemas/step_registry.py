"""Every step of the workflows, with the modules that declare them imported, so none is missing."""

from __future__ import annotations

import turnkeep.schemas.attempt_steps  # noqa: F401 - declares the attempt's and the run workflow's steps
import turnkeep.schemas.engine_steps  # noqa: F401 - declares the engines' scaling step
import turnkeep.schemas.eval_steps  # noqa: F401 - declares the evaluation request step
import turnkeep.schemas.recovery  # noqa: F401 - declares the recovery workflow's steps
from turnkeep.schemas.steps import STEPS, Step


def declared_steps() -> dict[str, Step]:
    return dict(STEPS)
