"""Load new weights into a running vLLM engine, in place, without a restart.

`reload_weights_in_worker` is a module-level function so that it pickles by
reference; vLLM runs it inside its worker process with the worker as first
argument. The weights arrive as safetensors bytes (see `weights_blob`).

Two CPU-specific facts (DESIGN, "Machine notes"):
- `model.load_weights` called directly fails on CPU; the worker's
  `reload_weights(weights_iterator=...)` goes through vLLM's layerwise reload,
  which restores the kernel layout after loading.
- the CPU backend prepacks `lm_head` into its own buffer. With tied embeddings the
  reload writes `embed_tokens` (the shared weight) but nothing repacks `lm_head`, so
  sampling keeps the OLD output layer until `process_weights_after_loading` runs.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from turnkeep.gpu_workers.weights_blob import iter_tensors

logger = logging.getLogger("turnkeep.vllm_refit")


def _repack_output_layer(model: torch.nn.Module) -> None:
    lm_head = getattr(model, "lm_head", None)
    quant_method = getattr(lm_head, "quant_method", None)
    if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
        quant_method.process_weights_after_loading(lm_head)


def _abandon_reload(worker: Any) -> None:
    """Close a reload that failed half-way so that the next one can start clean.

    vLLM's layerwise reload keeps per-layer progress; after an exception it stays
    "in progress" and every later reload fails too. Finalizing puts the old kernel
    tensors back where nothing was loaded. The model is then a mix of versions:
    the server refuses to serve until a reload succeeds.
    """
    from vllm.config import set_current_vllm_config  # vLLM only inside the engine process
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    try:
        with set_current_vllm_config(worker.vllm_config):
            finalize_layerwise_reload(worker.model_runner.get_model(), worker.model_config)
    except Exception:
        logger.exception("could not reset vLLM's layerwise reload state")


def reload_weights_in_worker(worker: Any, blob: bytes) -> None:
    """Runs in vLLM's worker process: load `blob` into the model in place."""
    try:
        worker.reload_weights(weights_iterator=iter_tensors(bytes(blob)))
    except BaseException:
        _abandon_reload(worker)
        raise
    # Harmless for untied models (it repacks what was just loaded); needed for
    # tied ones, where the prepacked lm_head would otherwise stay stale.
    with torch.inference_mode():
        _repack_output_layer(worker.model_runner.get_model())


async def refit_engine(engine: Any, blob: bytes) -> None:
    """Pause the engine, load `blob` into every worker, clear caches, resume.

    Mode "wait" lets requests already inside the engine finish on the old weights
    (none are lost, none straddle two versions; "keep" would freeze them and
    finish them on the new weights, "abort" would drop them). clear_cache drops
    the prefix cache, whose KV blocks were computed with the old weights.
    """
    await engine.pause_generation(mode="wait", clear_cache=True)
    try:
        await engine.collective_rpc(reload_weights_in_worker, args=(blob,))
    finally:
        await engine.resume_generation()
