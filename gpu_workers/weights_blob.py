"""The weights a refit carries: a state dict as safetensors bytes, and its checks.

Bytes, because `collective_rpc` arguments go through msgpack, where tensors arrive
as nested lists. The checks run in the policy server's own process before the
engine is touched: a blob that does not fit the model fails there, cheaply, instead
of half-way through a layerwise reload inside vLLM's worker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

Shapes = dict[str, tuple[int, ...]]
# vLLM ignores lm_head.weight for tied models, and a tied checkpoint lacks it.
OPTIONAL_NAMES = frozenset({"lm_head.weight"})


def pack_state_dict(state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> bytes:
    """Serialize a state dict (cast to `dtype` where given), keeping one name per shared tensor.

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
        out[name] = tensor.detach().to(dtype=dtype or tensor.dtype).to("cpu").contiguous()
    return st_save(out)


def iter_tensors(blob: bytes) -> Iterator[tuple[str, torch.Tensor]]:
    yield from st_load(blob).items()


def header_shapes(data: bytes) -> Shapes:
    """Tensor names and shapes from a safetensors header (`data` may be just its prefix)."""
    if len(data) < 8:
        raise ValueError(f"weights blob of {len(data)} bytes is not safetensors")
    size = int.from_bytes(data[:8], "little")
    if not 2 <= size <= len(data) - 8:
        raise ValueError("weights blob is not safetensors (bad header length)")
    try:
        header = json.loads(data[8 : 8 + size])
    except ValueError as exc:
        raise ValueError(f"weights blob is not safetensors: {exc}") from None
    return {name: tuple(meta["shape"]) for name, meta in header.items() if name != "__metadata__"}


def checkpoint_shapes(model_dir: str | Path) -> Shapes | None:
    """Names and shapes of the model directory's safetensors files (None: no such files)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    shapes: Shapes = {}
    for path in files:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            f.seek(0)
            shapes.update(header_shapes(f.read(8 + size)))
    return shapes


def check_blob(blob: bytes, expected: Shapes | None) -> int:
    """Raise ValueError naming what does not fit the model; return the tensor count."""
    shapes = header_shapes(blob)
    if not shapes:
        raise ValueError("weights blob holds no tensors")
    if expected is None:
        return len(shapes)
    unknown = sorted(set(shapes) - set(expected) - OPTIONAL_NAMES)
    if unknown:
        raise ValueError(f"weights blob has tensors the model lacks: {unknown[:5]}")
    missing = sorted(set(expected) - set(shapes) - OPTIONAL_NAMES)
    if missing:
        # A partial load would leave the missing layers at the old version.
        raise ValueError(f"weights blob lacks tensors of the model: {missing[:5]}")
    wrong = [f"{n} {shapes[n]} != {expected[n]}" for n in sorted(shapes) if n in expected and shapes[n] != expected[n]]
    if wrong:
        raise ValueError(f"weights blob has wrong shapes: {wrong[:5]}")
    return len(shapes)
