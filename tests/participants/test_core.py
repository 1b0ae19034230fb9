"""The participant state machine with scripted hooks: fencing, idempotence, lease, commit."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

import pytest

from turnkeep.participants.core import ParticipantCore, ParticipantFault, Quiescence
from turnkeep.schemas.participant import Capabilities, ParticipantState


class ScriptedHooks:
    """Records what the core asks for; readiness and the write are set by each test."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.events: list[tuple[str, str]] = []
        self.counts = Quiescence(ready=True)
        self.write_gate: asyncio.Event | None = None

    def on_prepare(self, checkpoint_id: str, lease_s: float) -> None:
        self.held.add(checkpoint_id)
        self.events.append(("prepare", checkpoint_id))

    def on_release(self, checkpoint_id: str) -> None:
        self.held.discard(checkpoint_id)
        self.events.append(("release", checkpoint_id))

    def status_counts(self) -> Quiescence:
        return self.counts

    async def write(self, directory: Path) -> tuple[list[Path], dict[str, int]]:
        if self.write_gate is not None:
            await self.write_gate.wait()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "state.txt"
        path.write_bytes(b"saved\n")
        return [path], {"things": 1}


def make_core() -> tuple[ParticipantCore, ScriptedHooks]:
    hooks = ScriptedHooks()
    return ParticipantCore(Capabilities(name="p", kind="policy", saves_state=True), hooks), hooks


def fault_code(call) -> str:
    with pytest.raises(ParticipantFault) as info:
        call()
    return info.value.code


def test_fencing_to_one_checkpoint_id() -> None:
    async def scenario() -> None:
        core, hooks = make_core()
        status = core.prepare("A", lease_s=10)
        assert (status.checkpoint_id, status.state, status.ready) == ("A", ParticipantState.PREPARED, True)
        assert fault_code(lambda: core.prepare("B", lease_s=10)) == "wrong_checkpoint"
        assert fault_code(lambda: core.status("B")) == "wrong_checkpoint"
        assert fault_code(lambda: core.renew("B", 10)) == "wrong_checkpoint"
        assert fault_code(lambda: core.abort("B")) == "wrong_checkpoint"
        assert hooks.held == {"A"}

        # Repeating prepare for the same id is a renewal, not a second pause.
        again = core.prepare("A", lease_s=60)
        assert again.checkpoint_id == "A" and again.lease_remaining_s > 30
        assert core.status().checkpoint_id == "A"  # the unfenced status says what it is doing
        core.abort("A")

    asyncio.run(scenario())


def test_resume_and_abort_are_idempotent_release() -> None:
    async def scenario() -> None:
        core, hooks = make_core()
        core.prepare("A", lease_s=10)
        first = core.resume("A")
        assert (first.checkpoint_id, first.changed, first.state) == ("A", True, ParticipantState.RUNNING)
        assert core.resume("A").changed is False
        assert core.abort("A").changed is False  # a late compensation after the resume
        assert hooks.events == [("prepare", "A"), ("release", "A")]

        core.prepare("B", lease_s=10)
        late = core.resume("A")  # a retry about an ended checkpoint, while prepared for B
        assert (late.checkpoint_id, late.changed) == ("A", False)
        assert fault_code(lambda: core.abort("C")) == "wrong_checkpoint"  # never seen, and B is current
        assert core.abort("B").changed is True

        # An abort for an id that never reached us (its prepare failed on the way) is a
        # no-op, and fences off a prepare for it that arrives late.
        assert core.abort("D").changed is False
        assert fault_code(lambda: core.prepare("D", lease_s=10)) == "released"
        assert fault_code(lambda: core.prepare("A", lease_s=10)) == "released"
        assert hooks.held == set()

    asyncio.run(scenario())


def test_an_unrenewed_lease_resumes_by_itself(caplog) -> None:
    async def scenario() -> None:
        core, hooks = make_core()
        core.prepare("A", lease_s=0.3)
        await asyncio.sleep(0.2)
        core.renew("A", 0.1)
        await asyncio.sleep(0.25)  # nobody calls in: the lease's own timer must fire
        assert hooks.events == [("prepare", "A"), ("prepare", "A"), ("release", "A")]
        assert hooks.held == set()
        assert core.status().state is ParticipantState.RUNNING
        assert fault_code(lambda: core.renew("A", 10)) == "released"  # a late heartbeat revives nothing
        assert fault_code(lambda: core.status("A")) == "released"
        assert core.abort("A").changed is False

    with caplog.at_level(logging.WARNING, logger="turnkeep.participant"):
        asyncio.run(scenario())
    assert any("checkpoint A expired" in r.getMessage() for r in caplog.records)


def test_commit_only_when_prepared_and_ready(tmp_path) -> None:
    async def scenario() -> None:
        core, hooks = make_core()
        directory = tmp_path / "snap" / "p"
        with pytest.raises(ParticipantFault, match="not prepared") as info:
            await core.commit("A", directory)
        assert info.value.code == "not_prepared"

        hooks.counts = Quiescence(ready=False, running=2, detail="2 calls running")
        status = core.prepare("A", lease_s=10)
        assert (status.state, status.ready, status.running) == (ParticipantState.PREPARING, False, 2)
        with pytest.raises(ParticipantFault, match="2 calls running") as info:
            await core.commit("A", directory)
        assert info.value.code == "not_prepared"
        with pytest.raises(ParticipantFault, match="<snapshot root>/p") as info:
            await core.commit("A", tmp_path / "snap" / "other")
        assert info.value.code == "bad_request"

        hooks.counts = Quiescence(ready=True)
        result = await core.commit("A", directory)
        assert result.checkpoint_id == "A" and result.counts == {"things": 1}
        [artifact] = result.artifacts
        assert artifact.path == "p/state.txt"
        assert artifact.sha256 == hashlib.sha256(b"saved\n").hexdigest() and artifact.bytes == 6
        assert core.status("A").state is ParticipantState.COMMITTED
        assert (await core.commit("A", directory)).artifacts == [artifact]  # a retried commit rewrites
        assert core.resume("A").changed

    asyncio.run(scenario())


def test_a_commit_released_while_writing_fails(tmp_path) -> None:
    async def scenario() -> None:
        core, hooks = make_core()
        hooks.write_gate = asyncio.Event()
        core.prepare("A", lease_s=10)
        commit = asyncio.create_task(core.commit("A", tmp_path / "p"))
        await asyncio.sleep(0.01)
        core.abort("A")
        hooks.write_gate.set()
        with pytest.raises(ParticipantFault) as info:
            await commit
        assert info.value.code == "released"

    asyncio.run(scenario())


@pytest.mark.parametrize("lease_s", [float("inf"), float("nan"), 0, -1, 3601, "5"])
def test_a_bad_lease_is_refused_before_anything_is_prepared(lease_s) -> None:
    core, hooks = make_core()
    assert fault_code(lambda: core.prepare("A", lease_s)) == "bad_request"
    assert core.current is None and hooks.held == set() and hooks.events == []
    core.prepare("A", lease_s=10)
    assert fault_code(lambda: core.renew("A", lease_s)) == "bad_request"
    assert core.current == "A"
