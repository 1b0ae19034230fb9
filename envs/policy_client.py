"""Client of one policy engine's completions endpoint; `envs/engine_router.py` routes over several."""

from __future__ import annotations

from typing import Protocol

import aiohttp

from schemas.policy import CompletionRequest, CompletionResponse


class PolicyCallError(RuntimeError):
    """The policy server failed or answered with something that is not a completion."""


class EngineFailed(PolicyCallError):
    """This engine could not answer (its connection broke, or it answered 5xx): another engine may.

    A PolicyCallError too, so a caller of one engine without a router fails the rollout as it always did."""


class Policy(Protocol):
    """What the agent loop calls: one engine (`PolicyClient`) or a router over several (`EngineRouter`)."""

    async def complete(self, request: CompletionRequest, *, rollout_id: str | None = None) -> CompletionResponse: ...


class PolicyClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self.url = base_url.rstrip("/")
        self._endpoint = self.url + "/v1/completions"
        self._session = session

    async def complete(self, request: CompletionRequest, *, rollout_id: str | None = None) -> CompletionResponse:
        """`rollout_id` is for routers; one engine answers every rollout."""
        try:
            async with self._session.post(self._endpoint, data=request.model_dump_json()) as resp:
                body = await resp.read()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as err:
            # The call never completed (refused, reset, dropped mid-answer): nothing of this turn was committed.
            raise EngineFailed(f"policy engine {self.url} dropped the call: {type(err).__name__}: {err}") from err
        if resp.status >= 500:
            # vLLM's core died (500) or the weights failed to load (503): the engine, not the request, is at fault.
            raise EngineFailed(f"policy engine {self.url} answered HTTP {resp.status}: {body[:300]!r}")
        if resp.status != 200:
            raise PolicyCallError(f"policy server HTTP {resp.status}: {body[:300]!r}")
        response = CompletionResponse.model_validate_json(body)
        if len(response.choices) != 1:
            raise PolicyCallError(f"expected one choice, got {len(response.choices)}")
        return response
