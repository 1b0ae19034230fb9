"""The soak benchmark's measurements: per process of a run (found by its pid files), open file
descriptors, threads and RSS; and the slope of each against the number of snapshot attempts."""

from __future__ import annotations

from pathlib import Path

import psutil

from turnkeep.primitives.pid_files import live_pids

ROLES = ("controller", "trainer", "policy", "env", "temporal", "ray")


def sample_processes(run_dir: Path) -> dict[str, dict[str, float]]:
    """{role: {"fds", "threads", "rss_mib"}} for every live process of the run (a role gone is left out)."""
    found = {}
    for role, pid in live_pids(run_dir).items():
        if role not in ROLES:
            continue
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                found[role] = {"fds": float(process.num_fds()), "threads": float(process.num_threads()),
                               "rss_mib": process.memory_info().rss / 2**20}
        except psutil.Error:
            continue
    return found


def slope_per_1000(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys on xs, per 1,000 of x (0 when x does not vary)."""
    if len(xs) < 2:
        return 0.0
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return 0.0
    return 1000 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
