"""Build the policy server's vLLM engine and sample from it over token ids.

The engine is vLLM V1's `AsyncLLM`: one API-side object in this process and an engine
core process that runs the model itself (`one_process_executor`). vLLM's CPU backend
would add a worker process of its own (its multiprocessing executor); one process fewer
halves the engine's start on 2 cores (12.6 s -> 6.5 s to build, 4.0 s -> 2.4 s to shut
down, measured alone) and every restart of a run waits on it.
This module holds the few settings that decide whether its numbers can be trusted
by the trainer and whether it coexists with the trainer on a small machine:

- logprobs: `logprobs_mode="processed_logprobs"`: the log-probability under the
  distribution the token was actually sampled from (after temperature; this server
  never sets top-k/top-p or logits processors). That is the behaviour policy the
  importance ratio needs. At temperature 1 it equals the trainer's
  `log_softmax(logits)` (about 1e-6 apart here; the tests check every refit at
  1e-3); at temperature T it
  equals `log_softmax(logits / T)`, i.e. `grpo.token_logprobs(..., temperature=T)`.
  vLLM's default, `raw_logprobs` (before temperature), would report a ratio of 1
  for tokens sampled at T != 1 from a different distribution, hiding that they are
  off-policy for the temperature-1 model.
- threads: `VLLM_CPU_OMP_THREADS_BIND=nobind` plus `OMP_NUM_THREADS=cpu_threads`.
  vLLM's default (`auto`) takes every core of a NUMA node but one (kept for the
  engine core process) and pins one OpenMP thread to each with OMP_PROC_BIND; on a
  machine shared with the trainer and environment servers that claims cores others
  need, and pinned threads cannot move off a busy core. `nobind` skips pinning
  (the worker keeps the process's whole affinity mask), and the worker, spawned
  while these variables are set, sizes its OpenMP pool from `OMP_NUM_THREADS`.
  On 2 cores, 1 thread beat 2 (the API and engine core processes need a core).
- KV cache: `kv_cache_memory_bytes` from the config; `VLLM_CPU_KVCACHE_SPACE` stays
  unset because it only counts whole GiB and would override the byte count.
- `VLLM_ENABLE_V1_MULTIPROCESSING=0` with `distributed_executor_backend="uni"` (one
  engine, no tensor parallelism): the worker lives in the engine core process. The
  CPU backend turns "uni" into "mp" unless the variable is 0, for the sake of OpenMP
  thread binding, which `nobind` above leaves alone anyway; the variable is read in
  the engine core process, spawned while it is set. On a GPU or with tensor
  parallelism vLLM chooses as it would.
- `TORCHDYNAMO_DISABLE=1` on the CPU with `enforce_eager`: the model already runs eagerly, but vLLM's sampler
  compiles its logprob rank count (`batched_count_greater_than`) with inductor, and that compile made the engine's
  first request take 1.5 s instead of 0.014 s (measured alone), on every start and restart. Eager, it is the same
  sum over a bool tensor of batch x vocabulary, at the same speed here (64 requests of 16 tokens: 0.093 s against
  0.105 s).
- `VLLM_ALLOW_INSECURE_SERIALIZATION=1`: the refit sends a module-level function
  through `collective_rpc`; vLLM's msgpack channel to the engine core refuses
  callables without it. The channel is a local IPC socket owned by this process.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

# Imported here, not lazily inside build_engine: vLLM keeps tracebacks of some
# failed optional imports, and a traceback holding build_engine's frames would keep
# the AsyncLLM alive until interpreter exit (where its __del__ then fails).
from vllm import SamplingParams, TokensPrompt
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from turnkeep.schemas.config_services import PolicyServerConfig

LOGPROBS_MODE = "processed_logprobs"


class Sample(NamedTuple):
    """One completion as the policy generated it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str


def engine_env(cfg: PolicyServerConfig) -> dict[str, str]:
    """Environment the engine's child processes must start with."""
    one_process = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if one_process_executor(cfg) else {}
    eager = {"TORCHDYNAMO_DISABLE": "1"} if one_process_executor(cfg) and cfg.enforce_eager else {}
    return {
        **one_process,
        **eager,
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(cfg.cpu_threads),
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        # Usage stats would try to phone home from a machine that has no network.
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def one_process_executor(cfg: PolicyServerConfig) -> bool:
    """The worker runs inside the engine core process: one engine on the CPU."""
    return cfg.tensor_parallel_size == 1 and not torch.cuda.is_available()


@contextlib.contextmanager
def _patched_env(values: dict[str, str]) -> Iterator[None]:
    """Set variables while the engine spawns its processes, then restore ours.

    OMP_NUM_THREADS must not leak into this process's later children (Ray workers,
    a trainer started from the same parent), so it is restored afterwards. The
    serialization flag is left set: this process encodes every later refit call.
    """
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if key == "VLLM_ALLOW_INSECURE_SERIALIZATION":
                continue
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_engine(model_dir: str | Path, cfg: PolicyServerConfig, seed: int = 0, dtype: str = "float32",
                 lora_args: dict | None = None, stat_loggers: list | None = None) -> AsyncLLM:
    """Start an `AsyncLLM` for the model directory (about 20 s on 2 cores); `lora_args`: room for the policy's
    LoRA adapter (`vllm_lora.engine_lora_args`); `stat_loggers`: factories of loggers vLLM hands each engine step's
    stats (`token_tally`).

    On a GPU, `gpu_memory_utilization` (when set) sizes the KV cache from the device's
    free memory; otherwise `kv_cache_memory_bytes` does, as on the CPU backend.
    """
    memory = (
        {"gpu_memory_utilization": cfg.gpu_memory_utilization}
        if cfg.gpu_memory_utilization is not None
        else {"kv_cache_memory_bytes": cfg.kv_cache_memory_bytes}
    )
    args = AsyncEngineArgs(
        model=str(model_dir),
        dtype=cfg.dtype or dtype,
        **memory,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        tensor_parallel_size=cfg.tensor_parallel_size,
        enforce_eager=cfg.enforce_eager,
        seed=seed,
        logprobs_mode=LOGPROBS_MODE,
        # Agents resend the whole conversation each turn, so prefix caching saves
        # most of the prefill; the refit clears it (stale KV from old weights).
        enable_prefix_caching=True,
        disable_log_stats=True,
        **({"distributed_executor_backend": "uni"} if one_process_executor(cfg) else {}),
        **(lora_args or {}),
    )
    with _patched_env(engine_env(cfg)):
        return AsyncLLM.from_engine_args(args, stat_loggers=stat_loggers)


def _sampling(max_tokens: int, temperature: float, stop_token_ids: list[int], seed: int | None,
              output_kind: RequestOutputKind, stream_interval: int | None = None) -> SamplingParams:
    """`logprobs=0` asks vLLM for the sampled token's logprob only."""
    return SamplingParams(
        stream_interval=stream_interval,
        max_tokens=max_tokens,
        temperature=temperature,
        stop_token_ids=list(stop_token_ids),
        seed=seed,
        logprobs=0,
        output_kind=output_kind,
        # token_ids always end with the stop token that ended generation (the
        # policy generated it and is trained on it); keep it in the text as well.
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        # The agent decides when a turn ends; EOS is just another stop token.
        ignore_eos=False,
    )


def _tokens_and_logprobs(choice) -> tuple[list[int], list[float]]:
    token_ids = list(choice.token_ids)
    logprobs = [step[tok].logprob for tok, step in zip(token_ids, choice.logprobs or [])]
    if len(logprobs) != len(token_ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
    return token_ids, logprobs


async def generate(
    engine: AsyncLLM,
    prompt_ids: list[int],
    max_tokens: int,
    temperature: float,
    stop_token_ids: list[int],
    seed: int | None,
    lora_request: Any = None,
) -> Sample:
    """Sample one completion with the sampled tokens' logprobs (FINAL_ONLY: one output per request); with
    `lora_request`, from the policy's LoRA adapter."""
    params = _sampling(max_tokens, temperature, stop_token_ids, seed, RequestOutputKind.FINAL_ONLY)
    final = None
    async for out in engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params, uuid.uuid4().hex,
                                     lora_request=lora_request):
        final = out
    if final is None:
        raise RuntimeError("vLLM returned no output")
    choice = final.outputs[0]
    token_ids, logprobs = _tokens_and_logprobs(choice)
    return Sample(token_ids, logprobs, choice.finish_reason or "length", choice.text)


async def stream_sample(
    engine: AsyncLLM,
    prompt_ids: list[int],
    max_tokens: int,
    temperature: float,
    stop_token_ids: list[int],
    seed: int | None,
    every_tokens: int = 1,
    lora_request: Any = None,
) -> AsyncIterator[Sample]:
    """Sample one completion as it is generated: each item holds only the new tokens (DELTA outputs) of at least
    `every_tokens` steps (the first token and the last ones come at once), the last item its finish reason (the
    others have an empty one). Sampling is exactly `generate`'s."""
    # vLLM's front end wakes a streamed request's reader once per `stream_interval` engine steps instead of every
    # step: with 64 turns streaming, per-step outputs cost the policy server's process half again its CPU.
    params = _sampling(max_tokens, temperature, stop_token_ids, seed, RequestOutputKind.DELTA,
                       stream_interval=every_tokens)
    async for out in engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params, uuid.uuid4().hex,
                                     lora_request=lora_request):
        choice = out.outputs[0]
        token_ids, logprobs = _tokens_and_logprobs(choice)
        yield Sample(token_ids, logprobs, (choice.finish_reason or "length") if out.finished else "", choice.text)
