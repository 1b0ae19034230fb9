"""Ray placement of the trainer, the policy engines and the environment server.

Local by default (Ray's temp dir inside the run directory, listening on loopback, with
token authentication: `workers/ray_cluster/security.py`); `ray.address` joins an existing
cluster instead, with its token. The run's control token
(`<run_dir>/control_token`, mode 0600) is created here and handed to the policy
server and the environment server, whose checkpoint routes require it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import ray

from turnkeep.config.loader import ConfigError
from turnkeep.controller.engines.engine_pool import EnginePool, EngineState
from turnkeep.controller.processes import EnvServerEndpoint, Processes
from turnkeep.envs.kinds import local_environments
from turnkeep.gpu_workers.tiny_model.model_files import ModelUnusable
from turnkeep.primitives.control_token import create_control_token
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.local_env_server import LocalEnvServer
from turnkeep.workers.model_maker import cached_tiny_model_dir, tiny_model_dir
from turnkeep.workers.ray_cluster.engines import EngineStarter, create_engine
from turnkeep.workers.ray_cluster.gpu_placement import PlacementError, on_head_node, reserve
from turnkeep.workers.ray_cluster.head import RayHead, start_or_find_head
from turnkeep.workers.ray_cluster.node_checks import check_nodes
from turnkeep.workers.ray_cluster.security import ensure_ray_token
from turnkeep.workers.ray_cluster.survivors import STOP_TIMEOUT_S, find_survivors, stop_survivors
from turnkeep.workers.ray_cluster.temp_dir import prepare_ray_temp_dir
from turnkeep.workers.ray_cluster.trainer_start import create_trainer, setup_trainer
from turnkeep.workers.ray_cluster.warden import stop_warden
from turnkeep.workers.startup_clock import StartupClock, marked

log = logging.getLogger("turnkeep.placement")


def start_ray(cfg: TurnkeepConfig, run_dir: Path, namespace: str | None = None) -> None:
    """Ray inside this process: it and the run's processes die with it (the test suite's shared stack, and a run
    with `ray.survive_controller_s = 0`). `workers.ray_cluster.security.apply_ray_environment` must have run before Ray was
    imported (the CLI does it)."""
    ensure_ray_token(cfg)
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, namespace=namespace, logging_level="WARNING")
        try:
            check_nodes(cfg)
        except ConfigError:
            ray.shutdown()
            raise
        return
    ray.init(
        num_cpus=cfg.ray.num_cpus or os.cpu_count(),
        _temp_dir=str(prepare_ray_temp_dir(run_dir)),
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=True,
        namespace=namespace,
    )


def join_ray(cfg: TurnkeepConfig, run_dir: Path, namespace: str) -> RayHead | None:
    """The run's Ray. Local Ray with `ray.survive_controller_s` > 0: its own head (`workers.ray_cluster.head`), found again
    after a controller crash or started; the run's processes are then detached actors that outlive this process.
    Otherwise Ray inside this process (None)."""
    if cfg.ray.address or cfg.ray.survive_controller_s == 0:
        start_ray(cfg, run_dir, namespace)
        return None
    ensure_ray_token(cfg)
    head = start_or_find_head(cfg, run_dir)
    ray.init(address=head.address, namespace=namespace, logging_level="WARNING", log_to_driver=True)
    return head


def reserve_gpus(cfg: TurnkeepConfig, detached: bool = False):
    """The placement group of the trainer's and the policy server's GPUs (None: no GPUs asked for).

    Refused with the numbers when the cluster has too few; Ray is shut down again then.
    """
    try:
        return reserve(cfg.placement, detached, cfg.policy.engines, cfg.policy.placement == "spread",
                       cfg.train.ranks)
    except PlacementError:
        ray.shutdown()
        raise


async def _model_dir(cfg_json: str) -> str:
    """The model's directory, made on a node of the cluster; a model setting that cannot work is one line."""
    try:
        return await _make_model.remote(cfg_json)
    except ray.exceptions.RayTaskError as err:
        if isinstance(getattr(err, "cause", None), ModelUnusable):
            raise ConfigError(str(err.cause)) from None
        raise


@ray.remote(num_cpus=0)
def _make_model(cfg_json: str) -> str:
    return str(tiny_model_dir(TurnkeepConfig.model_validate_json(cfg_json)))


async def launch(cfg: TurnkeepConfig, incarnation: int | None = None, gpus=None,
                 identity: dict | None = None, clock: StartupClock | None = None) -> Processes:
    """Start the trainer, the engines and the run's environment server; with `incarnation`, the environment server
    writes turn commits to the audit log; with `clock`, each is marked the moment it is up.

    With `identity` (the run id and `process_digest` of the config) they are detached actors, stamped with it, that
    outlive this controller: a restarted one re-attaches to them (`workers.ray_cluster.reattach`)."""
    cfg_json = cfg.model_dump_json()
    token = create_control_token(cfg.run.run_dir)
    # The actors' processes start (and import torch) while the model is found or made.
    trainer = create_trainer(cfg, gpus, identity)
    actors = [create_engine(cfg, gpus, identity, k) for k in range(cfg.policy.engines)]
    model_dir = str(cached) if (cached := cached_tiny_model_dir(cfg)) is not None else await _model_dir(cfg_json)
    starter = EngineStarter(cfg, model_dir, token, gpus, identity, incarnation)
    pool = EnginePool([])
    local = sorted(local_environments(cfg.environments))
    env = LocalEnvServer(cfg, Path(model_dir), pool.routable_urls, token, incarnation, identity=identity,
                         placement=on_head_node) if local else None
    if env is not None:
        env.create()  # its process starts beside the others; it is started once the engines it routes to are live
    try:
        # The trainer loads its model while the engines start: none waits for another.
        engines, _ = await asyncio.gather(
            marked(clock, "engines", asyncio.gather(*(starter.begin(k, actor) for k, actor in enumerate(actors)))),
            marked(clock, "trainer", setup_trainer(trainer, model_dir, cfg, identity, gpus)),
        )
        for engine in engines:
            engine.state = EngineState.LIVE
            pool.put(engine)
        env_url, servers = None, []
        if env is not None:
            env_url = await marked(clock, "env_server", env.start())
            servers.append(EnvServerEndpoint("env", env_url, token, local))
    except BaseException:
        if env is not None and env.url is None:
            _kill_quietly(env.actor)  # never stamped, so nothing would find it again on a user's cluster
        raise
    return Processes(trainer, pool, env, Path(model_dir), env_url, token, servers, spawn_engine=starter.spawn)


def _kill_quietly(actor) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - gone already
        pass


async def shutdown(processes: Processes | None, on_cluster: bool = False) -> None:
    """Stop the run's processes. `on_cluster`: they are detached actors on a user's cluster, which nothing else
    stops when the run ends (the run's own Ray goes with its head): every one of them, and the warden, go too."""
    if processes is not None:
        engines = [engine.actor for engine in processes.engines.all() if engine.state is not EngineState.DEAD]
        stops = [process.stop() if isinstance(process, LocalEnvServer) else process.stop.remote()
                 for process in (processes.env, *engines) if process is not None]
        # Best effort on the way out, both at once: neither waits for the other, and a process that hangs (it
        # answers no call) is left to the Ray head's stop, which kills whatever is left.
        tasks = [asyncio.ensure_future(stop) for stop in stops]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("%d of the run's processes did not stop within %.0fs (hung?); the Ray head's stop kills "
                            "them", len(pending), STOP_TIMEOUT_S)
    if on_cluster:
        await stop_survivors(find_survivors())
        await stop_warden()
    ray.shutdown()
