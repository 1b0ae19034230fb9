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
    stream: bool = False
    """Answer as newline-delimited JSON `CompletionStreamLine`s while the tokens are generated (the environment
    server journals a turn's tokens as they come); false: one `CompletionResponse`."""
    stream_chunk_tokens: int = Field(default=1, ge=1)
    """A streamed line carries at least this many new tokens ..."""
    stream_chunk_s: float = Field(default=0.0, ge=0)
    """... or what came in this long, whichever comes first (the last line carries the rest): a line per token
    costs the engine's process and the caller a parse each."""


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


class CompletionDelta(BaseModel):
    token_ids: list[int]
    """Tokens generated since the previous line."""
    token_logprobs: list[float]
    """Their generation logprobs."""
    policy_version: int
    """Version of the weights that generated them (the same for the whole stream)."""


class CompletionStreamLine(BaseModel):
    """One line of a streamed completion: new tokens, how it finished (the last line), or why it broke off. The
    last line does not repeat the tokens: a turn of thousands of tokens stays many short lines."""

    delta: CompletionDelta | None = None
    finish_reason: str | None = None
    """`stop` or `length`: the completion is whole."""
    error: str | None = None
    """The engine failed mid-stream (the status line was already sent): the tokens so far stand, the rest is lost."""
