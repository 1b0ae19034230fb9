"""Which of a run's processes is which, for per-process memory figures.

A run's tree holds the controller, Ray's GCS and raylet and its workers, the three
actors (Ray renames their processes `ray::TrainerActor` and so on), vLLM's engine core
(forked, on a CPU, from a forkserver: `gpu_workers/engine_forkserver.py`) and workers, and the Temporal dev server.
"""

from __future__ import annotations

import os

import psutil

ROLES = (
    ("ray::TrainerActor", "trainer"),
    ("ray::TrainerRank", "trainer"),
    ("ray::ShardKeeper", "trainer rank copies"),
    ("ray::PolicyActor", "policy server (vLLM front end)"),
    ("ray::EnvServerActor", "environment server"),
    ("VLLM::EngineCore", "vLLM engine core"),
    ("VLLM::Worker", "vLLM worker"),
    ("multiprocessing.forkserver", "vLLM engine core's forkserver"),
    ("temporal", "Temporal dev server"),
    ("gcs_server", "Ray GCS and raylet"),
    ("raylet", "Ray GCS and raylet"),
    ("ray::IDLE", "Ray idle worker"),
    ("ray::DashboardAgent", "Ray services"),
    ("ray::RuntimeEnvAgent", "Ray services"),
    ("dashboard.py", "Ray services"),
    ("monitor.py", "Ray services"),
)


def role_of(proc: psutil.Process, root_pid: int) -> str:
    if proc.pid == root_pid:
        return "controller"
    try:
        name = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "other"
    for needle, role in ROLES:
        if needle in name:
            return role
    return "other"


def rss_mib_by_role(root_pid: int | None = None) -> dict[str, float]:
    """RSS of the process tree summed per role, in MiB."""
    root_pid = root_pid or os.getpid()
    root = psutil.Process(root_pid)
    by_role: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            rss = proc.memory_info().rss / 2**20
        except psutil.Error:
            continue
        role = role_of(proc, root_pid)
        by_role[role] = by_role.get(role, 0.0) + rss
    return by_role
