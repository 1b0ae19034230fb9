"""HTTP client for the environment server's rollout routes."""

from __future__ import annotations

import aiohttp

from schemas.environments import JudgeReply, JudgeRequest
from schemas.rollout import AckRequest, RolloutRequest, RolloutResult


class EnvServerError(RuntimeError):
    """The environment server answered with an error or something that is not a RolloutResult."""


class EnvClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self._base = base_url.rstrip("/")
        self._session = session

    async def run(self, request: RolloutRequest) -> RolloutResult:
        async with self._session.post(f"{self._base}/run", data=request.model_dump_json()) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise EnvServerError(f"/run {request.rollout_id}: HTTP {resp.status}: {body[:300]!r}")
        result = RolloutResult.model_validate_json(body)
        if result.rollout_id != request.rollout_id:
            raise EnvServerError(
                f"/run answered for rollout {result.rollout_id!r}, asked for {request.rollout_id!r}"
            )
        return result

    async def judge(self, request: JudgeRequest) -> list[float]:
        """A group-scored environment's rewards for every sibling of a group, scored together."""
        async with self._session.post(f"{self._base}/judge", data=request.model_dump_json()) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise EnvServerError(f"/judge {request.group_id}: HTTP {resp.status}: {body[:300]!r}")
        rewards = JudgeReply.model_validate_json(body).rewards
        if len(rewards) != len(request.policy_turns):
            raise EnvServerError(f"/judge {request.group_id}: {len(rewards)} rewards for "
                                 f"{len(request.policy_turns)} siblings")
        return rewards

    async def ack(self, receipt: str) -> None:
        async with self._session.post(f"{self._base}/ack", data=AckRequest(receipt=receipt).model_dump_json()) as resp:
            if resp.status != 200:
                raise EnvServerError(f"/ack {receipt}: HTTP {resp.status}: {(await resp.read())[:300]!r}")

    async def cancel(self, rollout_id: str) -> None:
        async with self._session.post(f"{self._base}/cancel", json={"rollout_id": rollout_id}) as resp:
            await resp.read()

    async def cancel_all(self) -> int:
        """Stop every agent the server runs (the controller is going away)."""
        async with self._session.post(f"{self._base}/cancel_all") as resp:
            return int((await resp.json())["cancelled"])

    async def health(self) -> dict:
        async with self._session.get(f"{self._base}/health") as resp:
            return await resp.json()
