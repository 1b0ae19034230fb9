"""Client of one policy engine's completions endpoint; `envs/engine_router.py` routes over several."""

from __future__ import annotations

from typing import Protocol

import aiohttp
from pydantic import ValidationError

from turnkeep.envs.streamed_turn import StreamedTurn
from turnkeep.schemas.policy import CompletionRequest, CompletionResponse, CompletionStreamLine


class PolicyCallError(RuntimeError):
    """The policy server failed or answered with something that is not a completion."""


class EngineFailed(PolicyCallError):
    """This engine could not answer (its connection broke, or it answered 5xx): another engine may.

    A PolicyCallError too, so a caller of one engine without a router fails the rollout as it always did."""


class Policy(Protocol):
    """What the agent loop calls: one engine (`PolicyClient`) or a router over several (`EngineRouter`)."""

    async def complete(self, request: CompletionRequest, *, rollout_id: str | None = None) -> CompletionResponse: ...

    async def stream(self, turn: StreamedTurn, *, rollout_id: str | None = None) -> None:
        """Generate the rest of `turn`, adding its tokens as they stream in."""
        ...


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

    async def stream(self, turn: StreamedTurn, *, rollout_id: str | None = None) -> None:
        """Generate the rest of the turn as a stream; the tokens that arrived before a failure stay in `turn`."""
        request = turn.rest()
        if request is None:
            return
        try:
            async with self._session.post(self._endpoint, data=request.model_dump_json()) as resp:
                if resp.status != 200:
                    body = await resp.read()
                    kind = EngineFailed if resp.status >= 500 else PolicyCallError
                    raise kind(f"policy engine {self.url} answered HTTP {resp.status}: {body[:300]!r}")
                async for raw in resp.content:
                    line = _stream_line(raw, self.url)
                    if line.error is not None:
                        raise EngineFailed(f"policy engine {self.url} failed mid-turn: {line.error}")
                    if line.delta is not None:
                        turn.add(line.delta)
                    elif line.finish_reason is not None:
                        turn.finish(line.finish_reason)
                        return
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as err:
            raise EngineFailed(f"policy engine {self.url} dropped the stream after {turn.generated()} tokens: "
                               f"{type(err).__name__}: {err}") from err
        raise EngineFailed(f"policy engine {self.url} ended the stream without its last line")


def _stream_line(raw: bytes, url: str) -> CompletionStreamLine:
    try:
        return CompletionStreamLine.model_validate_json(raw)
    except ValidationError as err:
        raise PolicyCallError(f"policy engine {url} sent a malformed stream line {raw[:200]!r}: {err}") from None
