"""What `turnkeep plot` draws, gathered from a run directory: train steps (reward, rollout
tokens/s) and snapshot attempts from `metrics.jsonl`, restores and deaths from `audit.jsonl`,
all on one wall-clock axis.

Lines written before metrics carried their time (`t`) take it from the audit log: a train
step from the `step_trained` event of the same step, in order; a published attempt from its
`snapshot_published` event (older failed attempts are left out). An incarnation whose log ends without
`run_ended` died there: that is a kill (or a crash), marked at the last event heard from it.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from turnkeep.primitives.audit_log import read_audit
from turnkeep.schemas.choices import MetricsKind

RESTART_KINDS = {MetricsKind.ENV_RESTART: "env", MetricsKind.TEMPORAL_RESTART: "temporal",
                 MetricsKind.ENGINE_RESTART: "engine", MetricsKind.TRAINER_REBUILD: "trainer"}


@dataclass
class PlotData:
    steps: list[tuple[float, int, float, float]] = field(default_factory=list)
    """(time, step, reward_mean, rollout_tokens_per_s)."""
    attempts: list[dict] = field(default_factory=list)
    """start, end, admission (start, end) or None, trainer_wait_s, outcome."""
    restores: list[tuple[float, str, int]] = field(default_factory=list)
    """(time, source, step)."""
    deaths: list[tuple[float, int]] = field(default_factory=list)
    """(time last heard, incarnation)."""
    restarts: list[tuple[float, str]] = field(default_factory=list)
    """(time, process): a process the run started again itself and went on (`env`, `temporal`)."""
    evals: list[tuple[float, int, float]] = field(default_factory=list)
    """(time, evaluated step, held-out pass@1)."""


def gather_plot_data(run_dir: Path) -> PlotData:
    run_dir = Path(run_dir)
    events = list(read_audit(run_dir)) if (run_dir / "audit.jsonl").exists() else []
    trained_at: dict[int, deque[float]] = defaultdict(deque)
    published_at: dict[str, float] = {}
    for event in events:
        if event.event == "step_trained":
            trained_at[event.step].append(event.t)
        elif event.event == "snapshot_published":
            published_at[event.checkpoint_id] = event.t
    data = PlotData()
    for line in _metrics_lines(run_dir / "metrics.jsonl"):
        if line.get("kind") == MetricsKind.TRAIN_STEP:
            when = trained_at[line["step"]].popleft() if trained_at[line["step"]] else None
            t = line.get("t", when)
            if t is not None:
                data.steps.append((t, line["step"], line.get("reward_mean", 0.0), line.get("rollout_tokens_per_s", 0.0)))
        elif line.get("kind") == MetricsKind.EVAL and line.get("t") is not None and "pass@1" in line:
            data.evals.append((float(line["t"]), line["step"], float(line["pass@1"])))
        elif line.get("kind") in RESTART_KINDS and (t := line.get("t", line.get("unix_s"))) is not None:
            data.restarts.append((float(t), RESTART_KINDS[line["kind"]]))
        elif line.get("kind") == MetricsKind.SNAPSHOT:
            t = line.get("t", published_at.get(line.get("checkpoint_id")))
            if t is not None:
                data.attempts.append(_attempt_span({**line, "t": t}))
    data.restores = [(e.t, str(e.source), e.step) for e in events if e.event == "restored"]
    data.deaths = _deaths(events)
    return data


def _metrics_lines(path: Path) -> list[dict]:
    try:
        raw = path.read_bytes().splitlines()
    except OSError:
        return []
    lines = []
    for line in raw:
        try:
            value = orjson.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(value, dict):
            lines.append(value)
    return lines


def _attempt_span(line: dict) -> dict:
    end = float(line["t"])
    start = end - float(line.get("wall_s") or 0.0)
    phases = line.get("phase_s") or {}
    closed = float(line.get("admission_closed_s") or 0.0)
    # Admission closes when gym.prepare starts (after preflight and the trainer hold).
    closes = start + float(phases.get("preflight", 0.0)) + float(phases.get("trainer_hold", 0.0))
    return {"start": start, "end": end, "admission": (closes, closes + closed) if closed else None,
            "trainer_wait_s": float(line.get("trainer_wait_s") or 0.0), "outcome": line.get("outcome")}


def _deaths(events: list) -> list[tuple[float, int]]:
    last: dict[int, float] = {}
    ended: set[int] = set()
    for event in events:
        last[event.inc] = max(last.get(event.inc, event.t), event.t)
        if event.event == "run_ended":
            ended.add(event.inc)
    newest = max(last, default=0)
    return [(t, inc) for inc, t in sorted(last.items()) if inc not in ended and inc != newest]
