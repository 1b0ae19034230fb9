"""Run directories with a trainer checkpoint for the export tests, made without `turnkeep run`: a trainer takes one
step at a large learning rate (so its weights are not the model folder's any more), saves, and the checkpoint is
published as a run publishes it (`write_trainer_checkpoint`, manifest included). One rank trains in this process
(`Trainer`); two ranks in two spawned processes, a gloo group with the model sharded by FSDP2 (`RankCompute`), as
a run's ranks are. Each writer records the trainer's own logprobs of a fixed prompt right after it saved."""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.gpu_workers.synthetic_rows import synthetic_rows
from turnkeep.controller.fingerprint import fingerprint_fields
from turnkeep.controller.stores.trainer_checkpoint import CheckpointIdentity, write_trainer_checkpoint
from turnkeep.envs.calc_transcripts import CalcTranscripts
from turnkeep.gpu_workers.grpo import build_batch, token_logprobs
from turnkeep.gpu_workers.tiny_model.build import ensure_tiny_model
from turnkeep.primitives.atomic_files import atomic_write_json
from turnkeep.schemas.config import TinyModelConfig, TurnkeepConfig
from turnkeep.schemas.rollout import RolloutRow

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                       intermediate_size=128, max_position_embeddings=64, warm_start_steps=0)
RUN_ID = "export-test-1a2b3c"
LR = 1e-2
"""Large enough that one step moves the logprobs far beyond the tests' tolerances."""
PROMPT = "Q 37+48-12"


@dataclass(frozen=True)
class MadeRun:
    run_dir: Path
    model_dir: Path
    step: int
    prompt_ids: list[int]
    logprobs: torch.Tensor
    """The trainer's logprobs of `prompt_ids[1:]` with the checkpoint's weights."""


def run_config(root: Path, model_path: Path | None = None, dtype: str = "float32",
               lora: dict | None = None) -> TurnkeepConfig:
    model = {"cache_dir": str(root / "models"), "tiny": TINY.model_dump(), "dtype": dtype}
    if model_path is not None:
        model["path"] = str(model_path)
    return TurnkeepConfig.model_validate({"run": {"run_dir": str(root / "run"), "seed": 0}, "model": model,
                                          "train": {"lr": LR, "lora": lora or {}}})


def make_run(root: Path, ranks: int = 1, model_path: Path | None = None, dtype: str = "float32",
             lora: dict | None = None) -> MadeRun:
    """`lora`: `[train.lora]` of the run (one rank)."""
    cfg = run_config(root, model_path, dtype, lora)
    model_dir = model_path or ensure_tiny_model(cfg.model, CalcTranscripts(cfg.task), seed=0, eval_rollouts=0)
    run_dir = cfg.run.run_dir
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / "config.json", cfg.model_dump(mode="json"))
    atomic_write_json(run_dir / "run.json", {"run_id": RUN_ID, "incarnation": 1})
    ids = prompt_ids(model_dir)
    writer = OneRank(model_dir, ids, dtype, cfg.train) if ranks == 1 else SpawnedRanks(model_dir, ids, ranks)
    identity = CheckpointIdentity(RUN_ID, fingerprint_fields(cfg))
    asyncio.run(write_trainer_checkpoint(run_dir, 1, writer, {"step": 1}, 3, identity=identity))
    return MadeRun(run_dir, model_dir, 1, ids, writer.logprobs)


def prompt_ids(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(model_dir)(PROMPT)["input_ids"])


def model_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Logprobs of `ids[1:]` as the trainer computes them (`grpo.token_logprobs`, float32, temperature 1)."""
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
    return token_logprobs(logits.float(), input_ids)[0]


def rows() -> list[RolloutRow]:
    """Four groups of two rows, whole groups to each rank."""
    return synthetic_rows([20 + i % 5 for i in range(8)])


class _Remote:
    """`write_trainer_checkpoint` awaits `trainer.save_checkpoint.remote(path)`, as on the trainer's Ray actor."""

    def __init__(self, call) -> None:
        self.remote = call


class OneRank:
    def __init__(self, model_dir: Path, ids: list[int], dtype: str, train) -> None:
        from turnkeep.gpu_workers.trainer import Trainer
        from turnkeep.primitives.holds import HoldSet

        self.trainer = Trainer(model_dir, train, dtype, seed=0, temperature=1.0, hold=HoldSet("trainer"))
        self.ids = ids
        self.logprobs: torch.Tensor | None = None
        self.save_checkpoint = _Remote(self._train_and_save)

    async def _train_and_save(self, directory: str) -> None:
        await self.trainer.train_step(rows(), 1)
        await self.trainer.save_checkpoint(Path(directory))
        self.logprobs = model_logprobs(self.trainer.model, self.ids)


class SpawnedRanks:
    def __init__(self, model_dir: Path, ids: list[int], ranks: int) -> None:
        self.model_dir, self.ids, self.ranks = model_dir, ids, ranks
        self.logprobs: torch.Tensor | None = None
        self.save_checkpoint = _Remote(self._train_and_save)

    async def _train_and_save(self, directory: str) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._run_ranks, Path(directory))
        atomic_write_json(Path(directory) / "trainer_state.json", {"policy_version": 1, "ranks": self.ranks})

    def _run_ranks(self, directory: Path) -> None:
        context = torch.multiprocessing.get_context("spawn")
        with tempfile.TemporaryDirectory() as scratch:
            found = Path(scratch) / "logprobs.pt"
            args = (self.ranks, str(self.model_dir), str(directory), self.ids, str(Path(scratch) / "group"), str(found))
            processes = [context.Process(target=rank_main, args=(rank, *args)) for rank in range(self.ranks)]
            for process in processes:
                process.start()
            for process in processes:
                process.join(timeout=600)
            assert [p.exitcode for p in processes] == [0] * self.ranks, [p.exitcode for p in processes]
            self.logprobs = torch.load(found)


def rank_main(rank: int, ranks: int, model_dir: str, directory: str, ids: list[int], group: str, found: str) -> None:
    """One trainer rank in its own process: join the group, train one step on its share, save its shard; rank 0
    writes the sharded model's logprobs of the prompt."""
    import torch.distributed as dist

    from turnkeep.gpu_workers.rank_compute import RankCompute
    from turnkeep.gpu_workers.rank_group import interface_of, micro_batch_count, split_by_group
    from turnkeep.schemas.config import TrainConfig

    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_of("127.0.0.1") or "lo")
    dist.init_process_group("gloo", init_method=f"file://{group}", rank=rank, world_size=ranks)
    try:
        compute = RankCompute(Path(model_dir), TrainConfig(lr=LR, ranks=ranks), "float32", 0, 1.0)
        batch = build_batch(rows(), compute.pad_id)
        shares = split_by_group(batch, ranks)
        compute.backward(shares[rank], batch.num_loss_tokens, micro_batch_count(shares, None))
        compute.optimizer_step()
        compute.save(Path(directory))
        logprobs = model_logprobs(compute.model, ids)  # every rank runs the forward: FSDP gathers the shards
        if rank == 0:
            torch.save(logprobs, found)
    finally:
        dist.destroy_process_group()
