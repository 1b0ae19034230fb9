"""A timed restart's phases and its CPU seconds by kind of process (`turnkeep bench restart`), from what the run
wrote and what the machine's process table says."""

from __future__ import annotations

import re

PHASES = {
    "process": "controller process started",
    "run_started": "run directory opened (`run_started`)",
    "ray": "Ray's head up and joined",
    "temporal": "Temporal up (started beside Ray)",
    "trainer": "trainer loaded",
    "engines": "engines ready (vLLM imported, engine core forked, model loaded)",
    "env_server": "environment server up",
    "recovered": "recovery done (`cancel_stale`, choose, restore, weights loaded, workers up)",
    "first_step": "first train step (an undone step trained again)",
    "first_turn": "first generated turn",
}
"""Each phase, in the order a restart reaches them, and the words for it in the table."""

ROLES = [
    ("trainer", re.compile(r"ray::TrainerActor|ray::TrainerRank")),
    ("policy front end", re.compile(r"ray::PolicyActor")),
    ("engine core", re.compile(r"VLLM::EngineCore")),
    ("engine forkserver", re.compile(r"multiprocessing\.forkserver|multiprocessing\.resource_tracker")),
    ("environment server", re.compile(r"ray::EnvServerActor")),
    ("Temporal", re.compile(r"temporal server start-dev")),
    ("controller", re.compile(r"cli\.main run|bin/turnkeep run")),
    ("Ray", re.compile(r"/ray/|ray::|workers\.ray_cluster\.keeper|ray\.scripts|ray\.util\.client")),
]
"""Kinds of process by command line, the first that matches (a Ray worker named for its actor before Ray's own)."""


def phases_of(began_unix_s: float, startup: dict | None, events: list[dict]) -> dict[str, float | None]:
    """Seconds from `began_unix_s` (the command) to each phase: the controller's marks (seconds from its process's
    start), then the first `restored`, `step_trained` and `turn_committed` of the incarnation's audit events."""
    phases: dict[str, float | None] = dict.fromkeys(PHASES)
    if startup is not None:
        offset = startup["process_start_unix_s"] - began_unix_s
        phases["process"] = round(offset, 2)
        for phase, seconds in startup["seconds"].items():
            if phase in phases:
                phases[phase] = round(offset + seconds, 2)
    for phase, event in (("first_step", "step_trained"), ("first_turn", "turn_committed")):
        first = next((e["t"] for e in events if e["event"] == event), None)
        phases[phase] = None if first is None else round(first - began_unix_s, 2)
    return phases


def cpu_by_role(processes: list[tuple[str, float]]) -> dict[str, float]:
    """CPU seconds summed by kind of process; a process of no known kind counts as `other`."""
    totals: dict[str, float] = {}
    for cmdline, cpu_s in processes:
        role = next((name for name, pattern in ROLES if pattern.search(cmdline)), "other")
        totals[role] = round(totals.get(role, 0.0) + cpu_s, 2)
    return totals
