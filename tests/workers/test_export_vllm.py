"""An exported folder loads into vLLM as it is (the engine the policy server builds, `gpu_workers.vllm_engine`), and
vLLM's prompt logprobs are the trainer's for that checkpoint.

Tolerance: vLLM's CPU kernels (its own attention, fused norms and activations) add the same float32 terms in other
orders than transformers' eager model; the refit tests bound that at 1e-3 (measured about 1e-6 here). The training
step moved these logprobs by more than 1e-2 (asserted in test_export.py), so weights that were not the checkpoint's
break the bound."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest
import torch

from tests.workers.export_runs import make_run
from turnkeep.cli.main import main

pytestmark = pytest.mark.integration
TOLERANCE = 1e-3


async def vllm_prompt_logprobs(folder: Path, ids: list[int]) -> torch.Tensor:
    """vLLM's logprobs of `ids[1:]` as a prompt, from an engine started on `folder`."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from turnkeep.gpu_workers.vllm_engine import build_engine
    from turnkeep.schemas.config_services import PolicyServerConfig

    cfg = PolicyServerConfig(kv_cache_memory_bytes=16 * 1024 * 1024, max_model_len=64, max_num_seqs=4)
    engine = await asyncio.to_thread(build_engine, folder, cfg, 0, "float32")
    try:
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for output in engine.generate(TokensPrompt(prompt_token_ids=ids), params, "export-check"):
            final = output
    finally:
        await asyncio.to_thread(engine.shutdown)
        del engine
        gc.collect()  # while vLLM's modules are alive (see PolicyServer.stop)
    assert final is not None and final.prompt_logprobs is not None
    return torch.tensor([step[token].logprob for token, step in zip(ids[1:], final.prompt_logprobs[1:])])


def test_an_export_loads_into_vllm_with_the_trainers_prompt_logprobs(tmp_path):
    run = make_run(tmp_path / "run")
    out = tmp_path / "hf"
    assert main(["export", "--run-dir", str(run.run_dir), "--out", str(out)]) == 0
    logprobs = asyncio.run(vllm_prompt_logprobs(out, run.prompt_ids))
    difference = (logprobs - run.logprobs).abs().max().item()
    print(f"vLLM prompt logprobs of the export vs the trainer's: max abs difference {difference:.3g}")
    assert len(logprobs) == len(run.prompt_ids) - 1
    assert difference < TOLERANCE
