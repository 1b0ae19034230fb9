"""Starting the trainer: its Ray actor (rank 0, placed on its GPU bundles) and, once the model is there, its model
loaded into it and its other ranks, their pid files and its stamp. A run's start does both (`placement.launch`), and so
does a re-attach whose trainer had died (`reattach`)."""

from __future__ import annotations

import os

import psutil
import ray

from turnkeep.gpu_workers.trainer_actor import TrainerActor
from turnkeep.primitives.pid_files import write_pid_file
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.process_watch import death_reason
from turnkeep.workers.ray_cluster.gpu_placement import actor_options
from turnkeep.workers.trainer_rebuilds import TrainerDiedAtStart


def create_trainer(cfg: TurnkeepConfig, gpus, identity: dict | None = None):
    """The trainer's actor (rank 0), not yet set up; detached when the run's processes outlive the controller."""
    detached = {"lifetime": "detached"} if identity is not None else {}
    options = actor_options(cfg.placement, gpus, "trainer", ranks=cfg.train.ranks)
    return TrainerActor.options(name="trainer", **detached, **options).remote()


async def setup_trainer(trainer, model_dir: str, cfg: TurnkeepConfig, identity: dict | None, gpus=None) -> None:
    """Load the model into the trainer and its other ranks (each in its own GPU bundle of `gpus` when the trainer
    has GPUs), write their pid files, stamp it with the run."""
    ranks = cfg.train.ranks
    rank_options = [actor_options(cfg.placement, gpus, "trainer", ranks=ranks, rank=rank) for rank in range(1, ranks)]
    run_dir = cfg.run.run_dir
    try:
        await trainer.setup.remote(model_dir, cfg.model_dump_json(), rank_options, identity is not None)
        write_pid_file(run_dir, "trainer", await trainer.__ray_call__.remote(_pid_of))
        for rank, pid in enumerate(await trainer.ranks.remote(), 1):
            write_pid_file(run_dir, f"trainer.rank{rank}", pid)
        if identity is not None:
            await trainer.stamp.remote({**identity, "model_dir": model_dir})
    except (ray.exceptions.RayActorError, psutil.NoSuchProcess) as err:
        raise TrainerDiedAtStart(death_reason("trainer", err)) from None


def _pid_of(actor) -> int:
    return os.getpid()

