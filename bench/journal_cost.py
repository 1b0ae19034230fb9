"""`turnkeep bench journal_cost`: what streaming and journaling a turn's tokens costs, rollouts alone.

One policy server (vLLM behind its HTTP endpoint, as a run starts it) on the long-turn config's
model, and no trainer: the run-level pairs of `bench partial_turns` move by a few percent from
run to run with the trainer's timing, more than the cost they look for. Here rounds of
`--agents` turns at once alternate between the two levels' code paths of the environment server:

- `turn`: one answer per turn (`PolicyClient.complete`), its boundary journaled;
- `token`: the turn streamed in chunks (`StreamedTurn`, `TurnProgress`), each chunk journaled and
  audited as it comes, then its boundary.

Both keep a real turn journal and audit log on disk, made durable every `env.journal_flush_s`.
No turn has a stop token, so every turn is exactly `--tokens` long at both levels: the same
work for the engine. (Per-request seeds would make the tokens equal too, but vLLM's CPU backend
fails a seeded request whose prefill is split across steps: "CPU Generator does not use offset".)
The clients run in a process of their own, as the environment server does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import aiohttp
import psutil

from turnkeep.bench.report import BenchResult, markdown_table

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "long_turns.toml"
LEVELS = ("turn", "token")
PROMPT_TOKENS = 48
SIDES = ("client_cpu_per_ktok", "front_cpu_per_ktok", "engine_cpu_per_ktok")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="default: configs/long_turns.toml")
    parser.add_argument("--pairs", type=int, default=8, help="alternating turn/token rounds (default 8)")
    parser.add_argument("--agents", type=int, default=64, help="turns generated at once (default 64)")
    parser.add_argument("--tokens", type=int, default=192, help="tokens of each turn (default 192)")
    parser.add_argument("--turns", type=int, default=8, help="turns of each agent in a round, one after another "
                        "(default 8)")


def summary(rounds: list[dict[str, dict]]) -> tuple[str, dict, dict]:
    """The table, the token/turn throughput ratio within each pair (median, low, high) and each side's median CPU
    seconds per 1,000 tokens at each level."""
    ratios = [pair["token"]["tokens_per_s"] / pair["turn"]["tokens_per_s"] for pair in rounds]
    rows = [[p + 1, f"{pair['turn']['tokens_per_s']:,.0f}", f"{pair['token']['tokens_per_s']:,.0f}", f"{ratio:.3f}",
             *(f"{pair['turn'][side]:.3f} / {pair['token'][side]:.3f}" for side in SIDES)]
            for p, (pair, ratio) in enumerate(zip(rounds, ratios))]
    spread = {"median": round(statistics.median(ratios), 4), "low": round(min(ratios), 4),
              "high": round(max(ratios), 4)}
    medians = {level: {side: statistics.median(pair[level][side] for pair in rounds) for side in SIDES}
               for level in LEVELS}
    rows.append(["median (low-high)", "", "", f"{spread['median']:.3f} ({spread['low']:.3f}-{spread['high']:.3f})",
                 *(f"{medians['turn'][side]:.3f} / {medians['token'][side]:.3f}" for side in SIDES)])
    table = markdown_table(["pair", "turn tok/s", "token tok/s", "token / turn",
                            "clients CPU s per 1k tok (turn / token)", "policy server process",
                            "vLLM engine core"], rows)
    return table, spread, medians


def run(args: argparse.Namespace) -> BenchResult:
    from turnkeep.config.loader import load_config, parse_overrides

    cfg = load_config(args.config, parse_overrides(args.set))
    rounds = asyncio.run(_measure(cfg, args))
    from turnkeep.gpu_workers.policy_server import STREAM_STEPS_MAX  # vLLM is imported by now

    table, spread, medians = summary(rounds)
    notes = [
        f"Rounds of {args.agents} agents at once, each {args.turns} turns of {args.tokens} tokens one after another, "
        "on one policy server (no trainer), "
        f"alternating `turn` (whole turns) and `token` (streamed, journaled every {cfg.env.journal_partial_tokens} "
        f"tokens or {cfg.env.journal_partial_s} s), in that order in odd pairs and the other in even ones; every "
        "turn is exactly that long at both levels (no stop token). Both journal boundaries and audit lines on disk, "
        f"durable every {cfg.env.journal_flush_s} s.",
        "CPU seconds per 1,000 tokens, per process: the clients (the environment server's part: the calls, the "
        "journal, the audit log), the policy server's process (its HTTP endpoint and vLLM's front end), vLLM's "
        "engine core (the model). The engine core, the bottleneck, computes the same tokens at both levels; what "
        "streaming adds runs in the other two, which on this machine share the second core with it (and with the "
        "trainer, in a run). vLLM hands a streamed turn's tokens over at most "
        f"{STREAM_STEPS_MAX} at a time (`gpu_workers.policy_server.STREAM_STEPS_MAX`).",
        "What this leaves out: the agents' environments and the trainer, which both levels run alike.",
    ]
    data = {"pairs": rounds, "ratio": spread, "cpu_per_ktok_median": medians, "agents": args.agents,
            "tokens": args.tokens, "turns": args.turns}
    return BenchResult("journal_cost", table, data, notes)


async def _measure(cfg, args: argparse.Namespace) -> list[dict[str, dict]]:
    from turnkeep.gpu_workers.policy_server import PolicyServer
    from turnkeep.workers.model_maker import tiny_model_dir

    model_dir = tiny_model_dir(cfg)
    policy_cfg = cfg.policy.model_copy(update={"max_num_seqs": max(cfg.policy.max_num_seqs, args.agents),
                                               "port": 0, "host": "127.0.0.1"})
    server = PolicyServer()
    url = await server.start(model_dir, policy_cfg, seed=cfg.run.seed)
    limits = {"every_tokens": cfg.env.journal_partial_tokens, "every_s": cfg.env.journal_partial_s,
              "flush_s": cfg.env.journal_flush_s, "agents": args.agents, "tokens": args.tokens, "turns": args.turns,
              "temperature": cfg.rollout.temperature, "vocab": server._vocab_size}
    pairs: list[dict[str, dict]] = []
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as clients:
            client = await asyncio.get_running_loop().run_in_executor(clients, os.getpid)
            await _timed_round(clients, client, url, "turn", -1, limits)  # warms both sides
            for pair in range(args.pairs):
                order = LEVELS if pair % 2 == 0 else tuple(reversed(LEVELS))
                figures = {level: await _timed_round(clients, client, url, level, pair, limits) for level in order}
                print(f"bench journal_cost: pair {pair + 1}: " + ", ".join(
                    f"{level} {figures[level]['tokens_per_s']:,.0f} tok/s" for level in LEVELS), flush=True)
                pairs.append(figures)
    finally:
        await server.stop()
    return pairs


async def _timed_round(clients: ProcessPoolExecutor, client: int, url: str, level: str, pair: int,
                       limits: dict) -> dict:
    """One round's tokens/s and the CPU seconds per 1,000 tokens of each side: the clients (the environment
    server's part, process `client`), the policy server's process (HTTP, vLLM's front end) and vLLM's engine core
    (this process's other children)."""

    front = psutil.Process()
    cores = [c for c in front.children(recursive=True) if c.pid != client]
    before = _cpu(front), sum(_cpu(c) for c in cores)
    tokens, elapsed, client_cpu = await asyncio.get_running_loop().run_in_executor(
        clients, _round_in_process, url, level, pair, limits)
    after = _cpu(front), sum(_cpu(c) for c in cores)
    per_k = 1000 / tokens
    return {"tokens_per_s": round(tokens / elapsed, 1), "client_cpu_per_ktok": round(client_cpu * per_k, 5),
            "front_cpu_per_ktok": round((after[0] - before[0]) * per_k, 5),
            "engine_cpu_per_ktok": round((after[1] - before[1]) * per_k, 5)}


def _cpu(process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _round_in_process(url: str, level: str, pair: int, limits: dict) -> tuple[int, float, float]:
    began = time.process_time()
    tokens, elapsed = asyncio.run(_round(url, level, pair, limits))
    return tokens, elapsed, time.process_time() - began


async def _round(url: str, level: str, pair: int, limits: dict) -> tuple[int, float]:
    """Tokens and wall seconds of one round: every agent's turns at once, through the level's code path."""


    from turnkeep.envs.policy_client import PolicyClient
    from turnkeep.primitives.audit_log import AuditLog

    with tempfile.TemporaryDirectory(prefix="tk-journal-cost-") as folder:
        audit = AuditLog(Path(folder) / "audit.jsonl", incarnation=1)
        journal = _journal(Path(folder) / "journal", audit)
        flusher = asyncio.create_task(journal.flush_forever(limits["flush_s"]))
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                policy = PolicyClient(url, session)
                rng = random.Random(pair)
                prompts = [[rng.randrange(3, limits["vocab"]) for _ in range(PROMPT_TOKENS)]
                           for _ in range(limits["agents"])]
                began = time.monotonic()
                counts = await asyncio.gather(*(_agent(policy, journal, audit, level, pair, agent, prompt, limits)
                                                for agent, prompt in enumerate(prompts)))
                elapsed = time.monotonic() - began
        finally:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
            await journal.sync()
            journal.close()
            audit.flush()
    return sum(counts), elapsed


def _journal(directory: Path, audit):
    from turnkeep.envs.turn_audit import audit_tokens_durable
    from turnkeep.envs.turn_journal import TurnJournal

    return TurnJournal(directory, "bench", before_sync=audit.flush,
                       tokens_durable=lambda durable: audit_tokens_durable(audit, durable))


async def _agent(policy, journal, audit, level: str, pair: int, agent: int, prompt: list[int], limits: dict) -> int:
    """One agent's turns, one after another, each from the same prompt; returns the tokens generated."""
    from turnkeep.schemas.rollout import Problem, RolloutRequest, Segment, TurnBoundary

    request = RolloutRequest(rollout_id=f"g{pair}.{agent}.0", group_id=f"g{pair}", sibling=agent, attempt=0,
                             incarnation=1, problem=Problem(question="bench", answer=0))
    segments = [Segment(kind="prompt", token_ids=prompt)]
    journal.committed(request, TurnBoundary(rollout_id=request.rollout_id, turn_index=0, segments=segments),
                      None, False)
    generated = 0
    for turn in range(limits["turns"]):
        segment = await _turn(policy, journal, audit, level, request, turn, prompt, limits)
        segments.append(segment)
        generated += len(segment.token_ids)
        done = turn + 1 == limits["turns"]
        journal.committed(request, TurnBoundary(rollout_id=request.rollout_id, turn_index=turn + 1,
                                                segments=list(segments), done=done), None, done)
    return generated


async def _turn(policy, journal, audit, level: str, request, turn_index: int, prompt: list[int], limits: dict):
    """One turn through the environment server's code path at `level` (its tokens journaled as they stream at
    `token`); returns its policy segment."""
    from turnkeep.envs.turn_audit import audit_chunk
    from turnkeep.envs.turn_progress import TurnProgress
    from turnkeep.schemas.policy import CompletionRequest
    from turnkeep.schemas.rollout import Segment

    call = CompletionRequest(prompt=prompt, max_tokens=limits["tokens"], temperature=limits["temperature"],
                             stream_chunk_tokens=limits["every_tokens"],
                             stream_chunk_s=limits["every_s"])
    if level == "token":
        progress = TurnProgress(call, None, request.rollout_id, turn_index, limits["every_tokens"],
                                limits["every_s"], journal=journal,
                                on_chunk=lambda *chunk: audit_chunk(audit, request, *chunk))
        await policy.stream(progress.turn, rollout_id=request.rollout_id)
        return progress.turn.segment()
    choice = (await policy.complete(call, rollout_id=request.rollout_id)).choices[0]
    return Segment(kind="policy", token_ids=choice.token_ids, logprobs=choice.logprobs.token_logprobs, policy_version=0)
