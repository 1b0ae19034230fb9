"""HTTP client of one environment server's rollout routes (every route sends the server's token).

Every call has a time limit, so a server that hangs (accepts the connection, never answers)
ends as an `EnvTimeout` naming the server, its URL and the call, and a logged warning,
never as a wait that blocks the caller forever:

- control calls (`/ack`, `/cancel`, `/cancel_all`, `/health`): `CONTROL_TIMEOUT_S` each;
- `/attach`: `ATTACH_TIMEOUT_S` (the server sets the run up);
- `/judge`: `JUDGE_TIMEOUT_S` (a group-scored environment scores the whole group);
- `/run`: connecting is limited to `CONTROL_TIMEOUT_S`; the answer may take as long as the
  rollout runs, which the rollout pump's pausable per-rollout deadline bounds
  (`rollout.rollout_timeout_s`, paused while a snapshot parks the agent, the rollout
  cancelled with `/cancel` when it expires); `run_timeout_s` adds a wall-clock limit for a
  caller without such a deadline.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson
from pydantic import ValidationError

from turnkeep.schemas.environments import AttachReply, AttachRequest, JudgeReply, JudgeRequest
from turnkeep.schemas.rollout import AckRequest, RolloutRequest, RolloutResult

log = logging.getLogger("turnkeep.env")

CONTROL_TIMEOUT_S = 10.0
"""Each control call: a receipt's ACK, a cancel, the health counters. They do no work on the server."""
ATTACH_TIMEOUT_S = 30.0
"""Attaching a server to the run (the same limit `workers.remote_envs` gives the first attach)."""
JUDGE_TIMEOUT_S = 300.0
"""Scoring one group (the judge may itself call a model)."""


class EnvServerError(RuntimeError):
    """The environment server answered with an error or something that is not the expected reply."""


class EnvTimeout(EnvServerError, TimeoutError):
    """The environment server did not answer a call within its time limit (callers that handle either an
    environment server's error or a timeout handle this)."""


class EnvClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession, token: str, name: str = "env", *,
                 control_timeout_s: float | None = None, attach_timeout_s: float | None = None,
                 judge_timeout_s: float | None = None, run_timeout_s: float | None = None) -> None:
        """Time limits default to the module's constants; `run_timeout_s` None: `/run` has no wall-clock limit
        of its own (the caller's deadline bounds it)."""
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._session = session
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.control_timeout_s = CONTROL_TIMEOUT_S if control_timeout_s is None else control_timeout_s
        self.attach_timeout_s = ATTACH_TIMEOUT_S if attach_timeout_s is None else attach_timeout_s
        self.judge_timeout_s = JUDGE_TIMEOUT_S if judge_timeout_s is None else judge_timeout_s
        self.run_timeout_s = run_timeout_s

    def _timeout(self, total_s: float | None) -> aiohttp.ClientTimeout:
        # Connecting is always limited; `total` (None: none) covers connecting, sending and reading the answer.
        return aiohttp.ClientTimeout(total=total_s, connect=self.control_timeout_s)

    def _timed_out(self, method: str, route: str, what: str, limit_s: float | None) -> EnvTimeout:
        within = (f"within {limit_s:g}s" if limit_s is not None
                  else f"(connecting took over {self.control_timeout_s:g}s)")
        message = (f"environment server {self.name} ({self.base_url}) did not answer {method} /{route}"
                   f"{' ' + what if what else ''} {within}")
        log.warning("%s", message)
        return EnvTimeout(message)

    async def _post(self, route: str, body: str = "{}", what: str = "", timeout_s: float | None = None) -> bytes:
        limit_s = self.control_timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(limit_s):
                async with self._session.post(f"{self.base_url}/{route}", data=body, headers=self._headers,
                                              timeout=self._timeout(limit_s)) as resp:
                    raw = await resp.read()
        except asyncio.TimeoutError:  # also aiohttp's ServerTimeoutError and ConnectionTimeoutError
            raise self._timed_out("POST", route, what, limit_s) from None
        if resp.status != 200:
            raise EnvServerError(f"{self.name} /{route} {what}: HTTP {resp.status}: {raw[:300]!r}")
        return raw

    async def run(self, request: RolloutRequest) -> RolloutResult:
        limit_s = self.run_timeout_s
        try:
            async with asyncio.timeout(limit_s):
                async with self._session.post(f"{self.base_url}/run", data=request.model_dump_json(),
                                              headers=self._headers, timeout=self._timeout(limit_s)) as resp:
                    body = await resp.read()
        except asyncio.TimeoutError:
            raise self._timed_out("POST", "run", request.rollout_id, limit_s) from None
        if resp.status != 200:
            raise EnvServerError(f"{self.name} /run {request.rollout_id}: HTTP {resp.status}: {body[:300]!r}")
        result = RolloutResult.model_validate_json(body)
        if result.rollout_id != request.rollout_id:
            raise EnvServerError(
                f"{self.name} /run answered for rollout {result.rollout_id!r}, asked for {request.rollout_id!r}"
            )
        return result

    async def judge(self, request: JudgeRequest) -> list[float]:
        """A group-scored environment's rewards for every sibling of a group, scored together."""
        raw = await self._post("judge", request.model_dump_json(), request.group_id, self.judge_timeout_s)
        rewards = JudgeReply.model_validate_json(raw).rewards
        if len(rewards) != len(request.policy_turns):
            raise EnvServerError(f"{self.name} /judge {request.group_id}: {len(rewards)} rewards for "
                                 f"{len(request.policy_turns)} siblings")
        return rewards

    async def attach(self, request: AttachRequest) -> AttachReply:
        raw = await self._post("attach", request.model_dump_json(), timeout_s=self.attach_timeout_s)
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
        limit_s = self.control_timeout_s
        try:
            async with asyncio.timeout(limit_s):
                async with self._session.get(f"{self.base_url}/health", timeout=self._timeout(limit_s)) as resp:
                    if resp.status != 200:
                        raise EnvServerError(f"{self.name} /health: HTTP {resp.status}")
                    return await resp.json()
        except asyncio.TimeoutError:
            raise self._timed_out("GET", "health", "", limit_s) from None
