"""The device check's trainer ranks (`gpu_check.py --ranks`): one group of 1 and of 2 ranks, each rank its own
process (and its own GPU on CUDA, NCCL between them; gloo on the CPU), timed without Ray: train steps on the same
synthetic rows split between the ranks, a sharded checkpoint's save and load, each rank's peak memory.

Two ranks on CUDA need two GPUs: where the machine has fewer, the report says so instead of sharing one (NCCL
refuses two ranks on one device).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import tempfile
import time
from pathlib import Path

import torch

RESULT_TIMEOUT_S = 1800


def check_ranks(cfg, model_dir: Path, rows: list, steps: int, counts: tuple[int, ...] = (1, 2)) -> dict:
    """Figures per rank count, or the reason a count was left out."""
    cuda = cfg.train.device != "cpu" and torch.cuda.is_available()
    have = torch.cuda.device_count() if cuda else None
    report = {}
    for ranks in counts:
        if cuda and have < ranks:
            report[str(ranks)] = {"skipped": f"{ranks} ranks need {ranks} GPUs (one each); this machine has {have}"}
            continue
        report[str(ranks)] = _group(cfg, model_dir, rows, steps, ranks, cuda)
    return report


def _group(cfg, model_dir: Path, rows: list, steps: int, ranks: int, cuda: bool) -> dict:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rows_json = [row.model_dump_json() for row in rows]
    with tempfile.TemporaryDirectory(prefix="tk-rank-check-") as folder:
        processes = []
        for rank in range(ranks):
            if cuda:
                os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # read by the child as it starts
            process = context.Process(target=_rank, args=(rank, ranks, port, cfg.model_dump_json(), str(model_dir),
                                                          rows_json, steps, folder, results))
            process.start()
            processes.append(process)
        found = [results.get(timeout=RESULT_TIMEOUT_S) for _ in range(ranks)]
        for process in processes:
            process.join(timeout=60)
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    failed = [r for r in found if "error" in r]
    if failed:
        return {"failed": failed}
    first = min(found, key=lambda r: r["rank"])
    return {"step_s": first["step_s"], "save_s": first["save_s"], "load_s": first["load_s"],
            "checkpoint_bytes": first["checkpoint_bytes"],
            # Each rank's loss is its share of the step's (normalised by the whole step's tokens): they add up.
            "loss": round(sum(r["loss"] for r in found), 5),
            "peak_memory_gib_per_rank": [r["peak_memory_gib"] for r in sorted(found, key=lambda r: r["rank"])]}


def _rank(rank: int, ranks: int, port: int, cfg_json: str, model_dir: str, rows_json: list[str], steps: int,
          folder: str, results) -> None:
    try:
        results.put({"rank": rank, **_measure(rank, ranks, port, cfg_json, model_dir, rows_json, steps, folder)})
    except Exception as err:  # noqa: BLE001 - reported to the parent, which prints it
        results.put({"rank": rank, "error": f"{type(err).__name__}: {err}"})


def _measure(rank: int, ranks: int, port: int, cfg_json: str, model_dir: str, rows_json: list[str], steps: int,
             folder: str) -> dict:
    from turnkeep.gpu_workers.grpo import build_batch
    from turnkeep.gpu_workers.rank_compute import RankCompute, resolve_device
    from turnkeep.gpu_workers.rank_group import join_group, micro_batch_count, split_by_group
    from turnkeep.schemas.config import TurnkeepConfig
    from turnkeep.schemas.rollout import RolloutRow

    cfg = TurnkeepConfig.model_validate_json(cfg_json)
    device = resolve_device(cfg.train.device)
    if ranks > 1:
        address = f"tcp://127.0.0.1:{port}"
        listener = None
        if rank == 0:
            listener = socket.socket()
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
        join_group(address, rank, ranks, device.type, "127.0.0.1", listener)
    trainer = RankCompute(Path(model_dir), cfg.train, cfg.model.dtype, cfg.run.seed, cfg.rollout.temperature)
    batch = build_batch([RolloutRow.model_validate_json(row) for row in rows_json], trainer.pad_id)
    shares = split_by_group(batch, ranks)
    passes = micro_batch_count(shares, cfg.train.micro_batch_rows)
    seconds, loss = [], 0.0
    for _ in range(steps + 1):  # the first builds the optimizer state and is not timed
        _sync(device)
        began = time.perf_counter()
        loss = trainer.backward(shares[rank], batch.num_loss_tokens, passes)["loss"]
        trainer.optimizer_step()
        _sync(device)
        seconds.append(time.perf_counter() - began)
    directory = Path(folder) / f"ranks_{ranks}"
    began = time.perf_counter()
    trainer.save(directory)
    _sync(device)
    save_s = time.perf_counter() - began
    _barrier(ranks)
    began = time.perf_counter()
    trainer.load(directory)
    _sync(device)
    load_s = time.perf_counter() - began
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _rss()
    return {"step_s": round(sorted(seconds[1:])[len(seconds[1:]) // 2], 4), "save_s": round(save_s, 3),
            "load_s": round(load_s, 3), "checkpoint_bytes": size, "loss": round(loss, 5),
            "peak_memory_gib": round(peak / 2**30, 3)}


def _barrier(ranks: int) -> None:
    if ranks > 1:
        import torch.distributed as dist

        dist.barrier()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss
