"""GPUs for the trainer and the policy server, reserved through Ray.

`[placement]` says how many GPUs each gets and whether the two share devices. Ray
reserves them in one placement group (bundles packed onto as few nodes as it can), so
both land on GPU nodes and nothing else takes those GPUs; the environment servers ask
for none and stay on CPU nodes. A start that asks for more GPUs than the cluster has is
refused with both numbers before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnkeep.config.loader import ConfigError
from turnkeep.schemas.config_services import PlacementConfig

SHARED_FRACTION = 0.5
"""Each process's share of a GPU when `share_gpus` puts both on one device."""
READY_TIMEOUT_S = 120.0


class PlacementError(ConfigError):
    """The configured GPUs cannot be had; the message names the numbers and the fix."""


@dataclass(frozen=True)
class Seat:
    bundle: int
    """Index of the placement-group bundle the process runs in."""
    num_gpus: float
    """What the process asks Ray for (a fraction when it shares its GPU)."""


@dataclass(frozen=True)
class GpuPlan:
    bundles: list[dict[str, float]]
    trainer_ranks: list[Seat | None]
    """Trainer rank r's seat (rank 0 is the trainer's own process)."""
    engines: list[Seat | None]
    """Engine k's seat; a replacement for engine k takes the same bundle once the dead one has left it."""

    @property
    def trainer(self) -> Seat | None:
        return self.trainer_ranks[0]

    @property
    def policy(self) -> Seat | None:
        return self.engines[0]


def plan_gpus(placement: PlacementConfig, engines: int = 1, ranks: int = 1) -> GpuPlan:
    if placement.share_gpus:
        return GpuPlan([{"GPU": 1.0}], [Seat(0, SHARED_FRACTION)], [Seat(0, SHARED_FRACTION)])
    bundles: list[dict[str, float]] = []
    trainer_ranks: list[Seat | None] = []
    for _ in range(ranks):
        trainer_ranks.append(Seat(len(bundles), float(placement.trainer_gpus)) if placement.trainer_gpus else None)
        if placement.trainer_gpus:
            bundles.append({"GPU": float(placement.trainer_gpus)})
    seats: list[Seat | None] = []
    for _ in range(engines):
        seats.append(Seat(len(bundles), float(placement.policy_gpus)) if placement.policy_gpus else None)
        if placement.policy_gpus:
            bundles.append({"GPU": float(placement.policy_gpus)})
    return GpuPlan(bundles, trainer_ranks, seats)


def check_gpus(placement: PlacementConfig, cluster_gpus: float, where: str = "the Ray cluster",
               engines: int = 1, ranks: int = 1) -> None:
    needed = placement.gpus_needed(engines, ranks)
    if needed > cluster_gpus:
        each = f" x {engines} engines" if engines > 1 else ""
        per_rank = f" x {ranks} ranks" if ranks > 1 else ""
        how = ("shared by the trainer and the policy server" if placement.share_gpus else
               f"trainer {placement.trainer_gpus}{per_rank} + policy server {placement.policy_gpus}{each}")
        raise PlacementError(
            f"[placement] asks for {needed} GPU(s) ({how}), but {where} has {cluster_gpus:g}; lower "
            "placement.trainer_gpus / placement.policy_gpus (0 runs that process on the CPU), policy.engines or "
            "train.ranks, or "
            "join a cluster with more GPUs (ray.address)"
        )


def reserve(placement: PlacementConfig, detached: bool = False, engines: int = 1, spread: bool = False,
            ranks: int = 1):
    """Check the cluster, then reserve the plan's bundles; None when nothing asks for a GPU. `detached`: the
    reservation outlives this controller, as the detached actors placed in it do. `spread`: the bundles go to
    different nodes where Ray can (one node lost takes few engines with it)."""
    # Late: the CLI's config checks import this module before Ray's environment is set (`security.py`).
    import ray
    from ray.util.placement_group import placement_group

    check_gpus(placement, ray.cluster_resources().get("GPU", 0.0), engines=engines, ranks=ranks)
    plan = plan_gpus(placement, engines, ranks)
    if not plan.bundles:
        return None
    group = placement_group(plan.bundles, strategy="SPREAD" if spread else "PACK", name="turnkeep-gpus",
                            lifetime="detached" if detached else None)
    ray.get(group.ready(), timeout=READY_TIMEOUT_S)
    return group


def actor_options(placement: PlacementConfig, group, role: str, engine: int = 0, engines: int = 1,
                  spread: bool = False, ranks: int = 1, rank: int = 0) -> dict:
    """Ray options of trainer rank `rank` of `ranks` (`role="trainer"`) or policy engine `engine` (`"policy"`).
    Without GPUs, `spread` engines go to different nodes where Ray can."""
    plan = plan_gpus(placement, max(engines, engine + 1), ranks)
    seat = plan.trainer_ranks[rank] if role == "trainer" else plan.engines[engine]
    if seat is None or group is None:
        if role == "policy":
            return {"num_gpus": 0, **(spread_over_nodes(engine) if spread else {})}
        return {"num_gpus": 0, **on_head_node()}
    # Late: the CLI's config checks import this module before Ray's environment is set (`security.py`).
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=seat.bundle)
    return {"num_gpus": seat.num_gpus, "scheduling_strategy": strategy}


HEAD_RESOURCE = "node:__internal_head__"


def live_nodes() -> list[dict]:
    """The cluster's live nodes, the head first (then by id: a stable order for round robin)."""
    # Late: the CLI's config checks import this module before Ray's environment is set (`security.py`).
    import ray

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    return sorted(nodes, key=lambda n: (HEAD_RESOURCE not in n["Resources"], n["NodeID"]))


def _on(node: dict) -> dict:
    # Hard affinity: Ray's soft one was seen placing actors on the other node of two with room on both. A node
    # that goes away meanwhile fails the actor's start, which the caller retries on the nodes then alive.
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)}


def on_head_node(cpus: float = 0.0) -> dict:
    """Ray options that put an actor asking for `cpus` on the cluster's head node when it has them (the trainer
    without GPUs, the run's environment server): the other nodes are where engines spread, and losing one must not
    take these. A head without the CPUs (often started with --num-cpus=0) leaves the choice to Ray."""
    # Late: the CLI's config checks import this module before Ray's environment is set (`security.py`).
    import ray

    if not ray.is_initialized():
        return {}
    nodes = live_nodes()
    if len(nodes) < 2 or nodes[0]["Resources"].get("CPU", 0.0) < cpus:
        return {}
    return _on(nodes[0])


def spread_over_nodes(engine: int) -> dict:
    """Engine k on the k-th live node, the head's first (round robin). Ray's own SPREAD does not spread actors that
    ask for no CPU, which engines do (vLLM's threads are its own)."""
    # Late: the CLI's config checks import this module before Ray's environment is set (`security.py`).
    import ray

    if not ray.is_initialized():
        return {"scheduling_strategy": "SPREAD"}
    nodes = live_nodes()
    return _on(nodes[engine % len(nodes)]) if len(nodes) > 1 else {}


def check_local_gpus(placement: PlacementConfig, engines: int = 1, ranks: int = 1) -> None:
    """Before anything starts: a run that starts its own Ray (no `ray.address`) gets this machine's GPUs, so a
    placement this machine cannot meet is refused here, not after Temporal and Ray have started."""
    if not placement.gpus_needed(engines, ranks):
        return
    import torch  # seconds to import: only a run that asks for GPUs pays it

    check_gpus(placement, float(torch.cuda.device_count()), where="this machine (the run starts its own Ray here)",
               engines=engines, ranks=ranks)
