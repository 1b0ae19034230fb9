"""The policy server as a checkpoint participant: fence and drain, record the version.

prepare closes admission with holder `snapshot:<checkpoint_id>` and the attempt's
lease (the gate is a hold set, so a coordinator that dies cannot keep it closed:
the hold expires by itself, and so does the participant core's lease). New
completion calls wait at the gate; accepted ones finish. Ready when nothing runs in
the engine and no weight load is under way (the version it records must be the one
that stays).

Ordering: this participant must be prepared *after* the environment servers are
ready. An agent that passed its boundary gate is mid-turn and needs its policy call
to go through before it can park; with admission already closed it would wait at
this gate forever and the environment server would never be ready. Prepared last,
the policy server only fences late callers and drains what is left (normally
nothing). Resume goes the other way: policy first, then agents.

commit writes `<directory>/state.json`: the policy version and whether the weights
are whole, so a restore can check it serves what the trainer checkpoint holds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from turnkeep.participants.core import Quiescence
from turnkeep.primitives.atomic_files import atomic_write_json, fsync_dir
from turnkeep.schemas.names import engine_name, snapshot_holder
from turnkeep.schemas.participant import Capabilities

if TYPE_CHECKING:
    from turnkeep.gpu_workers.policy_admission import AdmissionGate

STATE_FILE = "state.json"


class FencedServer(Protocol):
    """What the participant asks of the policy server (`gpu_workers.policy_server.PolicyServer`), named here so
    that this module needs not import the server's: the server imports this one to build its participant."""

    gate: AdmissionGate
    policy_version: int
    weights_ok: bool

    def close_admission(self, holder: str, lease_s: float | None = None) -> bool: ...

    def open_admission(self, holder: str) -> bool: ...

    def inflight(self) -> int: ...

    def refitting(self) -> bool: ...


def policy_capabilities(engine: int) -> Capabilities:
    """Engine k is participant `policy.<k>`: its state lands in its own folder of a snapshot."""
    return Capabilities(name=engine_name(engine), kind="policy", saves_state=True)


class PolicyParticipant:
    """`ParticipantHooks` of the policy server."""

    def __init__(self, server: FencedServer) -> None:
        self._server = server

    def on_prepare(self, checkpoint_id: str, lease_s: float) -> None:
        # Called again on renew: re-adding the holder with a lease resets the lease.
        self._server.close_admission(snapshot_holder(checkpoint_id), lease_s=lease_s)

    def on_release(self, checkpoint_id: str) -> None:
        self._server.open_admission(snapshot_holder(checkpoint_id))

    def status_counts(self) -> Quiescence:
        inflight = self._server.inflight()
        refitting = self._server.refitting()
        problems = []
        if inflight:
            problems.append(f"{inflight} accepted completion calls still running")
        if refitting:
            problems.append("a weight load is under way")
        return Quiescence(
            ready=not problems,
            running=inflight,
            waiting=self._server.gate.waiting(),
            detail="; ".join(problems),
        )

    async def write(self, directory: Path) -> tuple[list[Path], dict[str, int]]:
        state = {"policy_version": self._server.policy_version, "weights_ok": self._server.weights_ok}
        path = directory / STATE_FILE
        await asyncio.to_thread(_write_durably, path, state)
        return [path], {"policy_version": state["policy_version"]}


def _write_durably(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fsync_dir(path.parent.parent)
    atomic_write_json(path, state)
