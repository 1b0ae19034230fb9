"""A run against a Temporal server started outside turnkeep (the dev server binary in its own
process stands in for docker-compose.yml's): it works end to end, it survives that server
restarting mid-run, and an unreachable one is named in one line before anything starts."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from cli.main import main
from schemas.config_services import TemporalConfig
from tests.run_command import metrics, short_run_dir, small_run_settings, train_steps, turnkeep, wait_until
from workers.temporal.dev_server import start_dev_server, stop_dev_server
from workers.temporal.ports import free_port


def test_an_unreachable_temporal_is_named_in_one_line_and_nothing_is_written(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    port = free_port("127.0.0.1")
    config.write_text(f'[run]\nrun_dir = "{run_dir}"\n[temporal]\naddress = "127.0.0.1:{port}"\n')
    assert main(["run", "--config", str(config)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"temporal.address = '127.0.0.1:{port}': no Temporal server answers" in line
    assert "docker compose up -d" in line
    assert not run_dir.exists()


def test_a_missing_tls_file_is_named(tmp_path, capsys) -> None:
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\nrun_dir = "{tmp_path / "run"}"\n[temporal]\naddress = "127.0.0.1:1"\n'
                      f'tls_cert = "{tmp_path / "client.pem"}"\ntls_key = "{tmp_path / "client.key"}"\n')
    assert main(["run", "--config", str(config)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "temporal.tls_cert" in line and "cannot be read" in line


@pytest.mark.integration
def test_a_run_on_an_outside_temporal_goes_on_when_that_server_restarts(stack_config) -> None:
    run_dir = short_run_dir("tk-extemporal-")
    server_dir = run_dir.parent / "temporal"
    server_dir.mkdir()
    port = free_port("127.0.0.1")
    server_cfg = TemporalConfig(port=port, ui_port=0)
    server = asyncio.run(start_dev_server(server_cfg, server_dir))
    log = run_dir.parent / "turnkeep.log"
    settings = [*small_run_settings(stack_config), "--set", f"temporal.address=127.0.0.1:{port}",
                "--set", "snapshot.max_consecutive_failures=10"]
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=log)
    try:
        wait_until(lambda: _published(run_dir) > 0, 300, "a published snapshot", proc)
        # The run keeps nothing of Temporal's: no embedded server, no database in its directory.
        assert not (run_dir / "temporal.db").exists()
        steps_before = train_steps(run_dir)
        published_before = _published(run_dir)
        server.process.kill()  # the server dies mid-run, as a restarted container would
        server.process.wait()
        time.sleep(5)
        server = asyncio.run(start_dev_server(server_cfg, server_dir))  # same port, same database
        wait_until(lambda: train_steps(run_dir) >= steps_before + 4 and _published(run_dir) > published_before,
                   300, "training and a new snapshot after the restart", proc)
        os.kill(proc.pid, signal.SIGTERM)  # a scheduler's stop: the final snapshot goes through the new server
        assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        stop_dev_server(server)
    outcomes = [m["outcome"] for m in metrics(run_dir, "snapshot")]
    # Every attempt ended with an outcome and a reason: the one cut off by the restart failed or finished cleanly.
    assert all(m["reason"] for m in metrics(run_dir, "snapshot") if m["outcome"] != "published"), outcomes
    assert outcomes.count("published") >= 2, outcomes
    assert "preempted at step" in log.read_text()


def _published(run_dir: Path) -> int:
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    return sum(m["outcome"] == "published" for m in metrics(run_dir, "snapshot"))
