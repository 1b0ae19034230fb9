"""The step behind the run workflow's `evaluate_now` signal: the controller queues a held-out evaluation of the
weights at its current train step (`controller/pumps/eval_pump.py`)."""

from __future__ import annotations

from turnkeep.schemas.steps import Runs, Step
from turnkeep.schemas.wire import Wire


class EvaluateNowSignal(Wire):
    reason: str = "operator"
    """Who asked, in words (it is the evaluation's `trigger` in metrics.jsonl)."""


class EvalRequestInput(Wire):
    run_id: str
    incarnation: int
    """Controller incarnation; a stale one is refused."""
    reason: str


class EvalRequestResult(Wire):
    step: int
    """The train step whose weights are evaluated."""
    note: str
    """What happened: queued, or why not."""


EVAL_REQUEST = Step("eval.request", EvalRequestInput, EvalRequestResult, Runs.LOCAL)
