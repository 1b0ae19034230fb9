"""The run workflow: one per training run; it starts snapshot attempts as child workflows.

Attempts start every `attempt_interval_s` (when set), right after each trainer checkpoint, and when
an operator (or the preemption handler) signals `snapshot_now`. It finishes any release
left pending by an earlier attempt before it starts another, counts consecutive
failures, and stops the run on `max_consecutive_failures` or on a broken invariant. It
answers `status` and takes `pause_snapshots` / `resume_snapshots`, the `set_engines` update (the policy
engines the next attempts fence) and `evaluate_now` (a held-out evaluation), and continues as new before its
history grows large.
"""

from __future__ import annotations

from collections import deque
from datetime import timedelta
from typing import NamedTuple

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, is_cancelled_exception
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from turnkeep.schemas import search_attributes as sa
    from turnkeep.schemas.attempt_steps import (
        ANCHOR,
        GYM_RESUME,
        POLICY_RESUME,
        RECORD,
        REQUEST_CHECKPOINT,
        TRAINER_RELEASE,
        AnchorQuery,
        AttemptRecord,
        CheckpointRequest,
        GymInput,
        TrainerReleaseInput,
    )
    from turnkeep.schemas.choices import Outcome, Trigger
    from turnkeep.schemas.engine_steps import ENGINES_SCALE, ScaleEnginesInput
    from turnkeep.schemas.eval_steps import EVAL_REQUEST, EvalRequestInput, EvaluateNowSignal
    from turnkeep.schemas.names import (
        ATTEMPT_CANCELLED_SIGNAL,
        WorkflowType,
        checkpoint_holder,
        checkpoint_id,
    )
    from turnkeep.schemas.snapshot import (
        RunCarryOver,
        RunStatus,
        RunWorkflowInput,
        RunWorkflowResult,
        SetEnginesInput,
        SetEnginesResult,
        SnapshotAttemptInput,
        SnapshotAttemptResult,
        SnapshotNowSignal,
        TrainerCheckpointSignal,
    )
    from turnkeep.schemas.steps import Step

from turnkeep.workflows.engine_fanout import fan_out
from turnkeep.workflows.engine_requests import engines_problem
from turnkeep.workflows.retry_policies import RUN_QUICK, RUN_UNTIL_IT_WORKS, WORKFLOW_TASK_TIMEOUT
from turnkeep.workflows.snapshot_attempt import SnapshotAttemptWorkflow

ATTEMPTS_BEFORE_CONTINUE_AS_NEW = 200
LOCAL_CONTROLLER_CALLS = "run-controller-calls-local"
"""Patch id: the run's calls to the controller are local activities (histories from before it schedule them)."""
ONE_ATTEMPT_PER_STEP = "run-anchored-attempt-takes-the-queued-step"
"""Patch id: an attempt anchored at a step a queued trainer-checkpoint trigger names serves that trigger too."""
URGENCY = [Trigger.PERIODIC, Trigger.TRAINER_CHECKPOINT, Trigger.OPERATOR, Trigger.PREEMPTION]


class PendingTrigger(NamedTuple):
    trigger: Trigger
    step: int | None
    """The trainer checkpoint the attempt is tied to; None: anchor at the newest one (or ask for one)."""
    note: str
    held: bool = True
    """Whether the train pump holds the trainer at `step` until the attempt takes over."""


async def _controller_call(step: Step, arg):
    """A short call to the controller (anchor, checkpoint request, record): a local activity on the workflow's own
    worker, or an ordinary one in histories recorded before that."""
    options = dict(result_type=step.result, start_to_close_timeout=timedelta(seconds=30), retry_policy=RUN_QUICK)
    if workflow.patched(LOCAL_CONTROLLER_CALLS):
        return await workflow.execute_local_activity(step, arg, summary=str(step), **options)
    return await workflow.execute_activity(step, arg, **options)


def _more_urgent(a: Trigger, b: Trigger | None) -> Trigger:
    return a if b is None or URGENCY.index(a) >= URGENCY.index(b) else b


SCALE_TIMEOUT_S = 900.0
"""Starting engines takes a vLLM start each (in parallel) and their refit; retiring ones a drain."""


@workflow.defn(name=WorkflowType.RUN)
class RunWorkflow:
    @workflow.init
    def __init__(self, inp: RunWorkflowInput) -> None:
        # State comes from the input here, not in run(): a signal that arrives with the
        # start runs before run() and must not be overwritten by it.
        self._triggers: deque[PendingTrigger] = deque()
        self._requested: Trigger | None = None
        """The trigger of an attempt that asked for a trainer checkpoint and waits for it."""
        self._stop_reason: str | None = None
        self._state = inp.carried or RunCarryOver()
        self._running: str | None = None
        self._last: SnapshotAttemptResult | None = None
        self._finished = 0
        """Attempts finished in this run of the workflow (waiters of `snapshot_and_wait` count on it)."""
        self._last_by_trigger: dict[Trigger, tuple[int, SnapshotAttemptResult]] = {}
        self._run_id = inp.run_id
        self._incarnation = inp.incarnation
        self._scaling = False
        """An operator's `set_engines` is being carried out: no attempt starts meanwhile."""
        self._cancelled: dict[str, SnapshotAttemptResult] = {}
        """Results handed over by attempts that were cancelled (a Canceled workflow returns none)."""
        self._engines: list[int] | None = inp.engines
        """The policy engines the next attempt fences (None: the one policy server of a run from before engines)."""

    @workflow.signal
    def trainer_checkpoint_saved(self, signal: TrainerCheckpointSignal) -> None:
        # The first checkpoint after a request serves it, under the request's trigger.
        trigger = _more_urgent(signal.trigger, self._requested)
        served_request, self._requested = self._requested is not None, None
        queued = self._queued_at(signal.step)
        if queued is not None:
            # Announced twice (a request raced a save_period checkpoint of the same step): one attempt serves both.
            if _more_urgent(trigger, queued.trigger) is not queued.trigger:
                self._triggers.remove(queued)
                self._triggers.appendleft(queued._replace(trigger=trigger))
            return
        if signal.repeat and not served_request:
            return  # its attempt already ran or runs now
        self._triggers.append(PendingTrigger(trigger, signal.step, f"tied to trainer checkpoint step_{signal.step}",
                                             held=not signal.repeat))

    @workflow.signal
    def snapshot_now(self, signal: SnapshotNowSignal | None = None) -> None:
        signal = signal or SnapshotNowSignal()
        trigger = Trigger.PREEMPTION if signal.preemption else Trigger.OPERATOR
        self._triggers.appendleft(PendingTrigger(trigger, None, signal.reason))

    @workflow.signal
    async def evaluate_now(self, signal: EvaluateNowSignal | None = None) -> None:
        """A held-out evaluation of the weights at the controller's current step (`turnkeep eval --run-dir`)."""
        reason = (signal or EvaluateNowSignal()).reason
        try:
            asked = await _controller_call(EVAL_REQUEST, EvalRequestInput(run_id=self._run_id,
                                                                          incarnation=self._incarnation, reason=reason))
            workflow.logger.info("evaluation (%s) at step %d: %s", reason, asked.step, asked.note)
        except ActivityError as err:  # a signal that failed must not fail the run workflow
            workflow.logger.warning("evaluation (%s) could not be asked for: %s", reason, err.cause or err)

    @workflow.update
    async def snapshot_and_wait(self, signal: SnapshotNowSignal) -> SnapshotAttemptResult:
        """Take a snapshot now and answer with its outcome (the preemption handler's final save).

        An attempt the trainer outran before its hold is skipped; it is asked for again
        under the new step, so the answer is what the run actually saved, or why not.
        """
        trigger = Trigger.PREEMPTION if signal.preemption else Trigger.OPERATOR
        while True:
            asked_at = self._finished
            self._triggers.appendleft(PendingTrigger(trigger, None, signal.reason))
            await workflow.wait_condition(
                lambda: self._last_by_trigger.get(trigger, (-1, None))[0] >= asked_at or self._stop_reason is not None
            )
            if self._stop_reason is not None:
                raise ApplicationError(f"the run workflow stopped before the snapshot: {self._stop_reason}")
            result = self._last_by_trigger[trigger][1]
            if result.outcome is not Outcome.SKIPPED:
                return result
            workflow.logger.info("%s snapshot skipped (%s); asking again", trigger, result.reason)

    @workflow.update
    async def set_engines(self, inp: SetEnginesInput) -> SetEnginesResult:
        """An operator's new set of policy engines (`turnkeep scale`): between attempts, so no parked attempt fences
        a set that changes under it, the controller starts the new engines (refitted before they take turns) and
        retires the removed ones; the attempts started from then on fence the new set."""
        await workflow.wait_condition(lambda: self._running is None and not self._scaling)
        previous, self._scaling = self._engines or [], True
        try:
            scaled = await workflow.execute_activity(
                ENGINES_SCALE, ScaleEnginesInput(run_id=self._run_id, incarnation=self._incarnation,
                                                 engines=list(inp.engines)),
                result_type=ENGINES_SCALE.result, start_to_close_timeout=timedelta(seconds=SCALE_TIMEOUT_S),
                heartbeat_timeout=timedelta(seconds=30), retry_policy=RUN_QUICK, summary=str(ENGINES_SCALE))
        finally:
            self._scaling = False
        self._engines = list(scaled.engines)
        return SetEnginesResult(engines=list(self._engines), previous=previous, started=scaled.started,
                                retired=scaled.retired, seconds=scaled.seconds)

    @set_engines.validator
    def _refuse_bad_engines(self, inp: SetEnginesInput) -> None:
        # Refused before it enters history: a bad list never reaches an attempt.
        problem = engines_problem(inp.engines)
        if problem is not None:
            raise ValueError(problem)

    @workflow.signal(name=ATTEMPT_CANCELLED_SIGNAL)
    def attempt_cancelled(self, result: SnapshotAttemptResult) -> None:
        self._cancelled[result.checkpoint_id] = result

    @workflow.signal
    def pause_snapshots(self) -> None:
        self._state.paused = True

    @workflow.signal
    def resume_snapshots(self) -> None:
        self._state.paused = False

    @workflow.signal
    def stop(self, reason: str) -> None:
        self._stop_reason = reason

    @workflow.query
    def status(self) -> RunStatus:
        return RunStatus(
            run_id=self._run_id, paused=self._state.paused, consecutive_failures=self._state.consecutive_failures,
            attempts_by_outcome=dict(self._state.counts), running_attempt=self._running, last_result=self._last,
            release_pending=self._state.release_pending,
        )

    @workflow.run
    async def run(self, inp: RunWorkflowInput) -> RunWorkflowResult:
        started_attempts = 0
        while self._stop_reason is None:
            await self._finish_pending_release(inp)
            trigger = await self._next_trigger(inp)
            if trigger is None:
                continue
            result = await self._attempt(inp, trigger)
            if result is None:
                continue
            started_attempts += 1
            stop = self._account(inp, result)
            await _controller_call(
                RECORD, AttemptRecord(result=result, consecutive_failures=self._state.consecutive_failures))
            if stop:
                return RunWorkflowResult(stopped_reason=stop, attempts_by_outcome=dict(self._state.counts))
            if (started_attempts >= ATTEMPTS_BEFORE_CONTINUE_AS_NEW and not self._triggers
                    and workflow.all_handlers_finished()):
                workflow.continue_as_new(inp.model_copy(update={"carried": self._state, "engines": self._engines}))
        await self._finish_pending_release(inp)  # never leave admission closed behind
        return RunWorkflowResult(stopped_reason=self._stop_reason, attempts_by_outcome=dict(self._state.counts))

    async def _next_trigger(self, inp: RunWorkflowInput) -> PendingTrigger | None:
        def ready() -> bool:
            return bool(self._triggers) or self._stop_reason is not None

        try:
            if inp.attempt_interval_s is None:
                await workflow.wait_condition(ready)
            else:
                await workflow.wait_condition(ready, timeout=timedelta(seconds=inp.attempt_interval_s),
                                              timeout_summary="next periodic snapshot")
        except TimeoutError:
            return None if self._state.paused else PendingTrigger(Trigger.PERIODIC, None, "periodic")
        if self._stop_reason is not None:
            return None
        pending = self._triggers.popleft()
        if pending.step is not None and self._requested is not None:
            # A checkpoint announced just before the request arrived serves the request.
            pending, self._requested = pending._replace(trigger=_more_urgent(pending.trigger, self._requested)), None
        if self._state.paused and pending.trigger in (Trigger.PERIODIC, Trigger.TRAINER_CHECKPOINT):
            if pending.step is not None and pending.held:
                # Nobody will take over the train pump's checkpoint hold: release it now.
                await workflow.execute_activity(
                    TRAINER_RELEASE, TrainerReleaseInput(holders=[checkpoint_holder(pending.step)]),
                    result_type=TRAINER_RELEASE.result, task_queue=TRAINER_RELEASE.task_queue(inp.run_id),
                    start_to_close_timeout=timedelta(seconds=30), retry_policy=RUN_QUICK,
                )
            return None
        return pending

    def _take_queued(self, step: int) -> PendingTrigger | None:
        """Take the trigger queued for checkpoint `step` into the attempt anchored there (its hold and, when more
        urgent, its trigger, so whoever waits on that trigger's result gets this attempt's).

        A save_period checkpoint announced while an operator's or a preemption's attempt waited for its anchor
        would otherwise run a second attempt under the same step right after (in a preemption's grace period)."""
        queued = self._queued_at(step)
        if queued is None or not workflow.patched(ONE_ATTEMPT_PER_STEP):
            return None
        self._triggers.remove(queued)
        return queued

    def _queued_at(self, step: int) -> PendingTrigger | None:
        """The trigger queued for trainer checkpoint `step` (one at most: a second announcement merges into it)."""
        return next((t for t in self._triggers if t.step == step), None)

    async def _attempt(self, inp: RunWorkflowInput, pending: PendingTrigger):
        """Run one attempt; None when it waits for a trainer checkpoint it asked for (that one starts it)."""
        await workflow.wait_condition(lambda: not self._scaling)  # it fences the engines the scaling leaves
        trigger, step, note = pending.trigger, pending.step, pending.note
        held = step is not None and pending.held
        if step is None:
            anchor = await _controller_call(ANCHOR, AnchorQuery(incarnation=inp.incarnation))
            if inp.checkpoint_on_demand and anchor.newest_checkpoint_step != anchor.current_step:
                self._requested = _more_urgent(trigger, self._requested)
                await _controller_call(REQUEST_CHECKPOINT,
                                       CheckpointRequest(incarnation=inp.incarnation, trigger=trigger))
                return None
            step = anchor.newest_checkpoint_step if anchor.newest_checkpoint_step is not None else 0
            queued = self._take_queued(step)
            if queued is not None:
                held, trigger = queued.held, _more_urgent(trigger, queued.trigger)
        number = self._state.numbers.get(str(step), 1)
        self._state.numbers[str(step)] = number + 1
        attempt_id = checkpoint_id(inp.run_id, step, number)
        self._running = attempt_id
        attempt = SnapshotAttemptInput(
            run_id=inp.run_id, checkpoint_id=attempt_id, number=number, trigger=trigger, anchor_step=step,
            incarnation=inp.incarnation, trainer_hold=inp.trainer_hold, keep_latest_k=inp.keep_latest_k,
            checkpoint_hold=checkpoint_holder(step) if held and inp.trainer_hold else None, timeouts=inp.timeouts,
            agents=inp.agents, engines=self._engines,
        )
        try:
            return await workflow.execute_child_workflow(
                SnapshotAttemptWorkflow.run, attempt, id=attempt_id, task_timeout=WORKFLOW_TASK_TIMEOUT,
                # A cancelled run still compensates its attempt; TERMINATE would skip compensation.
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                static_summary=f"{trigger} snapshot under step {step} (#{number}): {note}",
                search_attributes=TypedSearchAttributes([
                    SearchAttributePair(sa.RUN_ID, inp.run_id), SearchAttributePair(sa.ANCHOR_STEP, step),
                    SearchAttributePair(sa.TRIGGER, str(trigger)), SearchAttributePair(sa.OUTCOME, "running"),
                ]),
            )
        except ChildWorkflowError as err:
            if not is_cancelled_exception(err):
                raise
            # Cancelled from the CLI or the UI: it compensated, handed its result over and ended as Canceled.
            return await self._cancelled_result(attempt_id, step, trigger)
        finally:
            self._running = None

    async def _cancelled_result(self, attempt_id: str, step: int, trigger: Trigger) -> SnapshotAttemptResult:
        try:
            await workflow.wait_condition(lambda: attempt_id in self._cancelled, timeout=timedelta(seconds=10),
                                          timeout_summary="result of a cancelled attempt")
            return self._cancelled.pop(attempt_id)
        except TimeoutError:
            return SnapshotAttemptResult(
                checkpoint_id=attempt_id, outcome=Outcome.ABORTED, anchor_step=step, trigger=trigger,
                reason="cancelled (temporal workflow cancel) before it could report; the previous snapshot stays the "
                       "restore point",
            )

    def _account(self, inp: RunWorkflowInput, result: SnapshotAttemptResult) -> str | None:
        """Update the counters; return why the run must stop, if it must."""
        self._last = result
        self._last_by_trigger[result.trigger] = (self._finished, result)
        self._finished += 1
        self._state.counts[str(result.outcome)] = self._state.counts.get(str(result.outcome), 0) + 1
        if result.outcome is Outcome.PUBLISHED_RELEASE_PENDING:
            self._state.release_pending = result.checkpoint_id
        if result.outcome in (Outcome.PUBLISHED, Outcome.PUBLISHED_RELEASE_PENDING):
            self._state.consecutive_failures = 0
            self._state.last_published = result.checkpoint_id
        elif result.outcome.counts_as_failure():
            self._state.consecutive_failures += 1
        if result.invariant_broken:
            return f"snapshot attempt {result.checkpoint_id} broke an invariant: {result.reason}"
        if self._state.consecutive_failures >= inp.max_consecutive_failures:
            return (
                f"{self._state.consecutive_failures} snapshot attempts failed in a row "
                f"(snapshot.max_consecutive_failures = {inp.max_consecutive_failures}); last: {result.reason}"
            )
        return None

    async def _finish_pending_release(self, inp: RunWorkflowInput) -> None:
        pending = self._state.release_pending
        if pending is None:
            return
        participant_input = GymInput(run_id=inp.run_id, checkpoint_id=pending, incarnation=inp.incarnation,
                                     lease_s=inp.timeouts.lease_s)

        def release(step: Step, engine: int | None = None):
            return workflow.execute_activity(
                step, participant_input, result_type=step.result, task_queue=step.task_queue(inp.run_id, engine),
                start_to_close_timeout=timedelta(seconds=inp.timeouts.phase_s), retry_policy=RUN_UNTIL_IT_WORKS,
                summary=f"finish the release of {pending}",
            )

        # The engines of now, not of the attempt: one gone since has no worker to answer (retried forever), and
        # resuming one added since, never fenced, does nothing.
        await fan_out({}, "resume", self._engines, lambda _clock, engine: release(POLICY_RESUME, engine))
        released = await release(GYM_RESUME)
        workflow.logger.info("pending release of %s finished after %.1fs closed", pending,
                             released.admission_closed_s)
        self._state.release_pending = None
