"""`turnkeep plot RUN_DIR`: one PNG of a run over wall time: reward and rollout tokens/s, each
snapshot attempt as a span (admission closed darker, trainer wait as a tick), held-out pass@1 points, restores,
deaths and the servers the run restarted itself marked. Data from `cli.plot_data`; drawn with matplotlib's file-only backend."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from turnkeep.cli.plot_data import PlotData, gather_plot_data
from turnkeep.primitives.atomic_files import DamagedJsonl
from turnkeep.schemas.choices import Outcome

RESTORE_COLOURS = {"snapshot": "tab:green", "older_snapshot": "tab:olive", "trainer_checkpoint": "tab:orange",
                   "fresh": "tab:gray"}


SHORTEST_SPAN_S = 1.0
"""An attempt shorter than this is drawn as a line: a span that narrow would not show."""


def add_plot_parser(subparsers) -> argparse.ArgumentParser:
    plot = subparsers.add_parser("plot", help="a PNG of reward, throughput, snapshot pauses, restores and kills")
    plot.add_argument("run_dir", type=Path, help="the run directory")
    plot.add_argument("--out", type=Path, help="where to write the PNG (default: RUN_DIR/plot.png)")
    return plot


def run_plot(args: argparse.Namespace) -> int:
    if not (args.run_dir / "run.json").exists():
        print(f"turnkeep: {args.run_dir} is not a run directory (no run.json); pass the --run-dir of a `turnkeep run`",
              file=sys.stderr)
        return 2
    out = args.out or args.run_dir / "plot.png"
    if not out.parent.is_dir():
        print(f"turnkeep: --out {out}: the folder {out.parent} does not exist; make it or pick another --out",
              file=sys.stderr)
        return 2
    try:
        data = gather_plot_data(args.run_dir)
    except DamagedJsonl as err:
        print(f"turnkeep: cannot plot {args.run_dir}: {err}", file=sys.stderr)
        return 2
    if not data.steps:
        print(f"turnkeep: {args.run_dir} has no train step yet; nothing to plot", file=sys.stderr)
        return 2
    figure = build_figure(data, title=str(args.run_dir))
    figure.savefig(out, dpi=110)
    print(f"turnkeep: wrote {out} ({len(data.steps)} steps, {len(data.attempts)} snapshot attempts, "
          f"{len(data.restores)} restores, {len(data.deaths)} deaths)")
    return 0


def build_figure(data: PlotData, title: str = ""):
    import matplotlib  # matplotlib only for `turnkeep plot`: every other command starts without it

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # after the backend is chosen

    origin = min([t for t, *_ in data.steps] + [e["start"] for e in data.attempts] + [t for t, *_ in data.restores])
    minutes = lambda t: (t - origin) / 60.0  # noqa: E731
    figure = Figure(figsize=(12, 6.5), layout="constrained")
    reward_ax, speed_ax = figure.subplots(2, 1, sharex=True)
    for i, segment in enumerate(_segments(data)):
        times = [minutes(t) for t, *_ in segment]
        reward_ax.plot(times, [r for _, _, r, _ in segment], color="tab:blue", marker=".", ms=3,
                       label="reward (mean)" if i == 0 else None)
        speed_ax.plot(times, [s for *_, s in segment], color="tab:purple", marker=".", ms=3,
                      label="rollout tokens/s" if i == 0 else None)
    if data.evals:
        reward_ax.plot([minutes(t) for t, *_ in data.evals], [p for *_, p in data.evals], color="tab:green",
                       marker="D", ms=4, label="held-out pass@1 (eval)")
    for ax in (reward_ax, speed_ax):
        _draw_attempts(ax, data, minutes)
        _draw_restores_and_deaths(ax, data, minutes)
    reward_ax.set_ylabel("reward")
    speed_ax.set_ylabel("rollout tokens/s")
    speed_ax.set_xlabel("wall time (minutes)")
    reward_ax.set_title(title or "turnkeep run")
    reward_ax.legend(loc="lower right", fontsize="small")
    speed_ax.legend(loc="lower right", fontsize="small")
    return figure


def _segments(data: PlotData) -> list[list[tuple[float, int, float, float]]]:
    """The steps in time order, cut wherever a death or a restore falls between two of them: a line never joins
    an incarnation to the next."""
    cuts = sorted([t for t, *_ in data.restores] + [t for t, _ in data.deaths])
    segments: list[list] = []
    for point in sorted(data.steps):
        if segments and not any(segments[-1][-1][0] <= cut < point[0] for cut in cuts):
            segments[-1].append(point)
        else:
            segments.append([point])
    return segments


def _draw_attempts(ax, data: PlotData, minutes) -> None:
    for i, attempt in enumerate(data.attempts):
        failed = attempt["outcome"] not in (Outcome.PUBLISHED, Outcome.PUBLISHED_RELEASE_PENDING, Outcome.SKIPPED)
        colour, label = ("tab:red" if failed else "0.6"), "snapshot attempt" if i == 0 else None
        if attempt["end"] - attempt["start"] < SHORTEST_SPAN_S:
            # An attempt that ended at once (aborted in preflight, say) has no width to fill: a thin line instead.
            ax.axvline(minutes(attempt["start"]), color=colour, alpha=0.6, lw=1.0, label=label)
        else:
            ax.axvspan(minutes(attempt["start"]), minutes(attempt["end"]), color="tab:red" if failed else "0.85",
                       alpha=0.35, lw=0, label=label)
        if attempt["admission"] is not None:
            start, end = attempt["admission"]
            ax.axvspan(minutes(start), minutes(end), color="0.45", alpha=0.45, lw=0,
                       label="admission closed" if not any(a["admission"] for a in data.attempts[:i]) else None)
        if attempt["trainer_wait_s"] > 0:
            first = not any(a["trainer_wait_s"] > 0 for a in data.attempts[:i])
            ax.plot([minutes(attempt["end"])], [0], marker="|", color="tab:brown", ms=8, ls="none",
                    transform=ax.get_xaxis_transform(), label="trainer waited on the hold" if first else None)


def _draw_restores_and_deaths(ax, data: PlotData, minutes) -> None:
    for i, (t, source, step) in enumerate(data.restores):
        ax.axvline(minutes(t), color=RESTORE_COLOURS.get(source, "tab:green"), ls="--", lw=1.2,
                   label="restore (colour: source)" if i == 0 else None)
    for i, (t, inc) in enumerate(data.deaths):
        ax.axvline(minutes(t), color="black", ls=":", lw=1.2, label="process died / killed" if i == 0 else None)
    for i, (t, process) in enumerate(data.restarts):
        ax.axvline(minutes(t), color="tab:cyan", ls="-.", lw=1.0,
                   label="env / Temporal server restarted by the run" if i == 0 else None)
