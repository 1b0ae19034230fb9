"""Supervised warm start of the made-up model, and a plain-torch measure of its reward.

The warm start trains on the source's conversations (`transcripts.py`: synthetic calc
transcripts, a share of them deliberately wrong, or an environment's demonstrations)
with the loss on the policy's own lines only (calc: "C ..." and "A ...", newline
included, so the model learns where a turn stops). The question and tool replies are
context, never targets, exactly as in RL where only policy segments are trained on. The model must
first learn to copy operands, which takes several hundred steps at this size; the
imperfect transcripts then keep it often wrong, so RL has something to learn.

`rollout_reward` samples whole multi-turn rollouts at temperature 1.0 the way the
environment does (bos, question line, then turn by turn: generate until the newline
token, feed the observation back) and returns the mean reward: the starting point to
report before RL. The source's `episodes` say how to play (the calculator's, for the
default task).
"""

from __future__ import annotations

import logging
import math
import random
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM

from turnkeep.gpu_workers.tiny_model.tokenizer import encode, newline_id, special_ids
from turnkeep.gpu_workers.tiny_model.transcripts import Episodes, TranscriptSource
from turnkeep.schemas.config import TinyModelConfig

log = logging.getLogger("turnkeep.model")

WARM_START_THREADS = 2
"""Fixed, so the weights do not depend on the caller's thread setting (same inputs, same bytes)."""
MAX_TURN_TOKENS = 16
IGNORE = -100  # label value the Hugging Face loss skips


def warm_start(
    model: LlamaForCausalLM, tok: Tokenizer, tiny: TinyModelConfig, source: TranscriptSource, seed: int
) -> None:
    """Train `model` in place for `tiny.warm_start_steps` supervised steps on `source`'s conversations."""
    if tiny.warm_start_steps == 0:
        return
    rng = random.Random(f"turnkeep-warm-start-{seed}")
    opt = torch.optim.AdamW(model.parameters(), lr=tiny.warm_start_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(tiny.warm_start_steps))
    model.train()
    with torch_threads(WARM_START_THREADS):
        for step in range(1, tiny.warm_start_steps + 1):
            loss = model(**_batch(tok, tiny, source, rng, seed)).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if step % 100 == 0 or step == tiny.warm_start_steps:
                log.info("warm start step %d/%d loss %.4f", step, tiny.warm_start_steps, loss.item())
    model.eval()


def rollout_reward(
    model: LlamaForCausalLM, tok: Tokenizer, episodes: Episodes, n: int, seed: int, max_turns: int = 6
) -> float:
    """Mean reward of `n` rollouts of `episodes`, sampled in lockstep as one batch."""
    if n == 0:
        return 0.0
    rng = random.Random(f"turnkeep-eval-{seed}")
    gen = torch.Generator().manual_seed(seed)
    bos = special_ids(tok)["bos_token_id"]
    rollouts = [_Rollout(problem, [bos] + encode(tok, first_line + "\n"))
                for first_line, problem in episodes.prompts(rng, n)]
    max_len = model.config.max_position_embeddings
    with torch_threads(WARM_START_THREADS), torch.inference_mode():
        while active := [r for r in rollouts if not r.done]:
            for r, token in zip(active, _sample_next(model, [r.ids for r in active], gen)):
                _advance(r, token, tok, episodes, max_turns, max_len)
    return sum(episodes.score(r.problem, r.turns) for r in rollouts) / n


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with `n` intra-op threads, then restore the caller's setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _schedule(steps: int):
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        # Linear warmup, then cosine down to 10%: a constant 3e-3 is noisy at the end.
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    return factor


def _batch(
    tok: Tokenizer, tiny: TinyModelConfig, source: TranscriptSource, rng: random.Random, seed: int
) -> dict[str, torch.Tensor]:
    texts = source.batch(rng, tiny.warm_start_batch_size, tiny.warm_start_error_rate)
    source.check_covered(texts, seed)
    rows = [_row(tok, text, tiny.max_position_embeddings, source) for text in texts]
    return _pad(rows, special_ids(tok)["pad_token_id"])


def _row(tok: Tokenizer, transcript: str, max_len: int, source: TranscriptSource) -> tuple[list[int], list[int]]:
    """Input ids and labels: bos, then each line encoded alone (as the env builds them)."""
    ids, labels = [special_ids(tok)["bos_token_id"]], [IGNORE]
    for index, line in enumerate(_lines(transcript)):
        line_ids = encode(tok, line)
        ids += line_ids
        labels += line_ids if source.is_policy_line(index, line) else [IGNORE] * len(line_ids)
    return ids[:max_len], labels[:max_len]


def _lines(text: str) -> list[str]:
    """The lines of `text`, each with its "\\n" (only "\\n" ends a line, as in the environment's protocol)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _pad(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = [r[0] + [pad_id] * (width - len(r[0])) for r in rows]
    labels = [r[1] + [IGNORE] * (width - len(r[1])) for r in rows]
    mask = [[1] * len(r[0]) + [0] * (width - len(r[0])) for r in rows]
    return {
        "input_ids": torch.tensor(ids),
        "labels": torch.tensor(labels),
        "attention_mask": torch.tensor(mask),
    }


@dataclass
class _Rollout:
    problem: object
    ids: list[int]
    turn: list[int] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)
    done: bool = False


def _sample_next(model: LlamaForCausalLM, seqs: list[list[int]], gen: torch.Generator) -> list[int]:
    # Right padding: causal attention keeps pads from touching real positions, so the
    # logits at each row's last real token need no mask or position shift.
    lengths = torch.tensor([len(s) for s in seqs])
    batch = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = torch.tensor(s)
    logits = model(input_ids=batch).logits[torch.arange(len(seqs)), lengths - 1]
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1).tolist()


def _advance(r: _Rollout, token: int, tok: Tokenizer, episodes: Episodes, max_turns: int, max_len: int) -> None:
    r.ids.append(token)
    r.turn.append(token)
    ended = token == newline_id(tok)
    if not ended and len(r.turn) < MAX_TURN_TOKENS and len(r.ids) < max_len:
        return
    text = tok.decode(r.turn, skip_special_tokens=False)
    r.turns.append(text)
    r.turn = []
    reply = episodes.reply(text)
    if not ended or reply is None or len(r.turns) >= max_turns:
        r.done = True  # a turn cut off without its newline ends the rollout
        return
    r.ids += encode(tok, reply)
    r.done = len(r.ids) >= max_len
