"""The evaluations' journal, `<run_dir>/eval/evaluations.jsonl`: what was asked, every sample scored, every result.

Each line is fsynced before the evaluation counts it, so a restart knows exactly which samples of an unfinished
evaluation are scored (they are not played again) and which evaluations finished (their result line is in
metrics.jsonl: it is written before `done`). A crash can tear only the last line, which is
skipped: its sample is played again, once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from turnkeep.primitives.atomic_files import append_jsonl, read_jsonl

EVAL_DIR = "eval"
JOURNAL_FILE = "evaluations.jsonl"


@dataclass(frozen=True)
class SampleScore:
    reward: float
    versions: tuple[int, ...] = ()
    """Policy versions the sample's turns were generated with."""
    failed: str | None = None
    """Why every try of the sample failed (it scores 0)."""


@dataclass
class Evaluation:
    """One evaluation: the step it evaluates, how it was asked for, its size, and what is scored so far."""

    step: int
    trigger: str
    prompts: int
    samples: int
    scored: dict[tuple[int, int], SampleScore] = field(default_factory=dict)
    """By (prompt index, sample index)."""
    result: dict | None = None
    """The metrics line, once it finished."""
    resumed: int = 0
    """Samples an earlier incarnation scored."""

    @property
    def key(self) -> tuple[int, str]:
        """An evaluation is one per step and trigger: an operator's at a step the periodic one also evaluates is
        its own (the operator gets the line asked for); the same trigger at the same step again is the same one."""
        return self.step, self.trigger

    def to_play(self) -> list[tuple[int, int]]:
        return [(p, s) for p in range(self.prompts) for s in range(self.samples) if (p, s) not in self.scored]


class EvalJournal:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / EVAL_DIR / JOURNAL_FILE

    def read(self) -> dict[tuple[int, str], Evaluation]:
        """Every evaluation the journal holds, by (step, trigger)."""
        evaluations: dict[tuple[int, str], Evaluation] = {}
        if not self.path.exists():
            return evaluations
        for line in read_jsonl(self.path):
            key = (int(line["step"]), line["trigger"])
            if line["kind"] == "asked":
                evaluations.setdefault(key, Evaluation(*key, line["prompts"], line["samples"]))
            elif line["kind"] == "replaced":
                evaluations.pop(key, None)
            elif line["kind"] == "scored" and key in evaluations:
                evaluations[key].scored[(line["prompt"], line["sample"])] = SampleScore(
                    line["reward"], tuple(line.get("versions", ())), line.get("failed"))
            elif line["kind"] == "done" and key in evaluations:
                evaluations[key].result, evaluations[key].scored = line["result"], {}
        for evaluation in evaluations.values():
            evaluation.resumed = len(evaluation.scored)
        return evaluations

    def asked(self, evaluation: Evaluation) -> None:
        """On disk before the request is answered (an evaluation asked for and not started survives a crash): one
        fsync per request, from the event loop."""
        self._append_now({"kind": "asked", "step": evaluation.step, "trigger": evaluation.trigger,
                          "prompts": evaluation.prompts, "samples": evaluation.samples})

    def replaced(self, evaluation: Evaluation, by_step: int) -> None:
        """A periodic evaluation that had not started gave way to a newer one."""
        self._append_now({"kind": "replaced", "step": evaluation.step, "trigger": evaluation.trigger, "by": by_step})

    async def scored(self, evaluation: Evaluation, prompt: int, sample: int, score: SampleScore) -> None:
        line = {"kind": "scored", "step": evaluation.step, "trigger": evaluation.trigger, "prompt": prompt,
                "sample": sample, "reward": score.reward, "versions": list(score.versions)}
        if score.failed is not None:
            line["failed"] = score.failed
        await self._append(line)

    async def done(self, evaluation: Evaluation, result: dict) -> None:
        await self._append({"kind": "done", "step": evaluation.step, "trigger": evaluation.trigger, "result": result})

    async def _append(self, line: dict) -> None:
        await asyncio.to_thread(self._append_now, line)

    def _append_now(self, line: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_jsonl(self.path, line, durable=True)
