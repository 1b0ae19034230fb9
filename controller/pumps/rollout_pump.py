"""Rollout pump: dataloader -> prompt group -> admission gate -> one /run per sibling.

A sibling's row is written to the data plane under the barrier and only then is its
receipt ACKed (after the barrier opens), so a finished result is always either stored
here or still held by the environment server. Failed or timed-out attempts are retried up to
`rollout.max_attempts`, then the sibling is dropped with its reason; where the
environment's recovery level asks for it (`group_reruns`), a failure reruns the whole
group instead, and a group-scored group is judged before the trainer sees it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import aiohttp

from turnkeep.controller.pumps.env_client import EnvClient, EnvServerError
from turnkeep.controller.pumps.group_reruns import GroupReruns
from turnkeep.controller.rollout_levels import RolloutLevelPlan
from turnkeep.controller.state.data_plane import DataPlane
from turnkeep.controller.state.dataloader import PromptDataloader
from turnkeep.controller.state.group_ledger import GroupLedger
from turnkeep.controller.state.run_stats import RunStats
from turnkeep.primitives.audit_log import AuditLog, segments_digest
from turnkeep.primitives.deadlines import DeadlineExpired, DeadlineRegistry
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.audit import DeadlineExpired as DeadlineExpiredEvent
from turnkeep.schemas.audit import GroupAdmitted, SiblingFailed, SiblingSealed, SiblingStarted
from turnkeep.schemas.config import RolloutConfig
from turnkeep.schemas.rollout import RolloutOutcome, RolloutRequest, RolloutResult

log = logging.getLogger("turnkeep.rollout")


class _After(Enum):
    """What a sibling's task does after a failed attempt."""

    RETRY = "retry"
    """Start another attempt."""
    SETTLE = "settle"
    """Stop trying; settle the group if this was its last sibling."""
    STOP = "stop"
    """Stop here: the group's next round (started by this or another sibling) settles it."""


@dataclass(frozen=True)
class Continuation:
    """A saved agent that a restored sibling continues (attempt N continues as N+1)."""

    rollout_id: str
    """The saved attempt."""
    turn_index: int
    """Turns completed at the saved boundary."""
    segments: int
    """Segments in the saved boundary (the prefix the finished row must keep)."""
    boundary_sha: str
    partial_tokens: int = 0
    """Tokens of the next turn the journal kept before a crash cut it (the `token` level): generated once."""


class RolloutPump:
    def __init__(
        self,
        cfg: RolloutConfig,
        inflight_limit: int,
        dataloader: PromptDataloader,
        ledger: GroupLedger,
        data_plane: DataPlane,
        env: EnvClient,
        admission: HoldSet,
        deadlines: DeadlineRegistry,
        stats: RunStats,
        on_group_settled: Callable[[str, bool], None],
        plans: dict[str, RolloutLevelPlan],
        audit: AuditLog | None = None,
    ) -> None:
        self._cfg = cfg
        self._inflight_limit = inflight_limit
        self._dataloader = dataloader
        self._ledger = ledger
        self._data_plane = data_plane
        self._env = env
        self._admission = admission
        self._deadlines = deadlines
        self._stats = stats
        self._on_group_settled = on_group_settled
        self._audit = audit
        self._slot_freed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._restored: list[tuple[str, int, Continuation | None, int]] = []
        self._to_score: list[str] = []
        self.crashed: BaseException | None = None
        self.groups = GroupReruns(plans, ledger, data_plane, env, stats, cfg.max_attempts, self._cancel_quietly,
                                    audit)

    def restore(self, continuations: dict[tuple[str, int], Continuation]) -> tuple[int, list[str]]:
        """After the ledger was restored: queue every unfinished sibling, as each group's level says.

        `turn` continues the saved agents passed in, `sibling` reruns unfinished siblings from
        scratch, `prompt_group` reruns every started group whole. Returns how many siblings
        were queued, and the settled groups the train pump takes or discards now (a
        group-scored one still waiting for its judge is scored first, when the pump runs).
        """
        to_run, settled = self._ledger.reopen_after_restore()
        by_group: dict[str, list[int]] = {}
        for group_id, sibling in to_run:
            by_group.setdefault(group_id, []).append(sibling)
        self._restored = []
        for group_id, siblings in by_group.items():
            plan = self.groups.plan(group_id)
            if not plan.keeps_sealed_siblings and self._ledger.started_any(group_id):
                self.groups.rerun_at_restore(group_id)
                siblings = list(range(self._cfg.group_size))
            round_ = self._ledger.round(group_id)
            for sibling in siblings:
                continuation = continuations.get((group_id, sibling)) if plan.continues_saved_turns else None
                self._restored.append((group_id, sibling, continuation, round_))
        self._to_score = [gid for gid in settled if self.groups.plan(gid).group_scored and self.settle(gid)
                          and not self._ledger.scored(gid)]
        return len(self._restored), [gid for gid in settled if gid not in self._to_score]

    def settle(self, group_id: str) -> bool | None:
        return self._ledger.settle(group_id, need_all=self.groups.plan(group_id).group_scored)

    def group_finished(self) -> None:
        """A group was trained or discarded: its in-flight slot is free."""
        self._slot_freed.set()

    async def run(self) -> None:
        self._main_task = asyncio.current_task()
        restored, self._restored = self._restored, []
        for group_id, sibling, continuation, round_ in restored:
            self._spawn(self._run_sibling(group_id, sibling, continuation, round_))
        to_score, self._to_score = self._to_score, []
        for group_id in to_score:
            self._spawn(self._finish_group(group_id, self._ledger.round(group_id)))
        try:
            while True:
                await self._wait_for_slot()
                await self._admission.wait_clear()
                group_id, problem = self._dataloader.next_group()
                self._ledger.admit(group_id, problem, self._cfg.group_size)
                self._emit(GroupAdmitted, group_id=group_id, size=self._cfg.group_size, env=problem.env)
                for sibling in range(self._cfg.group_size):
                    self._spawn(self._run_sibling(group_id, sibling))
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._stop_remote_agents()
            if self.crashed is not None:
                raise RuntimeError("a rollout sibling task crashed; see the log above") from self.crashed

    async def _stop_remote_agents(self) -> None:
        # Closing our HTTP requests does not stop the server's agents; without this they
        # would keep generating (and hold unACKed results) after the pump stopped.
        try:
            await self._env.cancel_all()
        except (aiohttp.ClientError, EnvServerError) as err:
            log.warning("could not stop the environment server's agents: %s", err)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._sibling_done)

    def _sibling_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A sibling task dying silently would leave its group unsettled forever.
            log.error("sibling task crashed", exc_info=task.exception())
            self.crashed = task.exception()
            self._main_task.cancel()

    async def _wait_for_slot(self) -> None:
        while self._ledger.inflight() >= self._inflight_limit:
            self._slot_freed.clear()
            await self._slot_freed.wait()

    def waiting_on(self) -> str:
        """What the pump waits on now, in words (the stall watchdog's warning names it)."""
        running = len(self._tasks)
        if self._admission.holders():
            return f"admission, closed by {', '.join(sorted(self._admission.holders()))} ({running} siblings wait)"
        inflight = self._ledger.inflight()
        if inflight >= self._inflight_limit:
            return (f"a free slot: {inflight} groups admitted and not yet trained (limit {self._inflight_limit}); "
                    f"{running} siblings running")
        return f"{running} siblings running on the environment servers"

    def _emit(self, event_cls, **fields) -> None:
        if self._audit is not None:
            self._audit.emit(event_cls, **fields)

    async def _run_sibling(
        self, group_id: str, sibling: int, continuation: Continuation | None = None, round_: int = 0,
    ) -> None:
        while True:
            await self._admission.wait_clear()
            if self._ledger.round(group_id) != round_:
                return  # the group was rerun whole (or finished) while this task waited
            request = self._start_attempt(group_id, sibling, continuation)
            result = await self._attempt(request)
            if self._ledger.round(group_id) != round_:
                if result.row is not None:
                    await self._ack(result.receipt)  # a row of an abandoned round is dropped
                return
            if result.row is not None and not result.outcome.is_error():
                if not await self._store(result, continuation, round_):
                    return
                self._ledger.seal(group_id, sibling)
                break
            continuation = None  # a failed continuation is rerun from scratch
            after = await self._after_failure(request, result, round_)
            if after is _After.RETRY:
                continue
            if after is _After.STOP:
                return
            break
        await self._finish_group(group_id, round_ if self._ledger.round(group_id) == round_ else None)

    def _start_attempt(self, group_id: str, sibling: int, continuation: Continuation | None) -> RolloutRequest:
        """Count the sibling's next attempt in the ledger and announce it: the request to send."""
        attempt = self._ledger.start_attempt(group_id, sibling)
        request = RolloutRequest(
            rollout_id=f"{group_id}.{sibling}.{attempt}",
            group_id=group_id,
            sibling=sibling,
            attempt=attempt,
            incarnation=self._ledger.incarnation,
            problem=self._ledger.problem(group_id),
            resume_from=continuation.rollout_id if continuation else None,
        )
        if continuation is not None:
            self.groups.count(group_id, "resumed_from_turn")
        elif attempt > 0:
            self.groups.count(group_id, "rerun_from_scratch")
        self._emit(
            SiblingStarted, rollout_id=request.rollout_id, group_id=group_id, sibling=sibling, attempt=attempt,
            resumed_from=request.resume_from, resumed_turn=continuation.turn_index if continuation else 0,
        )
        return request

    async def _after_failure(self, request: RolloutRequest, result: RolloutResult, round_: int) -> _After:
        """A failed or timed-out attempt: run it again, rerun the whole group, or drop the sibling."""
        group_id, sibling, attempt = request.group_id, request.sibling, request.attempt
        reason = f"{result.outcome}: {result.reason}"
        if result.outcome is RolloutOutcome.FAILED and self._env.is_away(request.problem.env):
            self._interrupted(request, reason)
            return _After.RETRY
        log.info("rollout %s %s", request.rollout_id, reason)
        whole = self.groups.plan(group_id).retries_whole_group
        retry = not whole and self._ledger.fail(group_id, sibling, reason, self._cfg.max_attempts)
        self._emit(
            SiblingFailed, rollout_id=request.rollout_id, group_id=group_id, sibling=sibling, attempt=attempt,
            reason=reason, will_retry=retry or whole,
        )
        if whole:
            return await self._rerun_group(group_id, sibling, reason, round_)
        if retry:
            self._stats.retries += 1
            return _After.RETRY
        self._stats.siblings_dropped[str(result.outcome)] += 1
        log.warning("sibling %s.%s dropped after %d attempts: %s", group_id, sibling, attempt + 1, result.reason)
        return _After.SETTLE

    def _interrupted(self, request: RolloutRequest, reason: str) -> None:
        # Its server went away under it: the attempt runs again once the server is back (`_attempt` waits),
        # spending no attempt; the absence is logged once per server, not once per rollout.
        log.debug("rollout %s interrupted by its server's absence: %s", request.rollout_id, reason)
        self._ledger.interrupt(request.group_id, request.sibling, reason)
        self._emit(SiblingFailed, rollout_id=request.rollout_id, group_id=request.group_id, sibling=request.sibling,
                   attempt=request.attempt, reason=f"interrupted, its environment server is away: {reason}",
                   will_retry=True)
        self._stats.interrupted += 1

    async def _rerun_group(self, group_id: str, sibling: int, reason: str, round_: int) -> _After:
        """The group's level reruns it whole after a failure: its siblings start over in the next round."""
        rerun = await self.groups.rerun_after_failure(group_id, f"sibling {sibling} {reason}", round_)
        if rerun is None:
            return _After.STOP  # another sibling's failure already started the next round
        if rerun:
            new_round = self._ledger.round(group_id)
            for sib in range(self._cfg.group_size):
                self._spawn(self._run_sibling(group_id, sib, None, new_round))
            return _After.STOP
        return _After.SETTLE

    async def _finish_group(self, group_id: str, round_: int | None) -> None:
        """Settle the group if this was its last sibling; a group-scored one is judged first."""
        trainable = self.settle(group_id)
        if trainable is None:
            return
        if trainable and self.groups.plan(group_id).group_scored and not self._ledger.scored(group_id):
            if round_ is None or not await self.groups.score(group_id, round_):
                return
        self._on_group_settled(group_id, trainable)

    async def _attempt(self, request: RolloutRequest) -> RolloutResult:
        budget = self._cfg.rollout_timeout_s
        # An environment server that is away is waited for here, before the rollout's clock starts.
        await self._env.wait_available(request.problem.env)
        try:
            return await self._deadlines.run_with_deadline(request.rollout_id, budget, self._env.run(request))
        except DeadlineExpired as expired:
            self._emit(DeadlineExpiredEvent, rollout_id=request.rollout_id, budget_s=budget,
                       running_s=round(expired.elapsed_s if expired.elapsed_s is not None else budget, 4))
            await self._cancel_quietly(request.rollout_id)
            return _failed(request, RolloutOutcome.TIMED_OUT, f"ran longer than rollout_timeout_s={budget}")
        except (aiohttp.ClientError, EnvServerError, asyncio.TimeoutError, ValueError) as err:
            return _failed(request, RolloutOutcome.FAILED, f"{type(err).__name__}: {err}")

    async def _cancel_quietly(self, rollout_id: str) -> None:
        try:
            await self._env.cancel(rollout_id)
        except (aiohttp.ClientError, EnvServerError) as err:
            log.warning("could not cancel %s on the environment server: %s", rollout_id, err)

    async def _store(self, result: RolloutResult, continuation: Continuation | None, round_: int) -> bool:
        """Store the row and ACK it; False (row dropped, still ACKed) when the group started a new round."""
        row = result.row
        assert row is not None
        entry = self._ledger.sibling(row.group_id, row.sibling)
        if entry is None or entry.attempts != row.attempt + 1:
            # After a restore attempt N continues as N+1: a row of any other attempt must never land.
            raise RuntimeError(f"row of {result.rollout_id} is not the current attempt of its sibling ({entry})")
        async with self._data_plane.barrier:
            # Registered with the row, so a flush that passes the barrier waits for this ACK too.
            self._data_plane.pending_acks.add(result.receipt)
            current = self._ledger.round(row.group_id) == round_  # a rerun deletes the group's rows under it too
            if current and self._data_plane.put(row):
                self._stats.generated_tokens += row.generated_tokens()
                self._stats.rows_sealed += 1
                self._emit(
                    SiblingSealed, rollout_id=result.rollout_id, group_id=row.group_id, sibling=row.sibling,
                    attempt=row.attempt, num_turns=row.num_turns, generated_tokens=row.generated_tokens(),
                    policy_versions=row.policy_versions(),
                    resumed_turn=continuation.turn_index if continuation else 0,
                    prefix_sha=segments_digest(row.segments[: continuation.segments]) if continuation else None,
                )
            journaled = self._data_plane.last_record
        # ACK only after the row is stored and its journal record is on disk (the server then forgets the result),
        # and outside the barrier: a slow server or a slow fsync must not hold up a cut.
        try:
            await self._data_plane.journal.durable(journaled)
            await self._ack(result.receipt)
        except EnvServerError as err:
            # The row is stored: a server that died lost the result with it, a live one drops it after its lease.
            log.warning("%s; the server drops an unACKed result after its lease", err)
        finally:
            self._data_plane.pending_acks.done(result.receipt)
        return current

    async def _ack(self, receipt: str) -> None:
        for attempt in range(5):
            try:
                await self._env.ack(receipt)
                return
            except (aiohttp.ClientError, EnvServerError) as err:
                log.warning("ACK of %s failed (try %d): %s", receipt, attempt + 1, err)
                await asyncio.sleep(0.2 * 2**attempt)
        raise EnvServerError(f"could not ACK receipt {receipt} after 5 tries; the row is stored")


def _failed(request: RolloutRequest, outcome: RolloutOutcome, reason: str) -> RolloutResult:
    return RolloutResult(rollout_id=request.rollout_id, outcome=outcome, reason=reason)
