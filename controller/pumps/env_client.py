"""HTTP client of one environment server's rollout routes (every route sends the server's token)."""

from __future__ import annotations

import aiohttp
import orjson
from pydantic import ValidationError

from schemas.environments import AttachReply, AttachRequest, JudgeReply, JudgeRequest
from schemas.rollout import AckRequest, RolloutRequest, RolloutResult


class EnvServerError(RuntimeError):
    """The environment server answered with an error or something that is not the expected reply."""


class EnvClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession, token: str, name: str = "env") -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._session = session
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def _post(self, route: str, body: str = "{}", what: str = "") -> bytes:
        async with self._session.post(f"{self.base_url}/{route}", data=body, headers=self._headers) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise EnvServerError(f"{self.name} /{route} {what}: HTTP {resp.status}: {raw[:300]!r}")
        return raw

    async def run(self, request: RolloutRequest) -> RolloutResult:
        body = await self._post("run", request.model_dump_json(), request.rollout_id)
        result = RolloutResult.model_validate_json(body)
        if result.rollout_id != request.rollout_id:
            raise EnvServerError(
                f"{self.name} /run answered for rollout {result.rollout_id!r}, asked for {request.rollout_id!r}"
            )
        return result

    async def judge(self, request: JudgeRequest) -> list[float]:
        """A group-scored environment's rewards for every sibling of a group, scored together."""
        rewards = JudgeReply.model_validate_json(await self._post("judge", request.model_dump_json(),
                                                                  request.group_id)).rewards
        if len(rewards) != len(request.policy_turns):
            raise EnvServerError(f"{self.name} /judge {request.group_id}: {len(rewards)} rewards for "
                                 f"{len(request.policy_turns)} siblings")
        return rewards

    async def attach(self, request: AttachRequest) -> AttachReply:
        raw = await self._post("attach", request.model_dump_json())
        try:
            return AttachReply.model_validate_json(raw)
        except ValidationError as err:
            raise EnvServerError(f"{self.name} /attach: not an AttachReply ({err.error_count()} problems): "
                                 f"{raw[:200]!r}; is {self.base_url} a turnkeep env-server?") from None

    async def ack(self, receipt: str) -> None:
        await self._post("ack", AckRequest(receipt=receipt).model_dump_json(), receipt)

    async def cancel(self, rollout_id: str) -> None:
        await self._post("cancel", orjson.dumps({"rollout_id": rollout_id}).decode(), rollout_id)

    async def cancel_all(self) -> int:
        """Stop every agent the server runs (the controller is going away)."""
        return int(orjson.loads(await self._post("cancel_all"))["cancelled"])

    async def health(self) -> dict:
        async with self._session.get(f"{self.base_url}/health") as resp:
            if resp.status != 200:
                raise EnvServerError(f"{self.name} /health: HTTP {resp.status}")
            return await resp.json()
