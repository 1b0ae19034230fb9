"""What every node of a user's cluster (`ray.address`) must have installed, checked at start and named.

Any node may get an engine (round robin), a replacement, the trainer or the environment server, so each live node
is asked, in parallel, whether it can find turnkeep's own actor modules, vLLM, torch and the module of every
`python` environment the run uses, and which versions of turnkeep, vLLM, torch and Ray it has. A node that lacks
one, or has another version than this machine, stops the start in one line naming the node and the package,
instead of an actor failing later on that node. Only looked up (`find_spec`, package metadata), never imported:
importing vLLM on every node would cost seconds and memory each.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import time

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from turnkeep.config.loader import ConfigError
from turnkeep.envs.kinds import local_environments
from turnkeep.schemas.choices import EnvironmentKind
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.ray_cluster.gpu_placement import live_nodes

RUN_MODULES = ("turnkeep.gpu_workers.policy_actor", "turnkeep.gpu_workers.trainer_actor", "turnkeep.envs.env_actor", "vllm", "torch")
VERSIONED = ("turnkeep", "vllm", "torch", "ray")
ANSWER_S = 120.0

log = logging.getLogger("turnkeep.run")


class NodeUnfit(ConfigError):
    """A node of the cluster lacks what the run's processes import; the message names the node and the package."""


def modules_needed(cfg: TurnkeepConfig) -> list[str]:
    entries = [spec.entry.split(":", 1)[0] for spec in local_environments(cfg.environments).values()
               if spec.kind == EnvironmentKind.PYTHON and spec.entry]
    return [*RUN_MODULES, *sorted(set(entries))]


def installed(modules: list[str]) -> dict:
    """What this process can find: the modules missing, and the versions of `VERSIONED`."""
    missing = []
    for module in modules:
        try:
            if importlib.util.find_spec(module) is None:
                missing.append(module)
        except (ImportError, ValueError):
            missing.append(module)
    versions = {}
    for package in VERSIONED:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {"missing": missing, "versions": versions}


@ray.remote(num_cpus=0)
def _installed_on_node(modules: list[str]) -> dict:
    return installed(modules)


def problems(here: dict, nodes: dict[str, dict]) -> list[str]:
    """One phrase per node that lacks a module or has another version than `here`."""
    found = []
    for address, there in sorted(nodes.items()):
        lacks = [f"{module} (not importable)" for module in there["missing"]]
        lacks += [f"{package} {there['versions'][package]} (this machine has {version})"
                  for package, version in here["versions"].items() if there["versions"].get(package) != version]
        if lacks:
            found.append(f"node {address}: {', '.join(lacks)}")
    return found


def check_nodes(cfg: TurnkeepConfig) -> None:
    """Raises NodeUnfit naming every node that cannot run the run's processes."""
    modules = modules_needed(cfg)
    nodes = live_nodes()
    refs = [_installed_on_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
            .remote(modules) for node in nodes]
    found = problems(installed(modules), _answers(nodes, refs))
    if found:
        raise NodeUnfit("the cluster's nodes must have what this run imports, in the versions this machine has: "
                        + "; ".join(found) + "; install the same turnkeep (and your environments' packages) on "
                        "every node, or start the nodes from the same environment")


def _answers(nodes: list[dict], refs: list) -> dict[str, dict]:
    """Each node's answer by its address. A node that left while asked (preempted as the run starts) is not checked:
    nothing will be placed on it. One that does not answer in time is let be with a warning: a busy node is not an
    unfit one, and an actor placed on a broken one fails by itself."""
    answers: dict[str, dict] = {}
    deadline = time.monotonic() + ANSWER_S
    for node, ref in zip(nodes, refs, strict=True):
        address = node["NodeManagerAddress"]
        try:
            answers[address] = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.1))
        except GetTimeoutError:
            log.warning("node %s did not say what it has installed within %.0f s; it was not checked", address,
                        ANSWER_S)
        except RayError as err:
            log.info("node %s left while it was checked (%s); it was not checked", address,
                     str(err).splitlines()[0])
    return answers
