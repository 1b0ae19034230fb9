"""What `turnkeep chaos --target` kills, and what it then expects of the run.

- `all`: the whole process tree, as a preempted machine loses it; the next start restores.
- `controller`: the `turnkeep run` process alone (the OOM killer's pick); everything it
  started lives on, and the next start re-attaches to it (`workers.ray_cluster.reattach`).
- `trainer`: that process alone (rank 0, and the other ranks go with it); `rank`: one trainer rank other than 0,
  picked at random (`train.ranks` > 1). The run replaces the whole trainer group, restores into it by itself and
  goes on, no restart (`train.max_rebuilds`).
- `env`, `temporal`: that process alone; the run starts it again and goes on, no restart.
- `policy` (engine 0), `engine` (one engine of the run's, picked at random): the run routes
  its turns to the other engines, starts a replacement, refits it and goes on, no restart.
- `freeze-engine`: one engine's vLLM engine core (of an engine picked at random) SIGSTOPped, not killed: its front
  end still answers HTTP while no token comes. The run's liveness probe (`policy.hang_s`) must notice it, kill the
  engine's processes and replace it, no restart.
- `freeze-rank`, `freeze-env`, `freeze-temporal`: that process SIGSTOPped. The run must notice (the group's
  collective timeout `train.hang_s`; the environment server's calls and health probe; Temporal's health check
  `temporal.hang_s`), kill it by pid and replace it, no restart.
- `freeze-controller`: the `turnkeep run` process SIGSTOPped. The run's Ray keeper must notice its heartbeat stop
  (`ray.controller_hang_s`) and kill it by pid; the next start re-attaches as after a `controller` kill.
  A frozen process that is replaced must be gone: one left stopped could come back beside its replacement.
- `node`: the second node of the chaos run's own two-node Ray cluster (`chaos.local_cluster`), every process
  on it; the run replaces what it lost there (engines) on the node that is left and goes on, no restart. The
  chaos run then starts the node again, so the next `node` kill has one to take.

Processes are found through the pid files the run writes (`primitives.pid_files`), never
through the product's own hooks, and killed with SIGKILL at a moment chaos picks.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from turnkeep.chaos.local_cluster import LocalCluster
from turnkeep.primitives.pid_files import live_pid, live_pids, live_record
from turnkeep.primitives.process_tree import kill_tree

FREEZE_ENGINE = "freeze-engine"
FREEZE_CONTROLLER = "freeze-controller"
FREEZES = (FREEZE_ENGINE, "freeze-rank", "freeze-env", "freeze-temporal", FREEZE_CONTROLLER)
TARGETS = ("all", "controller", "trainer", "rank", "policy", "engine", "env", "temporal", *FREEZES, "node")
EVERY = "every"
NAMED_ONLY = ("rank", "freeze-rank")
"""Not in `every`: a rank's kill or freeze needs a run with `train.ranks` > 1, so it is asked for by name."""
ENDS_THE_INCARNATION = ("all", "controller", FREEZE_CONTROLLER)
"""Targets after which the run's process is gone and the next start restores or re-attaches."""
NODE = "node"
"""The one target that needs a cluster of more than one node: a chaos run with it starts its own."""
REPAIRED_BY_THE_RUN = ("env", "temporal", "policy", "engine", "trainer", "rank", *FREEZES[:-1], NODE)
"""Targets the run starts again by itself: no restart follows their kill."""
STOP_LINE = "turnkeep: the run was stopped"


def parse_targets(text: str) -> list[str]:
    targets = [t.strip() for t in text.split(",") if t.strip()]
    if targets == [EVERY]:
        return [target for target in TARGETS if target not in NAMED_ONLY]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise ValueError(f"--target {text!r}: unknown {unknown}; choose from {', '.join(TARGETS)} (a comma list) "
                         f"or {EVERY}")
    return list(dict.fromkeys(targets))


ENGINE_ROLE = re.compile(r"^policy(\.\d+)?$")
"""Engine 0's pid file is `policy` (as a one-engine run's always was), engine k's `policy.<k>`."""
RANK_ROLE = re.compile(r"^trainer\.rank\d+$")
"""Trainer rank k > 0's pid file is `trainer.rank<k>`."""


@dataclass
class Kill:
    killed: int
    """Processes SIGKILLed (0: the target was not running)."""
    pid: int | None
    role: str | None = None
    """The pid file's role that named it (which engine an `engine` kill picked)."""
    lost: dict[str, int] = field(default_factory=dict)
    """A `node` kill: the run's processes that went with the node, by pid-file role."""
    lost_urls: dict[str, str] = field(default_factory=dict)
    """What those of them that serve (the engines) answered at, from their pid files."""
    frozen: list[int] = field(default_factory=list)
    """A freeze: the pids SIGSTOPped, which the repair must have killed."""


def kill_target(target: str, run_dir: Path, root_pid: int, rng: random.Random | None = None,
                cluster: LocalCluster | None = None) -> Kill:
    """SIGKILL the target now; `root_pid` is the `turnkeep run` process of the current incarnation."""
    if target == "all":
        return Kill(kill_everything(run_dir, root_pid), root_pid)
    if target == NODE:
        return kill_node(run_dir, cluster)
    if target == FREEZE_ENGINE:
        return freeze_engine_core(run_dir, rng or random.Random())
    if target in FREEZES:
        return freeze(target, run_dir, root_pid, rng or random.Random())
    picks = {"engine": ENGINE_ROLE, "rank": RANK_ROLE}
    role = pick_live(run_dir, picks[target], rng or random.Random()) if target in picks else target
    pid = root_pid if target == "controller" else (live_pid(run_dir, role) if role else None)
    return _signal(pid, role, signal.SIGKILL)


def freeze(target: str, run_dir: Path, root_pid: int, rng: random.Random) -> Kill:
    """SIGSTOP the process a `freeze-*` target names (the controller: `root_pid`)."""
    role = pick_live(run_dir, RANK_ROLE, rng) if target == "freeze-rank" else target.removeprefix("freeze-")
    pid = root_pid if target == FREEZE_CONTROLLER else (live_pid(run_dir, role) if role else None)
    return _signal(pid, role, signal.SIGSTOP)


def _signal(pid: int | None, role: str | None, sig: signal.Signals) -> Kill:
    """`sig` to the process of `role` (a SIGSTOP leaves it frozen, to be gone before its repair counts)."""
    if pid is None:
        return Kill(0, None, role)
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return Kill(0, pid, role)
    return Kill(1, pid, role, frozen=[pid] if sig == signal.SIGSTOP else [])


def freeze_engine_core(run_dir: Path, rng: random.Random) -> Kill:
    """SIGSTOP the engine core of one engine picked at random; the Kill names the engine's actor (its pid file),
    whose replacement is the repair."""
    role = pick_live(run_dir, ENGINE_ROLE, rng)
    actor = live_pid(run_dir, role) if role else None
    if actor is None:
        return Kill(0, None, role)
    try:
        cores = engine_cores(actor)
        for core in cores:
            core.send_signal(signal.SIGSTOP)
    except psutil.Error:
        return Kill(0, actor, role)
    return Kill(len(cores), actor, role, frozen=[core.pid for core in cores])


def engine_cores(actor_pid: int) -> list[psutil.Process]:
    """The vLLM engine core processes an engine's actor started (vLLM titles them `VLLM::EngineCore`)."""
    return [p for p in psutil.Process(actor_pid).children(recursive=True)
            if "VLLM::EngineCore" in " ".join(p.cmdline())]


def kill_node(run_dir: Path, cluster: LocalCluster | None) -> Kill:
    """Take the cluster's second node away, noting which of the run's processes were on it."""
    if cluster is None:
        return Kill(0, None, NODE)
    on_node = cluster.worker_node_pids()
    lost = {role: pid for role, pid in live_pids(run_dir).items() if pid in on_node}
    records = {role: live_record(run_dir, role) or {} for role in lost}
    urls = {role: record["url"] for role, record in records.items() if "url" in record}
    return Kill(cluster.lose_worker_node(), cluster.worker.pid if cluster.worker else None, NODE, lost, urls)


def pick_live(run_dir: Path, roles: re.Pattern, rng: random.Random) -> str | None:
    """One live process's pid-file role among those `roles` matches (the engines, the trainer ranks), at random."""
    live = sorted(role for role in live_pids(run_dir) if roles.match(role))
    return rng.choice(live) if live else None


def kill_everything(run_dir: Path, root_pid: int | None) -> int:
    """SIGKILL the controller's tree and every process of the run in a session of its own (Temporal, the run's
    Ray, found by their pid files), as a lost machine loses them."""
    killed = kill_tree(root_pid) if root_pid is not None else 0
    for pid in live_pids(run_dir).values():
        killed += kill_tree(pid)
    return killed


def repaired(run_dir: Path, kill: Kill) -> bool:
    """The run started again what the kill took: a live process under each pid file, not the one killed."""
    lost = kill.lost if kill.role == NODE else {kill.role or "": kill.pid}
    replaced = all(_replaced(live_pid(run_dir, role), pid) for role, pid in lost.items())
    return replaced and not any(_alive_pid(pid) for pid in kill.frozen)


def _alive_pid(pid: int) -> bool:
    try:
        return _alive(psutil.Process(pid))
    except psutil.Error:
        return False


def _replaced(pid: int | None, killed_pid: int | None) -> bool:
    return pid is not None and pid != killed_pid


def stop_reason(log: Path) -> str:
    """The run's one-line reason for stopping, from its log ('' if it gave none)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    stopped = [line for line in lines if line.startswith(STOP_LINE)]
    return stopped[-1] if stopped else ""


def sessions_cleanup(session_ids: list[int], timeout_s: float = 30.0) -> int:
    """SIGKILL whatever is left in the sessions of earlier incarnations (a controller kill leaves its
    children running on purpose; at the end of a chaos run nothing may outlive it)."""
    wanted = set(session_ids)
    victims = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) in wanted and process.pid != os.getpid():
                process.send_signal(signal.SIGKILL)
                victims.append(process)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in victims) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(victims)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
