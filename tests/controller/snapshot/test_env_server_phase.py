"""An attempt's phase over the environment servers fans out to all of them at once: an attempt takes as long as
the slowest server, one refusal fails it, and an abort gets past a server that is gone."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from aiohttp import web

from tests.participants.test_client import TOKEN, Hooks, serve
from turnkeep.controller.snapshot.env_server_phase import (
    commit_participants,
    prepare_participants,
    release_participants,
)
from turnkeep.participants.client import ParticipantClient
from turnkeep.participants.core import ParticipantCore, Quiescence
from turnkeep.participants.errors import ParticipantNotReady, ParticipantRefused
from turnkeep.participants.http_server import ControlAuth, add_participant_routes
from turnkeep.schemas.participant import Capabilities, FaultPlan, ParticipantStatus


def _app(name: str) -> tuple[web.Application, ParticipantCore]:
    app = web.Application()
    core = ParticipantCore(Capabilities(name=name, kind="environment", saves_state=True), Hooks())
    add_participant_routes(app, core, ControlAuth(TOKEN), fault_injection=True)
    return app, core


async def _servers(stack: AsyncExitStack, names: list[str], inline: bool = False):
    clients, cores = [], []
    for name in names:
        app, core = _app(name)
        url, session = await stack.enter_async_context(serve(app))
        clients.append(ParticipantClient(name, url, TOKEN, session, timeout_s=10, inline_files=inline))
        cores.append(core)
    return clients, cores


async def _nothing() -> None:
    pass


def test_prepare_takes_as_long_as_the_slowest_server_not_the_sum(tmp_path) -> None:
    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            clients, cores = await _servers(stack, [f"env{i}" for i in range(4)])
            for client in clients:
                await client.set_faults(FaultPlan(delay_s={"prepare": 0.6, "commit": 0.4, "resume": 0.4}))
            started = time.monotonic()
            await prepare_participants(clients, "A", 30, _nothing)
            prepare_s = time.monotonic() - started
            committed = await commit_participants(clients, "A", tmp_path)
            released_s = await release_participants(clients, "A", abort=False)
            # One server alone takes 0.6 s; four one after the other would take 2.4 s.
            assert 0.6 <= prepare_s < 1.5, prepare_s
            assert committed.participant_s < 1.2 and released_s < 1.2, (committed, released_s)
            assert sorted(a.path for a in committed.artifacts) == [f"env{i}/a.bin" for i in range(4)]
            assert committed.counts == {"n": 4}
            assert all(core.current is None for core in cores)

    asyncio.run(scenario())


def test_one_refusal_fails_the_prepare_and_the_abort_releases_every_server() -> None:
    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            clients, cores = await _servers(stack, ["env0", "env1", "env2"])
            cores[0]._hooks.counts = Quiescence(ready=False, detail="agents mid-turn")  # would wait for ever
            # A server that refuses (here: the wrong token) must not leave the attempt waiting on the others.
            refusing = _app("env3")
            url, session = await stack.enter_async_context(serve(refusing[0]))
            refuser = ParticipantClient("env3", url, "a-wrong-token", session, timeout_s=5)
            started = time.monotonic()
            with pytest.raises(ParticipantRefused, match="env3"):
                await prepare_participants([*clients, refuser], "A", 30, _nothing)
            assert time.monotonic() - started < 2
            await release_participants(clients, "A", abort=True)
            assert all(core.current is None for core in cores)

    asyncio.run(scenario())


def test_an_abort_gets_past_a_server_that_is_gone_but_a_resume_does_not() -> None:
    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            clients, cores = await _servers(stack, ["env0"])
            gone = ParticipantClient("gone", "http://127.0.0.1:9", TOKEN, clients[0]._session, timeout_s=2)
            await clients[0].prepare("A", 30)
            await release_participants([clients[0], gone], "A", abort=True)
            assert cores[0].current is None
            with pytest.raises(Exception, match="gone"):
                await release_participants([gone], "A", abort=False)

    asyncio.run(scenario())


def test_an_inline_commit_carries_the_files_and_checks_their_digests(tmp_path) -> None:
    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            clients, _ = await _servers(stack, ["far"], inline=True)
            await prepare_participants(clients, "A", 30, _nothing)
            committed = await commit_participants(clients, "A", tmp_path / "staging")
            [artifact] = committed.artifacts
            assert artifact.path == "far/a.bin"
            assert (tmp_path / "staging" / "far" / "a.bin").read_bytes() == b"x" * 10
            await release_participants(clients, "A", abort=False)

    asyncio.run(scenario())


def test_inline_files_that_do_not_match_their_manifest_are_refused(tmp_path: Path) -> None:
    from turnkeep.participants.inline_files import InlineFilesError, write_artifacts
    from turnkeep.schemas.participant import Artifact

    good = Artifact(path="far/a.bin", sha256="0" * 64, bytes=1)
    with pytest.raises(InlineFilesError, match="does not match its sha256"):
        write_artifacts("far", tmp_path, {"a.bin": "eA=="}, [good])
    with pytest.raises(InlineFilesError, match="plain file name"):
        write_artifacts("far", tmp_path, {"../a.bin": "eA=="}, [Artifact(path="far/../a.bin", sha256="0", bytes=1)])
    assert not (tmp_path / "a.bin").exists()


class NeverReady:
    """A participant that prepares but keeps waiting on one unACKed result."""

    name = "env-stuck"

    def __init__(self) -> None:
        self.renewed = 0

    async def prepare(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus:
        return self._status(checkpoint_id)

    async def status(self, checkpoint_id: str) -> ParticipantStatus:
        return self._status(checkpoint_id)

    async def renew(self, checkpoint_id: str, lease_s: float) -> ParticipantStatus:
        self.renewed += 1
        return self._status(checkpoint_id)

    def _status(self, checkpoint_id: str) -> ParticipantStatus:
        return ParticipantStatus(name=self.name, checkpoint_id=checkpoint_id, state="preparing", ready=False,
                                 unacked=1, detail="1 finished results not ACKed by the controller: rollout g.3.0 "
                                                   "(unACKed 4.0 s)")


def test_a_participant_not_ready_within_the_budget_is_named_with_what_it_waits_on() -> None:
    started = time.monotonic()
    with pytest.raises(ParticipantNotReady) as info:
        asyncio.run(prepare_participants([NeverReady()], "A", 30, _nothing, budget_s=0.4))
    assert time.monotonic() - started < 2
    message = str(info.value)
    assert "env-stuck" in message and "rollout g.3.0" in message and "prepare_timeout_s" in message
    assert isinstance(info.value, ParticipantRefused)  # fails the attempt, never retried into a longer wait
