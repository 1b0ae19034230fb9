"""Load new weights into a running vLLM engine, in place, without a restart.

The trainer's state dict travels as safetensors bytes: `collective_rpc` arguments
go through msgpack, where tensors arrive as nested lists, while bytes arrive intact.
`reload_weights_in_worker` is a module-level function so that it pickles by
reference; vLLM runs it inside its worker process with the worker as first argument.

Two CPU-specific facts (DESIGN, "Machine notes"):
- `model.load_weights` called directly fails on CPU; the worker's
  `reload_weights(weights_iterator=...)` goes through vLLM's layerwise reload,
  which restores the kernel layout after loading.
- the CPU backend prepacks `lm_head` into its own buffer. With tied embeddings the
  reload writes `embed_tokens` (the shared weight) but nothing repacks `lm_head`, so
  sampling keeps the OLD output layer until `process_weights_after_loading` runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save


def pack_state_dict(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    """Serialize a state dict for the refit, keeping one name per shared tensor.

    safetensors refuses aliased tensors; tied models alias `lm_head.weight` to
    `model.embed_tokens.weight`, and vLLM loads the tie from the embedding name
    (which comes first in a Hugging Face state dict).
    """
    seen: set[tuple[int, torch.Size]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.shape)
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().to("cpu").contiguous()
    return st_save(out)


def _iter_tensors(blob: bytes) -> Iterator[tuple[str, torch.Tensor]]:
    yield from st_load(blob).items()


def _repack_output_layer(model: torch.nn.Module) -> None:
    lm_head = getattr(model, "lm_head", None)
    quant_method = getattr(lm_head, "quant_method", None)
    if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
        quant_method.process_weights_after_loading(lm_head)


def reload_weights_in_worker(worker: Any, blob: bytes) -> None:
    """Runs in vLLM's worker process: load `blob` into the model in place."""
    worker.reload_weights(weights_iterator=_iter_tensors(bytes(blob)))
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
