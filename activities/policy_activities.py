"""Policy server activities: they run in the policy server's process, on `<run_id>.policy`,
because the gate they close, the engine they drain and the weights they load live there.

`policy.prepare` fences new completion calls (the gate's holder `snapshot:<id>`, with the
attempt's lease) and drains the accepted ones, heartbeating until the participant core
says it is ready, so a dead policy process shows in the attempt's history as this
activity's heartbeat timeout. `policy.commit` writes the version it serves;
`policy.resume` and `policy.abort` reopen the gate. `policy.load_weights` (a restore)
fetches the restored trainer's weights through Ray and loads them into the engine in
place. The checkpoint protocol is the same participant core the HTTP routes serve, and
so is its fault injection (tests make these calls fail on cue).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnkeep.activities.budget import remaining_budget_s
from turnkeep.activities.errors import check_incarnation, translated_errors
from turnkeep.activities.heartbeat import heartbeating
from turnkeep.activities.input_checks import check_int, check_lease, check_staging_shape
from turnkeep.participants.core import ParticipantCore, ParticipantFault
from turnkeep.participants.errors import ParticipantInvariantBroken, ParticipantRefused
from turnkeep.participants.faults import FaultInjector
from turnkeep.participants.in_process import InProcessParticipant
from turnkeep.participants.readiness import until_ready
from turnkeep.schemas.attempt_steps import (
    POLICY_ABORT,
    POLICY_COMMIT,
    POLICY_PREPARE,
    POLICY_RESUME,
    GymCommitResult,
    GymInput,
    GymReleaseResult,
    PolicyPrepareResult,
)
from turnkeep.schemas.recovery import POLICY_LOAD_WEIGHTS, PolicyLoadInput, PolicyLoadResult


class EngineServer(Protocol):
    """What an engine's activities ask of its policy server (`gpu_workers.policy_server.PolicyServer`), named here
    so the activities, below the GPU side, do not import it."""

    participant: ParticipantCore

    def inflight(self) -> int: ...
    async def load_weights(self, blob: bytes, version: int) -> float: ...


class PolicyActivities:
    def __init__(self, server: EngineServer, faults: FaultInjector, incarnation: int,
                 trainer_weights: Callable[[], object]) -> None:
        """`trainer_weights()` returns the restored trainer's weights (a Ray object ref of safetensors bytes)."""
        self._server = server
        self._core = server.participant
        self._participant = InProcessParticipant(self._core, before_write=lambda: faults.enospc("commit"))
        self._faults = faults
        self._incarnation = incarnation
        self._trainer_weights = trainer_weights

    @activity.defn(name=POLICY_PREPARE)
    async def prepare(self, inp: GymInput) -> PolicyPrepareResult:
        check_incarnation(inp.incarnation, self._incarnation)
        check_lease("lease_s", inp.lease_s)
        started = time.monotonic()
        drained = self._server.inflight()
        with self._protocol("prepare"), heartbeating("fencing and draining the policy server"):
            await until_ready(self._participant, inp.checkpoint_id, inp.lease_s, renew_others=_nothing_else,
                              budget_s=remaining_budget_s())
            await self._delay("prepare")
        return PolicyPrepareResult(participant_s=round(time.monotonic() - started, 3), drained=drained)

    @activity.defn(name=POLICY_COMMIT)
    async def commit(self, inp: GymInput) -> GymCommitResult:
        check_incarnation(inp.incarnation, self._incarnation)
        check_lease("lease_s", inp.lease_s)
        staging = check_staging_shape("staging_dir", inp.staging_dir, inp.checkpoint_id)
        started = time.monotonic()
        with self._protocol("commit"):
            await self._participant.renew(inp.checkpoint_id, inp.lease_s)  # the attempt is alive: keep the fence up
            result = await self._participant.commit(inp.checkpoint_id, staging / self._core.name)
            await self._delay("commit")
        return GymCommitResult(participant_s=round(time.monotonic() - started, 3), artifacts=result.artifacts,
                               counts=result.counts)

    @activity.defn(name=POLICY_RESUME)
    async def resume(self, inp: GymInput) -> GymReleaseResult:
        return await self._release(inp, "resume", self._core.resume)

    @activity.defn(name=POLICY_ABORT)
    async def abort(self, inp: GymInput) -> GymReleaseResult:
        return await self._release(inp, "abort", self._core.abort)

    @activity.defn(name=POLICY_LOAD_WEIGHTS)
    async def load_weights(self, inp: PolicyLoadInput) -> PolicyLoadResult:
        check_incarnation(inp.incarnation, self._incarnation)
        check_int("policy_version", inp.policy_version, 0)
        started = time.monotonic()
        activity.heartbeat("fetching the trainer's weights")
        blob = await self._trainer_weights()
        activity.heartbeat(f"loading {len(blob)} bytes as version {inp.policy_version}")
        await self._server.load_weights(blob, inp.policy_version)
        return PolicyLoadResult(bytes=len(blob), seconds=round(time.monotonic() - started, 3))

    async def _release(self, inp: GymInput, route: str, end: Callable) -> GymReleaseResult:
        if inp.incarnation < self._incarnation:
            # That incarnation's fence ended with its processes: nothing of it is up here.
            return GymReleaseResult(participant_s=0.0, admission_closed_s=0.0)
        check_incarnation(inp.incarnation, self._incarnation)
        started = time.monotonic()
        with self._protocol(route):
            end(inp.checkpoint_id)
            await self._delay(route)
        return GymReleaseResult(participant_s=round(time.monotonic() - started, 3), admission_closed_s=0.0)

    @contextmanager
    def _protocol(self, route: str) -> Iterator[None]:
        """The participant core's refusals as the workflows' error types; injected faults as transient ones."""
        if (status := self._faults.take_failure(route)) is not None:
            raise ApplicationError(f"participant policy {route}: injected failure (as HTTP {status})")
        with translated_errors():
            try:
                yield
            except ParticipantFault as fault:
                raise _as_call_error(route, fault) from None

    async def _delay(self, route: str) -> None:
        if delay := self._faults.delay_s(route):
            await asyncio.sleep(delay)


async def _nothing_else() -> None:
    """The policy server's fence holds no lease elsewhere: the controller renews its own."""


def _as_call_error(route: str, fault: ParticipantFault) -> ParticipantRefused:
    kind = ParticipantInvariantBroken if fault.code == "wrong_checkpoint" else ParticipantRefused
    return kind("policy", route, fault.message, fault.code)
