"""A run over its own environment server and two stand-alone ones (`turnkeep env-server`,
each its own process): snapshots hold each server's agents separately, a remote server
killed and restarted mid-run costs nothing but its in-flight rollouts, and a restore of
the whole run hands each server back exactly its own agents."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.run_command import metrics, short_run_dir, small_run_settings, train_steps, turnkeep, wait_until
from turnkeep.chaos.verdict import check_run_dir
from turnkeep.primitives.audit_log import read_audit
from turnkeep.schemas.participant import SavedAgent

pytestmark = pytest.mark.integration

REMOTES = {"remote_a": "turnkeep.envs.calc_env:CalcEnvironment", "remote_b": "turnkeep.envs.workspace_env:WorkspaceEnvironment"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env_server(entry: str, port: int, token_file: Path, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnkeep", "env-server", "--entry", entry, "--port", str(port),
         "--token-file", str(token_file), "--tool-latency-s", "0.5"],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    wait_until(lambda: "serving" in log.read_text(), 60, f"env-server {entry}", proc)
    return proc


def snapshot_dirs(run_dir: Path) -> list[Path]:
    return [Path(m["snapshot_dir"]) for m in metrics(run_dir, "snapshot") if m["outcome"] == "published"]


def saved_agents(folder: Path) -> list[SavedAgent]:
    path = folder / "agents.jsonl"
    return [SavedAgent.model_validate_json(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_two_remote_servers_and_the_local_one_snapshot_restore_and_survive_a_kill(stack_config) -> None:
    run_dir = short_run_dir("tk-remote-")
    root = run_dir.parent
    ports = {name: free_port() for name in REMOTES}
    servers: dict[str, subprocess.Popen] = {}
    environments = {"calc": {"kind": "calc"}}
    for name, entry in REMOTES.items():
        environments[name] = {"kind": "remote", "url": f"http://127.0.0.1:{ports[name]}",
                              "token_file": str(root / f"{name}.token")}
    settings = [*small_run_settings(stack_config), "--set", f"environments={orjson.dumps(environments).decode()}",
                "--set", "env.absence_warn_s=2", "--set", "snapshot.max_consecutive_failures=10",
                # Slow tools keep agents mid-episode, so every snapshot has some parked on each server.
                "--set", "env.tool_latency_s=0.5"]
    log = root / "turnkeep.log"
    run = None
    try:
        for name, entry in REMOTES.items():
            servers[name] = env_server(entry, ports[name], root / f"{name}.token", root / f"{name}.log")
        run = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1000", *settings, log=log)
        wait_until(lambda: train_steps(run_dir) >= 3 and snapshot_dirs(run_dir), 300, "3 steps and a snapshot", run)

        # Kill remote_a alone, keep it away past the warning, and start it again on the same port.
        servers["remote_a"].kill()
        servers["remote_a"].wait()
        killed_at_step = train_steps(run_dir)
        time.sleep(6)
        servers["remote_a"] = env_server(REMOTES["remote_a"], ports["remote_a"], root / "remote_a.token",
                                         root / "remote_a.log")
        published_before = len(snapshot_dirs(run_dir))

        def remote_agents_parked_after_the_return() -> bool:
            # A snapshot taken at a quiet moment parks nobody; the restore below needs one that parked some.
            published = snapshot_dirs(run_dir)
            return (train_steps(run_dir) >= killed_at_step + 3 and len(published) > published_before
                    and sum(len(saved_agents(published[-1] / name)) for name in REMOTES) > 0)

        wait_until(remote_agents_parked_after_the_return, 300,
                   "training and a published snapshot with remote agents parked after remote_a came back", run)
        output = log.read_text()
        # remote_a's rollouts that its death cut off ran again once it was back, spending no attempts.
        assert metrics(run_dir, "train_step")[-1]["retries_total"] == 0, metrics(run_dir, "train_step")[-1]
        # The remote servers keep no turn journal, so `snapshot.agents = "auto"` parks, and says why once.
        assert output.count("turnkeep: warning: snapshots park the running agents") == 1, output[-3000:]
        assert "environment server(s) ['remote_a', 'remote_b'] keep no turn journal" in output
        assert re.search(r"environment server remote_a \(http://127\.0\.0\.1:\d+\) has been away for", output)
        assert "re-attached environment server remote_a" in output or "remote_a is back" in output

        # Each server's agents are saved separately, under its own name.
        newest = snapshot_dirs(run_dir)[-1]
        for name, envs in (("env", {"calc"}), ("remote_a", {"remote_a"}), ("remote_b", {"remote_b"})):
            assert {a.request.problem.env for a in saved_agents(newest / name)} <= envs, name

        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        stopped_at = train_steps(run_dir)
        restart = turnkeep("run", "--run-dir", str(run_dir), "--steps", str(stopped_at + 2), *settings, log=log)
        assert restart.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        for proc in [run, *servers.values()]:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    [restored] = [e for e in read_audit(run_dir) if e.event == "restored"]
    assert restored.source == "snapshot", restored.reason
    chosen = Path(restored.snapshot_dir)
    assert sum(len(saved_agents(chosen / name)) for name in REMOTES) > 0, "the restored snapshot parked no remote agent"
    for name in REMOTES:
        # The remote server was handed exactly the agents its own folder of the chosen snapshot holds.
        expected = len(saved_agents(chosen / name))
        held = re.findall(r"restored (\d+) saved agents", (root / f"{name}.log").read_text())
        assert held and int(held[-1]) == expected, (name, held, expected)
    # ...and continued them from their saved turns: rows of remote environments sealed on a restored prefix.
    events = list(read_audit(run_dir))
    env_of = {e.group_id: e.env for e in events if e.event == "group_admitted"}
    continued = {env_of.get(e.group_id) for e in events if e.event == "sibling_sealed" and e.resumed_turn > 0}
    assert continued & set(REMOTES), continued
    failed = [m for m in metrics(run_dir, "snapshot") if m["outcome"] == "failed" and "remote_a" in m.get("reason", "")]
    assert failed, "no attempt ran while remote_a was away; the test needs one"
    verdict = check_run_dir(run_dir)
    assert verdict.ok, verdict.format()
