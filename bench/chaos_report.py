"""A chaos run a benchmark starts (`turnkeep chaos` into its own folder, skipped when its report is there) and the
figures benchmarks read from its report: kills, invariants, tokens generated again, restart to first generation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson


def chaos_run(bench: str, run_dir: Path, config: Path, chaos_args: list[str], settings: list[str]) -> dict:
    """`turnkeep chaos --run-dir run_dir --config config *chaos_args --set ...` unless its report exists; the report."""
    report_path = run_dir / "chaos" / "report.json"
    if not report_path.is_file():
        command = [sys.executable, "-m", "turnkeep", "chaos", "--run-dir", str(run_dir), "--config", str(config),
                   *chaos_args]
        for setting in settings:
            command += ["--set", setting]
        print(f"bench {bench}: chaos run in {run_dir}", flush=True)
        subprocess.call(command)
    if not report_path.is_file():
        raise SystemExit(f"turnkeep bench {bench}: the chaos run in {run_dir} wrote no report; see its chaos/ folder "
                         "and the output above")
    return orjson.loads(report_path.read_bytes())


def chaos_figures(report: dict) -> dict:
    counts = report["verdict"]["counts"]
    kills = sum(report["kills_by_point"].values())
    return {"kills": kills, "ok": report["verdict"]["ok"], "tokens_generated": counts["tokens_generated"],
            "tokens_regenerated": counts["tokens_regenerated"], "share": counts["tokens_regenerated_share"],
            "per_kill": round(counts["tokens_regenerated"] / kills, 1) if kills else 0.0,
            "cut_turn_tokens": counts["cut_turn_tokens"], "cut_turn_tokens_kept": counts["cut_turn_tokens_kept"],
            "engine_cut_tokens": counts.get("engine_cut_tokens", 0),
            "restart_median_s": counts["median_restart_to_first_generation_s"],
            "restores_by_source": counts.get("restores_by_source", {})}
