"""Fixtures for the policy server tests: a tiny random model and ONE shared engine.

Starting a vLLM engine costs about 20 s of the machine's two cores, so the whole
session shares one PolicyServer. It lives on an event loop in a background thread;
tests hand coroutines to it with `loop.run(coro)`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

T = TypeVar("T")

# Every character is its own token, like the project's own task vocabulary.
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = list("0123456789+-=*/() QA?:abcdefgh")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def build_tokenizer(out_dir: Path) -> None:
    """A character-level WordLevel tokenizer saved as PreTrainedTokenizerFast."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(out_dir)


def build_tiny_llama(out_dir: Path, seed: int = 0) -> Path:
    """A random Llama (hidden 128, 2 layers, 4 heads of 32) with tied embeddings."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir)
    config = LlamaConfig(
        vocab_size=len(SPECIALS) + len(CHARS),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        # A wide init gives peaked next-token distributions, so a stale output
        # layer after a refit moves logprobs far beyond the test's tolerance.
        initializer_range=0.2,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(out_dir)
    return out_dir


class LoopThread:
    """An asyncio loop on a daemon thread, so session fixtures can own async objects."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="session")
def policy_server(loop: LoopThread, tiny_model_dir: Path) -> Iterator[Any]:
    from turnkeep.gpu_workers.policy_server import PolicyServer
    from turnkeep.schemas.config_services import PolicyServerConfig

    server = PolicyServer()
    cfg = PolicyServerConfig(kv_cache_memory_bytes=16 * 1024 * 1024, max_model_len=256, max_num_seqs=16)
    loop.run(server.start(tiny_model_dir, cfg), timeout=300)
    yield server
    loop.run(server.stop(), timeout=60)
