"""The checkpoint participant's state machine, shared by the environment and policy servers.

It knows nothing about HTTP (see `participants.http_server`) nor about agents or engines: a
concrete participant supplies four hooks (`ParticipantHooks`). The core owns what
must be identical everywhere:

- fencing: the participant is prepared for at most one checkpoint id; a call about
  another id while prepared is a `wrong_checkpoint` error (a coordinator bug).
- the lease: a prepared participant resumes by itself when the coordinator stops
  renewing (a terminated workflow runs no compensation, invariant 4).
- idempotence: prepare repeated for the current id renews its lease; resume and abort
  of an id that already ended answer `changed=False`, so retried activities are safe.
- commit only when prepared *and* ready for that id.

Resume (normally after commit) and abort (compensation) both *release* the
participant; only the bookkeeping of which one happened differs.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Protocol

from turnkeep.primitives.atomic_files import sha256_file
from turnkeep.primitives.holds import HoldSet
from turnkeep.schemas.names import snapshot_holder
from turnkeep.schemas.participant import (
    MAX_LEASE_S,
    Artifact,
    Capabilities,
    CommitResult,
    ControlReply,
    ParticipantState,
    ParticipantStatus,
)

logger = logging.getLogger("turnkeep.participant")

REMEMBERED_CHECKPOINTS = 256
"""Ended checkpoint ids kept to answer late repeats idempotently (attempts are minutes apart)."""


class Quiescence(NamedTuple):
    """What a participant reports about its own work (see `ParticipantStatus`)."""

    ready: bool
    running: int = 0
    parked: int = 0
    waiting: int = 0
    unacked: int = 0
    detail: str = ""


class ParticipantHooks(Protocol):
    def on_prepare(self, checkpoint_id: str, lease_s: float) -> None:
        """Take (or, called again, renew) the participant's pause for `checkpoint_id`; idempotent."""

    def on_release(self, checkpoint_id: str) -> None:
        """Lift the pause (resume, abort or lease expiry); idempotent."""

    def status_counts(self) -> Quiescence:
        """Current work counts; `ready` means quiescent under the pause."""

    async def write(self, directory: Path) -> tuple[list[Path], dict[str, int]]:
        """Write artifacts into `directory` (fsynced); return the files written and counts."""


class ParticipantFault(Exception):
    """A call the participant refuses; `code` is `ParticipantError.code`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class ParticipantCore:
    """One participant's checkpoint protocol state; lives on one asyncio loop."""

    def __init__(self, capabilities: Capabilities, hooks: ParticipantHooks) -> None:
        self.capabilities = capabilities
        self.name = capabilities.name
        self._hooks = hooks
        self._current: str | None = None
        self._committed = False
        # How each ended checkpoint ended: "resumed", "aborted" or "lease_expired".
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._lease = HoldSet(f"checkpoint-lease:{self.name}")
        self._lease.on_change(self._on_lease_change)
        self._commit_lock = asyncio.Lock()

    def rename(self, capabilities: Capabilities) -> None:
        """Answer under a new name (a stand-alone environment server takes the name a run gives it)."""
        if self.current is not None:
            raise ParticipantFault("wrong_checkpoint", f"{self.name} is prepared for {self.current}; cannot rename")
        self.capabilities = capabilities
        self.name = capabilities.name

    @property
    def current(self) -> str | None:
        """The checkpoint id the participant is prepared for (None while running)."""
        self._lease.is_clear()  # notices an expired lease even if the timer has not fired yet
        return self._current

    # -- protocol calls --------------------------------------------------------------

    def prepare(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus:
        _check_call(checkpoint_id, lease_s)
        current = self.current
        if current is None:
            if checkpoint_id in self._ended:
                raise self._released(checkpoint_id)
            self._current, self._committed = checkpoint_id, False
            logger.info("participant %s: preparing for checkpoint %s (lease %.1fs)", self.name, checkpoint_id, lease_s)
        elif current != checkpoint_id:
            raise self._wrong(checkpoint_id, current)
        # Lease first: if the hook fails half way, the expiring lease still releases it.
        self._lease.add(snapshot_holder(checkpoint_id), lease_s=lease_s)
        self._hooks.on_prepare(checkpoint_id, lease_s)
        return self.status(checkpoint_id)

    def renew(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus:
        _check_call(checkpoint_id, lease_s)
        self._require_current(checkpoint_id)
        self._lease.renew(snapshot_holder(checkpoint_id), lease_s)
        self._hooks.on_prepare(checkpoint_id, lease_s)
        return self.status(checkpoint_id)

    def status(self, checkpoint_id: str | None = None) -> ParticipantStatus:
        """Status fenced by `checkpoint_id`; without one, whatever the participant is doing."""
        if checkpoint_id is not None:
            self._require_current(checkpoint_id)
        counts = self._hooks.status_counts()
        current = self.current
        ready = current is not None and counts.ready
        lease = self._lease.next_expiry_in() if current is not None else None
        return ParticipantStatus(
            name=self.name,
            checkpoint_id=current,
            state=self._state(ready),
            ready=ready,
            running=counts.running,
            parked=counts.parked,
            waiting=counts.waiting,
            unacked=counts.unacked,
            lease_remaining_s=lease,
            detail=counts.detail,
        )

    async def commit(
        self, checkpoint_id: str, directory: Path, before_write: Callable[[], None] | None = None
    ) -> CommitResult:
        """Write the artifacts into `directory` (`<snapshot root>/<name>`); repeatable while prepared."""
        if not directory.is_absolute() or directory.name != self.name:
            raise ParticipantFault(
                "bad_request", f"directory: must be the absolute path <snapshot root>/{self.name}, got {directory}"
            )
        async with self._commit_lock:
            self._require_current(checkpoint_id)
            counts = self._hooks.status_counts()
            if not counts.ready:
                raise ParticipantFault(
                    "not_prepared", f"{self.name} is prepared for {checkpoint_id} but not ready: {counts.detail}"
                )
            if before_write is not None:
                before_write()
            files, saved = await self._hooks.write(directory)
            # The write awaited: an abort or an expired lease may have released us meanwhile,
            # and then the files describe a state that is already gone.
            self._require_current(checkpoint_id)
            artifacts = await asyncio.to_thread(_artifacts, self.name, directory, files)
            self._committed = True
        logger.info("participant %s: committed checkpoint %s (%s)", self.name, checkpoint_id, saved)
        return CommitResult(name=self.name, checkpoint_id=checkpoint_id, artifacts=artifacts, counts=saved)

    def resume(self, checkpoint_id: str) -> ControlReply:
        return self._end(checkpoint_id, "resumed")

    def abort(self, checkpoint_id: str) -> ControlReply:
        return self._end(checkpoint_id, "aborted")

    def abandon(self) -> str | None:
        """A new controller took over: the checkpoint the dead one left prepared is aborted (its id, or None)."""
        current = self.current
        if current is not None:
            self._release(current, "aborted (its controller died)")
        return current

    # -- internals -------------------------------------------------------------------

    def _end(self, checkpoint_id: str, how: str) -> ControlReply:
        current = self.current
        if current == checkpoint_id:
            self._release(checkpoint_id, how)
            return self._reply(checkpoint_id, changed=True)
        if current is not None and checkpoint_id not in self._ended:
            raise self._wrong(checkpoint_id, current)
        # Already ended, or never reached us while we ran normally (a compensation for a
        # prepare that failed on the way): nothing to release, remember it so a late
        # prepare for it is refused.
        if checkpoint_id not in self._ended:
            self._remember(checkpoint_id, how)
        return self._reply(checkpoint_id, changed=False)

    def _release(self, checkpoint_id: str, how: str) -> None:
        # Clear _current before touching the lease: the lease listener treats a clear
        # lease with a current checkpoint as an expiry.
        self._current, self._committed = None, False
        self._remember(checkpoint_id, how)
        self._lease.release(snapshot_holder(checkpoint_id))
        self._hooks.on_release(checkpoint_id)
        logger.info("participant %s: checkpoint %s %s", self.name, checkpoint_id, how)

    def _on_lease_change(self, is_clear: bool) -> None:
        if not is_clear or self._current is None:
            return
        checkpoint_id = self._current
        logger.warning(
            "participant %s: lease of checkpoint %s expired without renewal (coordinator gone?); resuming by itself",
            self.name,
            checkpoint_id,
        )
        self._current, self._committed = None, False
        self._remember(checkpoint_id, "lease_expired")
        self._hooks.on_release(checkpoint_id)

    def _remember(self, checkpoint_id: str, how: str) -> None:
        self._ended[checkpoint_id] = how
        while len(self._ended) > REMEMBERED_CHECKPOINTS:
            self._ended.popitem(last=False)

    def _require_current(self, checkpoint_id: str) -> None:
        current = self.current
        if current == checkpoint_id:
            return
        if current is not None:
            raise self._wrong(checkpoint_id, current)
        if checkpoint_id in self._ended:
            raise self._released(checkpoint_id)
        raise ParticipantFault("not_prepared", f"{self.name} is not prepared for checkpoint {checkpoint_id}")

    def _state(self, ready: bool) -> ParticipantState:
        if self._current is None:
            return ParticipantState.RUNNING
        if self._committed:
            return ParticipantState.COMMITTED
        return ParticipantState.PREPARED if ready else ParticipantState.PREPARING

    def _reply(self, checkpoint_id: str, changed: bool) -> ControlReply:
        state = self._state(self._current is not None and self._hooks.status_counts().ready)
        return ControlReply(name=self.name, checkpoint_id=checkpoint_id, state=state, changed=changed)

    def _wrong(self, asked: str, current: str) -> ParticipantFault:
        return ParticipantFault(
            "wrong_checkpoint", f"{self.name} is prepared for checkpoint {current}, not {asked}"
        )

    def _released(self, checkpoint_id: str) -> ParticipantFault:
        how = self._ended[checkpoint_id].replace("_", " ")
        return ParticipantFault(
            "released",
            f"{self.name} already ended checkpoint {checkpoint_id} ({how}); a new attempt needs a new checkpoint id",
        )


def _check_call(checkpoint_id: str, lease_s: float) -> None:
    """Before any state moves: an in-process caller skips the HTTP schema, so the core checks too."""
    if not checkpoint_id:
        raise ParticipantFault("bad_request", "checkpoint_id: must not be empty")
    if not (isinstance(lease_s, (int, float)) and 0 < lease_s <= MAX_LEASE_S):
        raise ParticipantFault("bad_request", f"lease_s: must be a number of seconds in (0, {MAX_LEASE_S:g}], "
                                              f"got {lease_s!r}")


def _artifacts(name: str, directory: Path, files: list[Path]) -> list[Artifact]:
    """Manifest entries, paths relative to the snapshot root (`<name>/...`), digests read back from disk."""
    return [
        Artifact(path=f"{name}/{f.relative_to(directory).as_posix()}", sha256=sha256_file(f), bytes=f.stat().st_size)
        for f in files
    ]
