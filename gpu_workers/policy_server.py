"""The policy server: one vLLM engine, its admission gate, its weight version.

Agents call `POST /v1/completions` (see `policy_http`); the trainer calls
`load_weights` after each optimizer step; snapshot attempts fence and drain it
through the checkpoint participant routes (see `policy_participant`). The version
stamped on a response is the version that generated every one of its tokens,
because a weight load first closes the gate (holder `refit`) and drains every
accepted call, so no call ever straddles two versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from turnkeep.gpu_workers.policy_admission import AdmissionGate
from turnkeep.gpu_workers.policy_errors import RequestError, WeightsUnavailable
from turnkeep.gpu_workers.policy_http import build_app
from turnkeep.gpu_workers.policy_participant import PolicyParticipant, policy_capabilities
from turnkeep.gpu_workers.tally_stat_logger import stat_logger_factory
from turnkeep.gpu_workers.vllm_engine import build_engine, generate, stream_sample
from turnkeep.gpu_workers.vllm_lora import adapter_shapes, engine_lora_args, refit_adapter
from turnkeep.gpu_workers.vllm_refit import refit_engine
from turnkeep.gpu_workers.weights_blob import Shapes, check_blob, checkpoint_shapes
from turnkeep.participants.core import ParticipantCore
from turnkeep.participants.faults import FaultInjector
from turnkeep.participants.http_server import ControlAuth
from turnkeep.primitives.node_address import advertised_host, listen_host
from turnkeep.primitives.token_tally import GENERATED, PROBES, TokenTally
from turnkeep.schemas.config_services import PolicyServerConfig
from turnkeep.schemas.config_train import LoraConfig
from turnkeep.schemas.names import REFIT_HOLDER
from turnkeep.schemas.policy import (
    CompletionChoice,
    CompletionDelta,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamLine,
)

logger = logging.getLogger("turnkeep.policy_server")

STREAM_STEPS_MAX = 8
"""A streamed turn's new tokens come from vLLM at most this many at a time: seldom enough to spare its front end
a wake-up per token, often enough that a line's `stream_chunk_s` is kept to within this many tokens."""


class PolicyServer:
    """vLLM engine + HTTP endpoint + admission gate + policy version."""

    def __init__(self, engine: int = 0) -> None:
        self.engine = engine
        self.gate = AdmissionGate()
        self.policy_version = 0
        # False after a failed load: the model may hold a mix of two versions.
        self.weights_ok = True
        self._engine: Any = None
        self._cfg: PolicyServerConfig | None = None
        self._vocab_size = 0
        # Names and shapes a weight blob must have; None skips the check.
        self.weight_shapes: Shapes | None = None
        self._runner: web.AppRunner | None = None
        self._refit_lock = asyncio.Lock()
        self._warming: asyncio.Task | None = None
        self.warm_up_error: str | None = None
        """Why the engine's first request failed (None: it has not failed)."""
        self._restore_pending = False
        self.participant = ParticipantCore(policy_capabilities(engine), PolicyParticipant(self))
        self.faults = FaultInjector()
        """Injected checkpoint faults (served with `policy.fault_injection`; empty otherwise)."""
        self.url = ""
        self.tokens_generated = 0
        """Completion tokens this engine delivered since it started."""
        self.tally = TokenTally()
        """Every token the engine core generated, counted per step by vLLM's stats (`token_tally`)."""
        self._lora: LoraConfig | None = None
        """With `[train.lora] refit = "adapters"`: the policy's adapters, which every refit carries."""
        self._lora_request: Any = None
        """The loaded adapters every request names (None: none loaded yet; the base model is the policy)."""
        self._adapter_dir: Path | None = None
        self._loading_since: float | None = None
        """When the engine paused for the weight load under way (None: none; the drain before it is not a pause:
        in-flight calls still generate)."""

    async def start(
        self, model_dir: str | Path, cfg: PolicyServerConfig, seed: int = 0, control_token: str | None = None,
        lora: LoraConfig | None = None,
    ) -> str:
        """Start the engine and the endpoint; return the base URL (http://host:port).

        `control_token` guards the checkpoint routes (None: they refuse every call). `lora`: serve the policy as
        these LoRA adapters on the base model, which refits then carry alone (`gpu_workers.vllm_lora`).
        """
        self._cfg = cfg
        self.weight_shapes = checkpoint_shapes(model_dir)
        lora_args = None
        if lora is not None:
            self._lora, lora_args = lora, engine_lora_args(lora)
            self.weight_shapes = adapter_shapes(self.weight_shapes, lora)
            self._adapter_dir = Path(tempfile.mkdtemp(prefix="turnkeep-lora-"))
        # Engine start blocks for ~20 s; a thread keeps this loop (Ray, Temporal) live.
        self._engine = await asyncio.to_thread(build_engine, model_dir, cfg, seed, lora_args=lora_args,
                                               stat_loggers=[stat_logger_factory(self.tally)])
        self._vocab_size = self._engine.model_config.get_vocab_size()
        # The first request pays the engine's lazy setup (its output handler, first batch shapes; on a GPU, more).
        # It runs while the run goes on starting (the environment server, a restore); a weight load waits for it,
        # and a failure refuses calls as a failed load does.
        self._warming = asyncio.create_task(self._warm_up(), name="policy-warm-up")
        app = build_app(self, ControlAuth(control_token), fault_injection=cfg.fault_injection)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, listen_host(cfg.host), cfg.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{advertised_host(cfg.host)}:{port}"
        logger.info("policy server listening on %s", self.url)
        return self.url

    async def _warm_up(self) -> None:
        """The engine's first request; its failure is kept as the engine's state (nothing raises)."""
        try:
            self.tally.add(PROBES, 1)
            await generate(self._engine, [0], 1, 1.0, [], 0)
        except Exception as err:
            self.weights_ok = False
            self.warm_up_error = f"the engine's first request failed: {type(err).__name__}: {err}"
            logger.error("policy engine %d: %s", self.engine, self.warm_up_error)

    async def stop(self) -> None:
        """Stop the endpoint, then the engine (its processes exit with it)."""
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        engine, self._engine = self._engine, None
        if engine is not None:
            await _stop_output_handler(engine)
            await asyncio.to_thread(engine.shutdown)
            # AsyncLLM sits in reference cycles; collect it now, while vLLM's modules
            # are alive, or its __del__ re-runs shutdown at interpreter exit and fails.
            del engine
            gc.collect()
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)

    # -- admission ---------------------------------------------------------------

    def close_admission(self, holder: str, lease_s: float | None = None) -> bool:
        return self.gate.close(holder, lease_s=lease_s)

    def open_admission(self, holder: str) -> bool:
        return self.gate.open(holder)

    async def drain(self, timeout_s: float | None = None) -> int:
        return await self.gate.drain(timeout_s)

    def inflight(self) -> int:
        return self.gate.inflight()

    def refitting(self) -> bool:
        """True while a weight load is under way (a snapshot then waits: the version would change)."""
        return self._refit_lock.locked()

    def health(self) -> dict[str, Any]:
        return {
            "policy_version": self.policy_version,
            "inflight": self.gate.inflight(),
            "admission_open": self.gate.is_open(),
            "holders": self.gate.holders(),
            "weights_ok": self.weights_ok,
            "warm_up_error": self.warm_up_error,
            "engine": self.engine,
            "tokens_generated": self.tokens_generated,
        }

    async def engine_answers(self, timeout_s: float) -> float | None:
        """Seconds the engine core took to generate one token for a probe request outside the admission gate (its
        step progress, not the HTTP front end's): None while it is not asked (stopped, starting, or paused by
        design to load weights for less than `timeout_s`; a refit's drain is asked: a hung core never drains);
        `timeout_s` or more when it did not answer in time and generated no other token meanwhile, or a weight load
        has been under way that long (a core that hangs in the load)."""
        if self._loading_since is not None:
            loading_s = time.monotonic() - self._loading_since
            return loading_s if loading_s >= timeout_s else None
        if self._engine is None or (self._warming is not None and not self._warming.done()):
            return None
        started, generated = time.monotonic(), self.tally.count(GENERATED)
        self.tally.add(PROBES, 1)
        try:
            await asyncio.wait_for(generate(self._engine, [0], 1, 1.0, [], 0, lora_request=self._lora_request),
                                   timeout_s)
        except TimeoutError:
            if self.tally.count(GENERATED) > generated:
                # Busy, not hung: the probe queued behind a full batch (a real model on CPUs) while tokens came.
                return None
            return max(time.monotonic() - started, timeout_s)
        return time.monotonic() - started

    def tally_tokens(self, folder: Path, incarnation: int) -> str:
        """Count this engine's tokens into a file of `folder` for run incarnation `incarnation` from now on."""
        return str(self.tally.start(folder, incarnation, self.engine))

    # -- completions ---------------------------------------------------------------

    def _unavailable(self) -> str:
        return self.warm_up_error or f"weight load after version {self.policy_version} failed; retry it"

    async def complete(self, req: CompletionRequest) -> CompletionResponse:
        """Serve one completion once admitted; stamp it with the generating version."""
        self._check_request(req)
        async with self.gate.admitted():
            if not self.weights_ok:
                raise WeightsUnavailable(self._unavailable())
            version = self.policy_version
            sample = await generate(self._engine, req.prompt, req.max_tokens, req.temperature, req.stop_token_ids,
                                    req.seed, lora_request=self._lora_request)
            if self.policy_version != version:
                # Cannot happen while refits drain first; refuse rather than mislabel.
                raise RuntimeError(f"policy version moved from {version} to {self.policy_version} mid-call")
            self.tokens_generated += len(sample.token_ids)
        choice = CompletionChoice(
            text=sample.text,
            token_ids=sample.token_ids,
            logprobs=CompletionLogprobs(token_logprobs=sample.logprobs),
            finish_reason=sample.finish_reason,
        )
        return CompletionResponse(id=f"cmpl-{uuid.uuid4().hex}", choices=[choice], policy_version=version)

    @contextlib.asynccontextmanager
    async def streaming(self, req: CompletionRequest) -> AsyncIterator[AsyncIterator[CompletionStreamLine]]:
        """Admit one streamed completion: raises (before anything is sent) what `complete` would, then gives the
        lines to send; the call holds its admission until the last one, so a refit waits for it as for any call."""
        self._check_request(req)
        async with self.gate.admitted():
            if not self.weights_ok:
                raise WeightsUnavailable(self._unavailable())
            yield self._stream_lines(req, self.policy_version)

    async def _stream_lines(self, req: CompletionRequest, version: int) -> AsyncIterator[CompletionStreamLine]:
        finish_reason = "length"
        token_ids: list[int] = []
        logprobs: list[float] = []
        last_line = time.monotonic()
        # vLLM reports every few tokens, never more than the line needs; `stream_chunk_s` is checked at each report.
        every = min(req.stream_chunk_tokens, STREAM_STEPS_MAX)
        async for sample in stream_sample(self._engine, req.prompt, req.max_tokens, req.temperature,
                                          req.stop_token_ids, req.seed, every_tokens=every,
                                          lora_request=self._lora_request):
            finish_reason = sample.finish_reason or finish_reason
            self.tokens_generated += len(sample.token_ids)
            token_ids += sample.token_ids
            logprobs += sample.logprobs
            if token_ids and (len(token_ids) >= req.stream_chunk_tokens
                              or time.monotonic() - last_line >= req.stream_chunk_s):
                yield _delta_line(token_ids, logprobs, version)
                token_ids, logprobs, last_line = [], [], time.monotonic()
        if token_ids:
            yield _delta_line(token_ids, logprobs, version)
        yield CompletionStreamLine(finish_reason=finish_reason)

    def _check_request(self, req: CompletionRequest) -> None:
        """Reject what vLLM would reject later, or worse, choke on in its engine loop."""
        assert self._cfg is not None, "server not started"
        if not req.prompt:
            raise RequestError("prompt", "prompt must hold at least one token id")
        _check_ids("prompt", req.prompt, self._vocab_size)
        _check_ids("stop_token_ids", req.stop_token_ids, self._vocab_size)
        room = self._cfg.max_model_len - len(req.prompt)
        if room < 1:
            raise RequestError("prompt", f"prompt has {len(req.prompt)} tokens; max_model_len is {self._cfg.max_model_len}")
        if req.max_tokens > room:
            raise RequestError(
                "max_tokens",
                f"max_tokens {req.max_tokens} + prompt {len(req.prompt)} exceeds max_model_len {self._cfg.max_model_len}",
            )
        if req.seed is not None and not -(2**63) <= req.seed < 2**63:
            raise RequestError("seed", "seed must fit in a signed 64-bit integer")

    # -- weights -------------------------------------------------------------------

    def expect_restore(self) -> None:
        """A new controller re-attached to this server after a crash: its restore may load an older version than
        the one served (the newest snapshot predates the dead controller's last steps), once."""
        self._restore_pending = True

    async def load_weights(self, blob: bytes, version: int, drain_timeout_s: float | None = 120.0) -> float:
        """Load new weights as `version`; return the seconds admission was closed.

        A retry with the current version reloads the same weights (harmless); an
        older version is refused, so a late retry can never roll the policy back,
        except for the one load a restore makes after `expect_restore`.
        """
        if self._warming is not None:
            await asyncio.shield(self._warming)  # the first request runs on the weights it started with
        async with self._refit_lock:
            if self._engine is None:
                raise RuntimeError(f"policy engine {self.engine} is stopped: it cannot load weights")
            if self.warm_up_error is not None:
                raise RuntimeError(f"policy engine {self.engine} cannot load weights: {self.warm_up_error}")
            if version < self.policy_version and not self._restore_pending:
                raise ValueError(f"refusing weights for version {version}: serving {self.policy_version}")
            check_blob(blob, self.weight_shapes)
            started = time.monotonic()
            self.gate.close(REFIT_HOLDER)
            try:
                await self.gate.drain(drain_timeout_s)
                try:
                    self._loading_since = time.monotonic()
                    if self._lora is None:
                        await refit_engine(self._engine, blob)
                    else:
                        self._lora_request = await refit_adapter(self._engine, self._adapter_dir, blob, self._lora)
                except BaseException:
                    # The gate still reopens (no hold outlives its owner), but calls
                    # get 503 until a load succeeds instead of mislabelled tokens.
                    self.weights_ok = False
                    raise
                finally:
                    self._loading_since = None
                self.policy_version = version
                self.weights_ok = True
                self._restore_pending = False
            finally:
                self.gate.open(REFIT_HOLDER)
            closed_s = time.monotonic() - started
            logger.info("loaded policy version %d (admission closed %.3fs)", version, closed_s)
            return closed_s


def _delta_line(token_ids: list[int], logprobs: list[float], version: int) -> CompletionStreamLine:
    return CompletionStreamLine(delta=CompletionDelta(token_ids=token_ids, token_logprobs=logprobs,
                                                      policy_version=version))


def _check_ids(field: str, ids: list[int], vocab_size: int) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise RequestError(field, f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")


async def _stop_output_handler(engine) -> None:
    """Cancel vLLM's output handler before the engine stops. vLLM stops the engine core first and cancels the
    handler after, so the handler finds the core gone and logs EngineDeadError with a traceback on every clean
    exit of a run."""
    handler = getattr(engine, "output_handler", None)
    if handler is None or handler.done() or handler.get_loop() is not asyncio.get_running_loop():
        return
    handler.cancel()
    await asyncio.gather(handler, return_exceptions=True)
