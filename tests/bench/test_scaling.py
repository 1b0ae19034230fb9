import argparse
from pathlib import Path

from turnkeep.bench import scaling
from turnkeep.bench.phase_growth import EXPECTED_GROWTH
from turnkeep.bench.timed_attempt import FINGERPRINT, RUN_ID
from turnkeep.controller.restore.verify import verify_snapshot

PHASES = ("prepare_s", "commit_s", "cut_s", "barrier_s", "publish_s")


def run_tiny_grid(work_dir: Path):
    parser = argparse.ArgumentParser()
    scaling.add_arguments(parser)
    return scaling.run(parser.parse_args(["--agents", "2,20", "--rows", "50,500", "--work-dir", str(work_dir)]))


def test_tiny_grid_times_every_phase_and_publishes_a_snapshot_that_verifies(tmp_path):
    result = run_tiny_grid(tmp_path)

    cells = {(c["agents"], c["rows"]): c for c in result.data["cells"]}
    assert sorted(cells) == [(2, 50), (2, 500), (20, 50), (20, 500)]
    for cell in cells.values():
        assert all(cell[phase] > 0 for phase in PHASES), cell
        assert cell["barrier_s"] <= cell["cut_s"]
        assert 0 <= cell["gc_s"]["barrier"] <= cell["barrier_s"]
        assert set(cell["gc_s"]) == {"prepare", "commit", "cut", "barrier", "publish"}
        assert cell["peak_rss_mb"] > 0
    for agents in (2, 20):
        # The snapshot names a journal position: ten times the rows adds only longer numbers, not 450 rows.
        assert abs(cells[agents, 500]["bytes_written"] - cells[agents, 50]["bytes_written"]) < 1024

    newest = cells[20, 500]
    manifest, problem = verify_snapshot(Path(newest["snapshot_dir"]), RUN_ID, FINGERPRINT)
    assert problem is None
    assert manifest.counts["parked_agents"] == manifest.counts["continuations"] == 20
    assert manifest.counts["data_plane_rows"] == 500
    assert {a.path for a in manifest.artifacts} == {"env/agents.jsonl", "controller/state.json"}

    table_rows = result.table.splitlines()[2:]
    assert len(table_rows) == 4
    assert len(result.notes) >= len(EXPECTED_GROWTH)
    assert set(result.data["growth"]) == set(EXPECTED_GROWTH)


def test_a_reused_work_dir_numbers_new_snapshots_after_the_kept_ones(tmp_path):
    parser = argparse.ArgumentParser()
    scaling.add_arguments(parser)
    args = parser.parse_args(["--agents", "2", "--rows", "10", "--repeats", "2", "--work-dir", str(tmp_path)])
    first = scaling.run(args)
    second = scaling.run(args)

    assert Path(first.data["cells"][0]["snapshot_dir"]).name == "2"
    assert Path(second.data["cells"][0]["snapshot_dir"]).name == "4"
    # keep_latest_k = 2: the first run's snapshots were pruned
    assert sorted(p.name for p in Path(second.data["cells"][0]["snapshot_dir"]).parent.iterdir()) == ["3", "4"]


def test_sizes_accept_thousands_and_refuse_nonsense():
    parser = argparse.ArgumentParser()
    scaling.add_arguments(parser)
    assert parser.parse_args(["--agents", "10, 1k,2.5k"]).agents == [10, 1000, 2500]
    assert parser.parse_args([]).rows == [1000, 10000, 100000, 1000000]
    assert parser.parse_args(["--rows", "1k,1m"]).rows == [1000, 1000000]
    for bad in ("ten", "0"):
        try:
            parser.parse_args(["--rows", bad])
        except SystemExit:
            continue
        raise AssertionError(f"--rows {bad} was accepted")
