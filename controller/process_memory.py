"""Resident memory of this run's local process tree (controller, Ray, and every actor)."""

from __future__ import annotations

import os

import psutil


def tree_rss_mib(root_pid: int | None = None) -> float:
    """RSS of the process and all its descendants, in MiB; processes that exit meanwhile are skipped."""
    root = psutil.Process(root_pid or os.getpid())
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20
