"""One trainer group of N ranks timed on its own, on a Ray of this process: train steps on synthetic rows, the
refit's gather of the whole model, a checkpoint's save and load, and each rank's peak memory."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import orjson
import psutil

from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.schemas.rollout import RolloutRow, Segment


def synthetic_rows(count: int, length: int, vocab: int, seed: int) -> list[dict]:
    """`count` rows in groups of two, `length` tokens each, half of them policy tokens."""
    rows = []
    for i in range(count):
        prompt = [1] + [3 + (i + t + seed) % (vocab - 3) for t in range(length // 2 - 1)]
        policy = [3 + (i * t + seed) % (vocab - 3) for t in range(length - len(prompt))]
        rows.append(RolloutRow(
            group_id=f"b{seed}g{i // 2}", sibling=i % 2, attempt=0, reward=float((i + seed) % 2), num_turns=1,
            segments=[Segment(kind="prompt", token_ids=prompt),
                      Segment(kind="policy", token_ids=policy, logprobs=[-1.5] * len(policy), policy_version=0)],
        ).model_dump())
    return rows


def _pid_of(actor) -> int:
    return os.getpid()


def time_group(cfg: TurnkeepConfig, model_dir: Path, ranks: int, steps: int, rows: int, length: int,
               vocab: int, copies: bool = False) -> dict:
    """Figures of a group of `ranks` ranks (Ray must be up in this process); with `copies`, `train.rank_copies`
    on, and its keepers' figures."""
    import ray  # after apply_ray_environment (main): Ray reads its authentication settings at import

    from turnkeep.gpu_workers.trainer_actor import TrainerActor

    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"ranks": ranks, "rank_copies": copies})})
    trainer = TrainerActor.options(num_gpus=0).remote()
    try:
        began = time.perf_counter()
        ray.get(trainer.setup.remote(str(model_dir), cfg.model_dump_json()))
        setup_s = time.perf_counter() - began
        pids = [ray.get(trainer.__ray_call__.remote(_pid_of)), *ray.get(trainer.ranks.remote())]
        keepers = _keepers(ranks) if copies else []
        peak = dict.fromkeys(pids + [pid for _, pid in keepers], 0)
        step_s, copy_s = [], []
        for step in range(1, steps + 1):
            began = time.perf_counter()
            stats = ray.get(trainer.train_step.remote(synthetic_rows(rows, length, vocab, step), step))
            step_s.append(time.perf_counter() - began)
            copy_s.append(stats.get("copy_s", 0.0))
            for pid in peak:
                peak[pid] = max(peak[pid], psutil.Process(pid).memory_info().rss)
        held = sum(ray.get(keeper.held_bytes.remote()) for keeper, _ in keepers)
        refit_s = []
        for _ in range(3):
            began = time.perf_counter()
            ray.get(trainer.weights_blob.remote())
            refit_s.append(time.perf_counter() - began)
        with tempfile.TemporaryDirectory(prefix="tk-ranks-") as folder:
            began = time.perf_counter()
            ray.get(trainer.save_checkpoint.remote(folder))
            save_s = time.perf_counter() - began
            size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
            began = time.perf_counter()
            ray.get(trainer.load_checkpoint.remote(folder, steps))
            load_s = time.perf_counter() - began
        warm = step_s[1:] or step_s  # the first step builds the optimizer state
        return {"ranks": ranks, "copies": copies, "setup_s": round(setup_s, 2),
                "step_s": round(statistics.median(warm), 3), "step_s_all": [round(s, 3) for s in step_s],
                "copy_s": round(statistics.median(copy_s[1:] or copy_s), 4),
                "refit_gather_s": round(statistics.median(refit_s), 3),
                "save_s": round(save_s, 3), "load_s": round(load_s, 3), "checkpoint_bytes": size,
                "peak_rss_mib_per_rank": [round(peak[pid] / 2**20) for pid in pids],
                "keeper_held_bytes": held, "keeper_peak_rss_mib": [round(peak[pid] / 2**20) for _, pid in keepers]}
    finally:
        ray.kill(trainer)
        for keeper, _ in keepers if copies else []:
            ray.kill(keeper, no_restart=True)  # the next group's keepers take the same names


def _keepers(ranks: int) -> list[tuple]:
    """Each rank's shard keeper and its pid."""
    import ray  # late: after apply_ray_environment, as time_group's

    from turnkeep.schemas.names import shard_keeper_name

    handles = [ray.get_actor(shard_keeper_name(rank)) for rank in range(ranks)]
    return [(handle, ray.get(handle.pid.remote())) for handle in handles]


def time_ranks(cfg: TurnkeepConfig, run_dir: Path, counts: list[int], steps: int, rows: int, length: int) -> dict:
    """`time_group` for each rank count, on one Ray started here for them."""
    from turnkeep.workers.ray_cluster.security import apply_ray_environment

    apply_ray_environment(cfg)  # before Ray is imported: it reads its authentication settings then
    import ray  # only now: see the line above

    from turnkeep.workers.model_maker import tiny_model_dir
    from turnkeep.workers.ray_cluster.placement import start_ray

    model_dir = tiny_model_dir(cfg)
    vocab = _vocab(model_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start_ray(cfg, run_dir)
    try:
        return {f"{n}{'+copies' if copies else ''}": time_group(cfg, model_dir, n, steps, rows, length, vocab, copies)
                for n in counts for copies in (False, True)}
    finally:
        ray.shutdown()


def _vocab(model_dir: Path) -> int:
    return int(orjson.loads((model_dir / "config.json").read_bytes())["vocab_size"])
