"""The policy server's completions endpoint: an OpenAI-compatible subset over token ids."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CompletionRequest(BaseModel):
    # An infinite temperature or seed would reach vLLM's engine loop; JSON's Infinity/NaN are refused here.
    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True, allow_inf_nan=False)

    model: str = "policy"
    """Ignored beyond logging; the server serves one policy."""
    prompt: list[int]
    """Prompt as token ids."""
    max_tokens: int = Field(default=16, ge=1)
    """Tokens to generate at most."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature."""
    stop_token_ids: list[int] = []
    """Generation stops after any of these tokens (the stop token is included)."""
    logprobs: int = Field(default=1, ge=0)
    """OpenAI field; the sampled token's logprob is always returned."""
    seed: int | None = None
    """Per-request sampling seed."""


class CompletionLogprobs(BaseModel):
    token_logprobs: list[float]
    """Logprob of each generated token under the generating policy."""


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    """Detokenized generation."""
    token_ids: list[int]
    """Generated token ids."""
    logprobs: CompletionLogprobs
    """Per-token generation logprobs."""
    finish_reason: str
    """`stop` or `length`."""


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    model: str = "policy"
    choices: list[CompletionChoice]
    policy_version: int
    """Version of the weights that generated every token of this response."""
