"""The benchmarks that read a finished run: lower bound, memory, recovery (on synthetic files)."""

from __future__ import annotations

import argparse

import orjson

from turnkeep.bench import lower_bound, memory, recovery


def write_lines(path, lines) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


def test_lower_bound_compares_each_attempt_with_its_slowest_turn_plus_write_time(tmp_path) -> None:
    """The slowest turn comes from the audit log (the hold event and the server's turn commits); the product's own
    `agents_parked_s` (here 9 s, far off) is shown beside it but never enters the bound."""
    from tests.bench.test_turn_bound import committed, hold, started
    from turnkeep.primitives.audit_log import AUDIT_FILE

    attempts = [{"kind": "snapshot", "checkpoint_id": f"r.snapshot.20.{n}", "outcome": "published",
                 "admission_closed_s": 0.5, "agents_parked_s": 9.0, "bytes_written": 1 << 20} for n in (1, 2)]
    write_lines(tmp_path / "on", [*attempts, {"kind": "snapshot", "outcome": "skipped"}])
    events = [started(1.0, "g1.0.0"), hold(5.0, "taken", "r.snapshot.20.1"), committed(5.2, "g1.0.0", 1),
              hold(5.5, "released", "r.snapshot.20.1")]
    (tmp_path / "on" / AUDIT_FILE).write_bytes(b"".join(orjson.dumps(e.model_dump(mode="json")) + b"\n"
                                                        for e in events))
    result = lower_bound.run(argparse.Namespace(run_dir=tmp_path / "on", out=tmp_path))
    [first, second] = result.data["attempts"]
    speed = result.data["disk_write_mib_s"]
    assert speed > 0
    assert first["slowest_turn_s"] == 0.2 and first["product_parked_s"] == 9.0
    assert first["lower_bound_s"] == round(0.2 + 1 / speed, 4)
    assert first["ratio"] == round(0.5 / (0.2 + 1 / speed), 2)
    assert second["slowest_turn_s"] == 0.0  # no closure of its own in the log
    assert "closed / lower bound" in result.table


def test_memory_lists_every_process_role_of_both_runs(tmp_path) -> None:
    write_lines(tmp_path / "off", [{"kind": "memory", "peak_rss_mib_by_role": {"trainer": 900, "controller": 600}}])
    write_lines(tmp_path / "on", [{"kind": "memory", "peak_rss_mib_by_role": {"trainer": 910, "Temporal dev server": 150}}])
    result = memory.run(argparse.Namespace(run_dirs=[tmp_path / "off", tmp_path / "on"], out=tmp_path))
    rows = result.table.splitlines()
    assert rows[2].startswith("| trainer | 900 | 910")
    assert any(row.startswith("| Temporal dev server | 0 | 150") for row in rows)
    assert rows[-1] == "| sum of peaks | 1500 | 1060 |"


def test_recovery_reads_a_chaos_report(tmp_path) -> None:
    counts = {"restores_by_source": {"snapshot": 3, "trainer_checkpoint": 2}, "median_restart_to_first_generation_s": 30.5,
              "restart_to_first_generation_s": {"2": 30.0, "3": 31.0}, "tokens_regenerated": 10,
              "tokens_generated": 1000, "tokens_regenerated_share": 0.01, "continuations_restored": 4,
              "continuations_sealed": 4, "restores_continuing_agents": 4, "tokens_discarded": {"stale": 50}}
    (tmp_path / "chaos" / "chaos").mkdir(parents=True)
    (tmp_path / "chaos" / "chaos" / "report.json").write_bytes(orjson.dumps(
        {"kills_by_point": {"cut": 2, "training": 3}, "verdict": {"ok": True, "counts": counts}}))
    result = recovery.run(argparse.Namespace(chaos_dir=tmp_path / "chaos", out=tmp_path, set=[], kills=0))
    assert "| kills | 5 |" in result.table
    assert "snapshot 3, trainer_checkpoint 2" in result.table and "10 of 1000 (1.00%)" in result.table
    assert "| restores that continued in-flight agents | 4 |" in result.table
    assert "| tokens in groups discarded whole, never trained | stale 50 (5.0%) |" in result.table
