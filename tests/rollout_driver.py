"""Drive the shared stack's environment server like the controller does, for participant tests.

Starts real rollouts over `POST /run`, ACKs every result that comes back (a snapshot is
not ready while a result is unACKed), and leaves the stack clean afterwards: every
checkpoint released, every rollout finished or cancelled.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable

import aiohttp

from turnkeep.envs.calc_task import sample_problem
from turnkeep.participants.client import ParticipantClient
from turnkeep.schemas.config import TaskConfig
from turnkeep.schemas.participant import FaultPlan, ParticipantStatus
from turnkeep.schemas.rollout import Problem, RolloutRequest, RolloutResult


class RolloutDriver:
    def __init__(self, session: aiohttp.ClientSession, env_url: str, token: str, task: TaskConfig) -> None:
        self.session = session
        self.env_url = env_url
        self.token = token
        self.auth = {"Authorization": f"Bearer {token}"}
        self._task = task
        self._rng = random.Random(1234)
        self.tasks: list[asyncio.Task[RolloutResult]] = []
        self.requests: dict[str, RolloutRequest] = {}

    def client(self, name: str, url: str, timeout_s: float = 10.0) -> ParticipantClient:
        return ParticipantClient(name, url, self.token, self.session, timeout_s=timeout_s)

    def start(self, n: int, env: str = "calc") -> list[asyncio.Task[RolloutResult]]:
        """n siblings of one new group of environment `env` (one problem, as the controller admits them)."""
        group = f"ptest-{uuid.uuid4().hex[:8]}"
        problem = sample_problem(self._task, self._rng).model_copy(update={"env": env})
        new = [asyncio.create_task(self.run_and_ack(self._request(group, i, problem))) for i in range(n)]
        self.tasks += new
        return new

    def _request(self, group: str, sibling: int, problem: Problem) -> RolloutRequest:
        request = RolloutRequest(
            rollout_id=f"{group}.{sibling}.0", group_id=group, sibling=sibling, attempt=0, problem=problem,
        )
        self.requests[request.rollout_id] = request
        return request

    async def run_and_ack(self, request: RolloutRequest) -> RolloutResult:
        async with self.session.post(f"{self.env_url}/run", data=request.model_dump_json(), headers=self.auth) as resp:
            assert resp.status == 200, await resp.text()
            result = RolloutResult.model_validate_json(await resp.read())
        if result.receipt:
            async with self.session.post(f"{self.env_url}/ack", json={"receipt": result.receipt}, headers=self.auth) as resp:
                assert resp.status == 200
        return result

    async def health(self, url: str | None = None) -> dict:
        async with self.session.get(f"{url or self.env_url}/health") as resp:
            return await resp.json()

    async def unfenced_status(self, url: str) -> ParticipantStatus:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with self.session.get(f"{url}/checkpoint/status", headers=headers) as resp:
            return ParticipantStatus.model_validate_json(await resp.read())

    async def slow_tools(self, seconds: float) -> None:
        """Every calculator tool call takes `seconds` longer (until cleanup), so agents started now are mid-rollout,
        between two boundaries, whenever a checkpoint comes, however fast the engine answers."""
        await self.client("env", self.env_url).set_faults(FaultPlan(tool_delay_s={"calc": seconds}))

    async def cleanup(self, releases: list[tuple[ParticipantClient, str]]) -> None:
        """Release every checkpoint (idempotent), then stop whatever still runs, and drop any injected fault."""
        for client, checkpoint_id in releases:
            try:
                await client.abort(checkpoint_id)
            except Exception:  # noqa: BLE001 - best effort: it may be released already
                pass
        async with self.session.post(f"{self.env_url}/cancel_all", headers=self.auth) as resp:
            await resp.read()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.client("env", self.env_url).set_faults(FaultPlan())


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str | Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s}s waiting for {described}")
        await asyncio.sleep(0.02)


async def wait_ready(client: ParticipantClient, checkpoint_id: str, timeout_s: float = 30.0) -> ParticipantStatus:
    statuses: list[ParticipantStatus] = []

    async def ready() -> bool:
        statuses.append(await client.status(checkpoint_id))
        return statuses[-1].ready

    await wait_for(ready, timeout_s, lambda: f"{client.name} ready for {checkpoint_id} (last: {statuses[-1]})")
    return statuses[-1]
