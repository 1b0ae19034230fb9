"""Client of the policy server's completions endpoint, as the agent loop uses it."""

from __future__ import annotations

import aiohttp

from schemas.policy import CompletionRequest, CompletionResponse


class PolicyCallError(RuntimeError):
    """The policy server failed or answered with something that is not a completion."""


class PolicyClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self._url = base_url.rstrip("/") + "/v1/completions"
        self._session = session

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        async with self._session.post(self._url, data=request.model_dump_json()) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise PolicyCallError(f"policy server HTTP {resp.status}: {body[:300]!r}")
        response = CompletionResponse.model_validate_json(body)
        if len(response.choices) != 1:
            raise PolicyCallError(f"expected one choice, got {len(response.choices)}")
        return response
