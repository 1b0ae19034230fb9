"""Held-out evaluation beside training: the run's own environment servers and engines play the held-out prompts.

An evaluation is asked for after every `eval.every_steps` train steps, once before training
(`eval.before_training`), or by an operator (`turnkeep eval --run-dir`, the run workflow's `evaluate_now` signal).
Its episodes go to the environment servers as rollouts marked for evaluation (`envs/eval_agent.py`), at most
`eval.engine_share` of the engines' slots at once, so training's rollouts keep the rest and training never waits.
Each finished sample is journaled (`controller/state/eval_journal.py`) before it counts: an evaluation cut by a
crash goes on after the restart with the samples still to play, never scoring one twice, and writes its one line
(`"kind": "eval"`) to metrics.jsonl before the journal's `done`. Evaluations run one at a time, oldest first; one
asked while another waits replaces it (the replaced step is named in the line), so a slow evaluation never builds a
backlog.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from turnkeep.controller.pumps.env_client import EnvServerError
from turnkeep.controller.pumps.env_router import EnvRouter
from turnkeep.controller.state.eval_journal import EvalJournal, Evaluation, SampleScore
from turnkeep.primitives.atomic_files import read_jsonl
from turnkeep.primitives.chaos_points import reached
from turnkeep.primitives.holds import HoldSet
from turnkeep.primitives.pass_at_k import summarize
from turnkeep.schemas.choices import MetricsKind
from turnkeep.schemas.config_eval import EvalConfig
from turnkeep.schemas.rollout import Problem, RolloutRequest, RolloutResult

log = logging.getLogger("turnkeep.eval")

CHAOS_POINT = "evaluation"
"""`TURNKEEP_CHAOS_KILL_AT=evaluation`: the process waits to be killed once an evaluation has journaled samples,
holding the journal so the evaluation cannot finish first."""
CHAOS_AFTER_SAMPLES = 3


class EvalPump:
    def __init__(self, cfg: EvalConfig, problems: list[Problem], env: EnvRouter, journal: EvalJournal,
                 admission: HoldSet, concurrency: int, rollout_timeout_s: float,
                 write_line: Callable[[dict], None], run_dir) -> None:
        """`problems`: the held-out prompts (the first `eval.prompts_limit`); `write_line`: appends the result line
        to metrics.jsonl."""
        self._cfg = cfg
        self._problems = problems
        self._env = env
        self._journal = journal
        self._admission = admission
        self._gate = asyncio.Semaphore(concurrency)
        self._timeout_s = rollout_timeout_s
        self._write_line = write_line
        self._run_dir = run_dir
        self._journal_lock = asyncio.Lock()
        self._evaluations = journal.read()
        self._queue: list[Evaluation] = sorted((e for e in self._evaluations.values() if e.result is None),
                                               key=lambda e: e.step)
        for evaluation in self._queue:
            if evaluation.prompts > len(problems):
                log.warning("evaluation of step %d was asked for over %d prompts; %d are held out now: it goes on "
                            "over those", evaluation.step, evaluation.prompts, len(problems))
                evaluation.prompts = len(problems)
        self._replaced: dict[int, list[int]] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self.running: Evaluation | None = None

    def unfinished(self) -> list[int]:
        """Steps of the evaluations asked for and not finished (those an earlier incarnation left go on first)."""
        return [e.step for e in self._queue] + ([self.running.step] if self.running else [])

    def after_step(self, step: int) -> None:
        if self._cfg.every_steps and step % self._cfg.every_steps == 0:
            self.request(step, "every_steps")

    def before_training(self, step: int) -> None:
        if self._cfg.before_training and step == 0:
            self.request(0, "before_training")

    def request(self, step: int, trigger: str) -> str:
        """Queue an evaluation of the weights at `step`; what happened, in words."""
        if not self._problems:
            return "no held-out prompts: set eval.prompts, or use a tool_chat environment with reasoning_gym tasks"
        known = self._evaluations.get((step, trigger))
        if known is not None:
            state = "evaluated" if known.result is not None else "being evaluated"
            return f"step {step} is {state} already ({trigger})"
        evaluation = Evaluation(step, trigger, len(self._problems), self._cfg.samples)
        self._journal.asked(evaluation)
        self._evaluations[evaluation.key] = evaluation
        waiting = [e for e in self._queue if not e.scored]
        if waiting and trigger == "every_steps" and waiting[-1].trigger == "every_steps":
            replaced = waiting[-1]
            self._journal.replaced(replaced, step)
            self._queue.remove(replaced)
            del self._evaluations[replaced.key]
            self._replaced[step] = [*self._replaced.pop(replaced.step, []), replaced.step]
            log.warning("evaluation of step %d replaced by step %d's before it started (evaluations take longer "
                        "than eval.every_steps train steps)", replaced.step, step)
        self._queue.append(evaluation)
        self._idle.clear()
        self._wake.set()
        return f"evaluation of step {step} queued ({len(self._queue)} waiting)"

    async def run(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            self._idle.clear()
            self.running = self._queue.pop(0)
            try:
                await self._evaluate(self.running)
            except (OSError, ValueError) as err:
                # A journal that cannot be written (a full disk): this evaluation is lost, training and the next
                # evaluations go on.
                log.error("evaluation of step %d (%s) stopped: %s: %s", self.running.step, self.running.trigger,
                          type(err).__name__, err)
            finally:
                self.running = None

    async def finish(self) -> None:
        """Wait for the evaluations asked for so far (the run reached its last step)."""
        if self._queue or self.running is not None:
            log.info("waiting for the evaluations of steps %s before stopping", self.unfinished())
            await self._idle.wait()

    async def _evaluate(self, evaluation: Evaluation) -> None:
        started = time.monotonic()
        if evaluation.resumed:
            log.info("evaluation of step %d goes on: %d of %d samples were scored before the restart",
                     evaluation.step, evaluation.resumed, evaluation.prompts * evaluation.samples)
        plays = evaluation.to_play()
        await asyncio.gather(*(self._sample(evaluation, prompt, sample) for prompt, sample in plays))
        result = self._result(evaluation, time.monotonic() - started)
        # The line first (fsynced), then `done`: only an evaluation every sample of which was scored before a crash
        # can have its line written already (the crash came between the two), and only then is metrics.jsonl read.
        if plays or not self._line_written(evaluation):
            self._write_line(result)
        await self._journal.done(evaluation, result)
        evaluation.result, evaluation.scored = result, {}

    async def _sample(self, evaluation: Evaluation, prompt: int, sample: int) -> None:
        async with self._gate:
            score = await self._play(evaluation, prompt, sample)
        async with self._journal_lock:
            await self._journal.scored(evaluation, prompt, sample, score)
            evaluation.scored[(prompt, sample)] = score
            if len(evaluation.scored) - evaluation.resumed >= CHAOS_AFTER_SAMPLES:
                await reached(CHAOS_POINT, self._run_dir)

    async def _play(self, evaluation: Evaluation, prompt: int, sample: int) -> SampleScore:
        problem = self._problems[prompt]
        reasons = []
        for attempt in range(self._cfg.max_attempts):
            await self._admission.wait_clear()
            await self._env.wait_available(problem.env)
            group = f"eval-{evaluation.step}-{_id_safe(evaluation.trigger)}.{prompt}"
            request = RolloutRequest(rollout_id=f"{group}.{sample}.{attempt}", group_id=group, sibling=sample,
                                     attempt=attempt, problem=problem, evaluation_temperature=self._cfg.temperature)
            result = await self._attempt(request)
            if result.row is not None and not result.outcome.is_error():
                return SampleScore(result.row.reward, tuple(sorted(set(result.row.policy_versions()))))
            reasons.append(f"{result.outcome}: {result.reason}")
        log.warning("evaluation sample %s.%d.%d failed %d times: %s", evaluation.key, prompt, sample,
                    self._cfg.max_attempts, reasons[-1])
        return SampleScore(0.0, failed=reasons[-1])

    async def _attempt(self, request: RolloutRequest) -> RolloutResult:
        try:
            return await asyncio.wait_for(self._env.run(request), self._timeout_s)
        except asyncio.TimeoutError:
            await self._cancel(request.rollout_id)
            return _failed(request, "timed_out", f"ran longer than rollout_timeout_s={self._timeout_s}")
        except (aiohttp.ClientError, EnvServerError, ValueError) as err:
            return _failed(request, "failed", f"{type(err).__name__}: {err}")

    async def _cancel(self, rollout_id: str) -> None:
        try:
            await self._env.cancel(rollout_id)
        except (aiohttp.ClientError, EnvServerError) as err:
            log.warning("could not cancel %s on the environment server: %s", rollout_id, err)

    def _result(self, evaluation: Evaluation, seconds: float) -> dict:
        scores = evaluation.scored
        rewards = [[scores[(p, s)].reward for s in range(evaluation.samples)] for p in range(evaluation.prompts)]
        versions = [v for score in scores.values() for v in score.versions]
        return {
            "kind": MetricsKind.EVAL, "t": round(time.time(), 3), "step": evaluation.step,
            "trigger": evaluation.trigger, "prompts": evaluation.prompts, "samples": evaluation.samples,
            **summarize(rewards, evaluation.samples, self._cfg.correct_at),
            "samples_failed": sum(score.failed is not None for score in scores.values()),
            "samples_resumed": evaluation.resumed,
            "policy_version_min": min(versions, default=None), "policy_version_max": max(versions, default=None),
            "eval_s": round(seconds, 2), "replaced_steps": self._replaced.pop(evaluation.step, []),
        }

    def _line_written(self, evaluation: Evaluation) -> bool:
        path = self._run_dir / "metrics.jsonl"
        return path.exists() and any(line.get("kind") == MetricsKind.EVAL and (line.get("step"), line.get("trigger"))
                                     == evaluation.key for line in read_jsonl(path))


def _id_safe(trigger: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in trigger)[:32]


def _failed(request: RolloutRequest, outcome: str, reason: str) -> RolloutResult:
    return RolloutResult(rollout_id=request.rollout_id, outcome=outcome, reason=reason)
