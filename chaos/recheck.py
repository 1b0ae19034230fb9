"""`turnkeep chaos --recheck`: the invariants of an earlier chaos run checked again from its audit log, with this
version's checker, and its report's verdict and figures rewritten (the rounds, what was killed and when, stay as
they were). For a chaos run measured before a checker fix: the run is not repeated, only judged again."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import orjson

from turnkeep.chaos.verdict import check_run_dir
from turnkeep.primitives.atomic_files import atomic_write_bytes

REPORT = Path("chaos") / "report.json"


def recheck(run_dir: Path) -> int:
    path = run_dir / REPORT
    try:
        report = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as err:
        print(f"turnkeep chaos: --recheck needs the run directory of a chaos run ({path}: {err})", file=sys.stderr)
        return 2
    verdict = check_run_dir(run_dir, newest_snapshot_problems=report.get("newest_snapshot_problems", []),
                            snapshot_checks=report.get("snapshot_checks", 0))
    counts = verdict.counts
    report.update({
        "verdict": verdict.to_dict(),
        "restores_by_source": dict(sorted(counts.restores_by_source.items())),
        "median_restart_to_first_generation_s": counts.median_restart_to_first_generation_s,
        "tokens_regenerated": counts.tokens_regenerated, "tokens_generated": counts.tokens_generated,
        "tokens_regenerated_share": counts.tokens_regenerated_share, "tokens_discarded": counts.tokens_discarded,
        "ok": verdict.ok and not report.get("failures"), "rechecked_unix_s": time.time(),
    })
    atomic_write_bytes(path, orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(verdict.format())
    print(f"\nturnkeep chaos: {'PASS' if report['ok'] else 'FAIL'} (checked again; {path} rewritten)")
    return 0 if report["ok"] else 1
