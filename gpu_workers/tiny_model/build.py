"""Make the made-up tiny policy model once and cache it as a Hugging Face directory.

No model can be downloaded here, so the project makes its own: a tokenizer trained on
the conversations of the transcript source it is handed (the default task's, or an
environment's demonstrations, `[model.tiny] demonstrations`; see `transcripts.py`), a small Llama (`LlamaForCausalLM`, so vLLM and transformers both
load it), a supervised warm start, saved as config.json + model.safetensors +
generation_config.json + tokenizer files.

The cache directory is keyed by a hash of everything that shapes the weights (the tiny
model's config, the seed, `FORMAT_VERSION` and the source's own recipe: the task config
for the default task; for demonstrations, the environment's entry, its options and a
digest of its conversations), so the same inputs always give the same directory, and the same bit-identical
weights. The model is built
into a staging directory, fsynced, then renamed into place (`primitives.atomic_files`)
under a file lock: a crash leaves at most a stale staging directory (removed by the
next build of that key), never a half-made model at the final path, and a concurrent
caller waits on the lock, then reuses the finished directory.
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from turnkeep.gpu_workers.tiny_model.model_files import check_model_files
from turnkeep.gpu_workers.tiny_model.recipe import RECIPE_FILE, Recipe
from turnkeep.gpu_workers.tiny_model.tokenizer import save_tokenizer, special_ids, train_tokenizer
from turnkeep.gpu_workers.tiny_model.transcripts import TOKENIZER_CORPUS, TranscriptSource
from turnkeep.gpu_workers.tiny_model.warm_start import rollout_reward, warm_start
from turnkeep.primitives.atomic_files import STAGING_PREFIX, publish_dir, staging_dir
from turnkeep.schemas.config import ModelConfig, TinyModelConfig

log = logging.getLogger("turnkeep.model")

EVAL_ROLLOUTS = 128
"""Rollouts sampled after the warm start to log the starting reward."""


def ensure_tiny_model(
    model_cfg: ModelConfig, source: TranscriptSource, seed: int, *, eval_rollouts: int = EVAL_ROLLOUTS
) -> Path:
    """The model directory to use: `model_cfg.path` if set, else the cached tiny model made from `source`'s
    conversations (`workers.model_maker` picks it from the config).

    `eval_rollouts` rollouts measure the starting reward once, when the model is made
    (logged and stored in turnkeep_tiny.json); 0 skips that, and so does a source that
    cannot be played (`source.episodes` is None).
    """
    if model_cfg.path is not None:
        return check_model_files(Path(model_cfg.path).expanduser())
    recipe = Recipe(model_cfg.tiny, source, seed)
    cache = model_cfg.cache_dir.expanduser()
    final = cache / f"tiny-{recipe.key()}"
    if final.is_dir():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f"{final.name}.lock"):
        if final.is_dir():  # another process built it while we waited
            return final
        _build_atomically(final, recipe, eval_rollouts)
    return final


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_atomically(final: Path, recipe: Recipe, eval_rollouts: int) -> None:
    # Only the lock holder gets here, so a staging directory of this key is left over
    # from a crashed build (other keys' builds may be live: leave theirs alone).
    for stale in final.parent.glob(f"{STAGING_PREFIX}{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = staging_dir(final.parent, final.name)
    try:
        _make_model_dir(staging, recipe, eval_rollouts)
        publish_dir(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("tiny model cached at %s", final)


def _make_model_dir(out: Path, recipe: Recipe, eval_rollouts: int) -> None:
    started = time.monotonic()
    source = recipe.source
    log.info("making the tiny model (seed %d) from %s conversations in %s", recipe.seed, source.name, out)
    tok = train_tokenizer(source.tokenizer_corpus(recipe.seed, TOKENIZER_CORPUS), source.alphabet(recipe.seed),
                          getattr(source, "added_tokens", ()))
    model = _init_model(recipe.tiny, tok, recipe.seed)
    warm_start(model, tok, recipe.tiny, source, recipe.seed)
    model.save_pretrained(out)
    save_tokenizer(tok, out, recipe.tiny.max_position_embeddings, source.chat_template)
    reward = None
    if source.episodes is None:
        if eval_rollouts:
            log.info("starting reward not measured: %s's conversations come with no rules to play them", source.name)
        eval_rollouts = 0
    elif eval_rollouts:
        reward = rollout_reward(model, tok, source.episodes, eval_rollouts, recipe.seed)
    seconds = time.monotonic() - started
    log.info("tiny model made in %.1f s; starting reward %s (%d rollouts)", seconds, reward, eval_rollouts)
    summary = {"starting_reward": reward, "starting_reward_rollouts": eval_rollouts}
    (out / RECIPE_FILE).write_text(json.dumps(recipe.as_json() | summary, indent=2) + "\n")


def _init_model(tiny: TinyModelConfig, tok: Tokenizer, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_kv_heads or tiny.num_heads,
        head_dim=tiny.head_dim,
        max_position_embeddings=tiny.max_position_embeddings,
        tie_word_embeddings=False,
        dtype="float32",
        **special_ids(tok),
    )
    # Fork the global RNG so making the model neither depends on nor disturbs the caller's.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**special_ids(tok))
    return model
