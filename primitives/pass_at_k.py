"""pass@k from n samples per prompt, without bias (Chen et al., 2021: 1 - C(n-c, k) / C(n, k) averaged over
prompts), for every k the samples can estimate (k <= n)."""

from __future__ import annotations

from math import comb


def pass_at_k(correct: list[int], samples: int, k: int) -> float:
    """Mean over prompts of the chance that k of the `samples` drawn for it hold a correct one; `correct[i]`: how
    many of prompt i's samples were correct."""
    if not 1 <= k <= samples:
        raise ValueError(f"pass@{k} needs 1 <= k <= samples ({samples})")
    if not correct:
        raise ValueError("pass@k of no prompts")
    return sum(1.0 - comb(samples - c, k) / comb(samples, k) for c in correct) / len(correct)


def estimable_ks(samples: int) -> list[int]:
    """The k reported for `samples` samples a prompt: 1, then powers of two, then `samples` itself."""
    ks = {1, samples}
    k = 2
    while k < samples:
        ks.add(k)
        k *= 2
    return sorted(ks)


def correct_counts(rewards: list[list[float]], correct_at: float) -> list[int]:
    """Per prompt, how many of its samples' rewards are at least `correct_at`."""
    return [sum(reward >= correct_at for reward in per_prompt) for per_prompt in rewards]


def summarize(rewards: list[list[float]], samples: int, correct_at: float) -> dict[str, float]:
    """Mean reward and pass@k (every estimable k) of `samples` rewards per prompt; correct: reward >= correct_at."""
    correct = correct_counts(rewards, correct_at)
    mean = sum(map(sum, rewards)) / max(1, sum(map(len, rewards)))
    return {"mean_reward": round(mean, 4),
            **{f"pass@{k}": round(pass_at_k(correct, samples, k), 4) for k in estimable_ks(samples)}}
