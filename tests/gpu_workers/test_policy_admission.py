"""The admission gate alone (no engine): waiting at the gate, drain, drain timeout."""

from __future__ import annotations

import asyncio

import pytest

from turnkeep.gpu_workers.policy_admission import AdmissionGate


async def _call(gate: AdmissionGate, release: asyncio.Event, log: list[str], name: str) -> None:
    async with gate.admitted():
        log.append(f"accepted {name}")
        await release.wait()
    log.append(f"done {name}")


def test_calls_wait_at_a_closed_gate() -> None:
    async def scenario() -> None:
        gate, release, log = AdmissionGate(), asyncio.Event(), []
        release.set()
        assert gate.close("refit") and gate.close("snapshot:a")
        assert not gate.close("refit")  # idempotent
        task = asyncio.create_task(_call(gate, release, log, "a"))
        await asyncio.sleep(0.05)
        assert log == [] and gate.inflight() == 0
        gate.open("refit")
        await asyncio.sleep(0.05)
        assert log == []  # one holder left
        gate.open("snapshot:a")
        await asyncio.wait_for(task, 1)
        assert log == ["accepted a", "done a"]

    asyncio.run(scenario())


def test_drain_waits_only_for_accepted_calls() -> None:
    async def scenario() -> None:
        gate, release, log = AdmissionGate(), asyncio.Event(), []
        early = [asyncio.create_task(_call(gate, release, log, str(i))) for i in range(3)]
        await asyncio.sleep(0.01)
        gate.close("snapshot:b")
        waiting = asyncio.create_task(_call(gate, release, log, "late"))
        drain = asyncio.create_task(gate.drain(timeout_s=5))
        await asyncio.sleep(0.05)
        assert not drain.done() and gate.inflight() == 3
        release.set()
        assert await drain == 3
        assert all(t.done() for t in early) and not waiting.done()
        assert "accepted late" not in log
        gate.open("snapshot:b")
        await asyncio.wait_for(waiting, 1)

    asyncio.run(scenario())


def test_drain_timeout_names_what_still_runs() -> None:
    async def scenario() -> None:
        gate, release, log = AdmissionGate(), asyncio.Event(), []
        task = asyncio.create_task(_call(gate, release, log, "slow"))
        await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError, match="1 of 1"):
            await gate.drain(timeout_s=0.05)
        release.set()
        await task
        assert await gate.drain(timeout_s=0.05) == 0

    asyncio.run(scenario())


def test_a_failing_call_still_leaves_the_registry() -> None:
    async def scenario() -> None:
        gate = AdmissionGate()
        with pytest.raises(RuntimeError):
            async with gate.admitted():
                raise RuntimeError("boom")
        assert gate.inflight() == 0 and await gate.drain(0.01) == 0

    asyncio.run(scenario())
