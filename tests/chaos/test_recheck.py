"""`turnkeep chaos --recheck`: an earlier chaos run judged again from its audit log with this version's checker;
its report's verdict and figures are rewritten, its rounds kept."""

import orjson

from tests.chaos.invariants.history import PARTIAL_TOKENS, healthy_with_a_journal_restore
from turnkeep.cli.main import main
from turnkeep.primitives.audit_log import AUDIT_FILE
from turnkeep.schemas.audit import Restored, RowRef, RunEnded


def _audit_with_a_turn_the_kill_left_unwritten() -> list:
    """Incarnation 3 killed while g5.0.0 streamed its second turn; the audit lost that turn's commit and seal, but
    the restore holds g5.0.0's row: the turn finished (an older checker counted its tokens as generated again)."""
    row = RowRef(group_id="g0000005", sibling=0, rollout_id="g0000005.0.0")
    return [e.model_copy(update={"rows": [*e.rows, row], "continuations": []})
            if isinstance(e, Restored) and e.inc == 4 else e
            for e in healthy_with_a_journal_restore() if not (isinstance(e, RunEnded) and e.inc == 3)]


def test_a_recheck_rewrites_the_verdict_and_keeps_the_rounds(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "chaos").mkdir(parents=True)
    events = _audit_with_a_turn_the_kill_left_unwritten()
    lines = b"".join(orjson.dumps(e.model_dump(mode="json")) + b"\n" for e in events)
    (run_dir / AUDIT_FILE).write_bytes(lines)
    stale = {"rounds": [{"incarnation": 1, "outcome": "killed"}], "failures": [], "ok": True, "snapshot_checks": 0,
             "newest_snapshot_problems": [], "tokens_regenerated": PARTIAL_TOKENS,
             "verdict": {"counts": {"cut_turn_tokens": PARTIAL_TOKENS}}}
    (run_dir / "chaos" / "report.json").write_bytes(orjson.dumps(stale))
    assert main(["chaos", "--recheck", "--run-dir", str(run_dir)]) == 0
    report = orjson.loads((run_dir / "chaos" / "report.json").read_bytes())
    assert report["rounds"] == stale["rounds"] and report["rechecked_unix_s"] > 0
    counts = report["verdict"]["counts"]
    assert counts["cut_turn_tokens"] == 0 and report["tokens_regenerated"] == counts["tokens_regenerated"]
    assert "PASS (checked again" in capsys.readouterr().out


def test_a_recheck_without_a_chaos_report_is_one_line(tmp_path, capsys):
    assert main(["chaos", "--recheck", "--run-dir", str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("turnkeep chaos: --recheck needs the run directory of a chaos run")
