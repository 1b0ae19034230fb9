"""The `node`, `rank` and `freeze-engine` targets: what they find of the run, and when the run counts as repaired. The
cluster here is a stand-in with one real process as its node (the real two-node cluster is in
tests/chaos/test_runner_nodes.py)."""

import subprocess
import sys
import time
from pathlib import Path

import psutil

from turnkeep.chaos.report import Round, build_report, format_report
from turnkeep.chaos.targets import NODE, Kill, kill_target, parse_targets, repaired
from turnkeep.chaos.verdict import check_invariants
from turnkeep.primitives.pid_files import write_pid_file
from turnkeep.primitives.process_tree import kill_tree


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


class _OneProcessNode:
    """The second node's process tree is one process: the engine the run placed there."""

    def __init__(self) -> None:
        self.worker = _sleeper()

    def worker_node_pids(self) -> set[int]:
        return {self.worker.pid}

    def lose_worker_node(self) -> int:
        return kill_tree(self.worker.pid)


def test_every_includes_the_node():
    assert NODE in parse_targets("every")


def test_a_node_kill_without_a_cluster_finds_nothing(tmp_path: Path):
    assert kill_target(NODE, tmp_path, root_pid=0) == Kill(0, None, NODE)


def test_a_node_kill_names_what_the_run_lost_with_it_and_waits_for_its_replacement(tmp_path: Path):
    node, trainer = _OneProcessNode(), _sleeper()
    write_pid_file(tmp_path, "policy.1", node.worker.pid, url="http://127.0.0.3:8123")
    write_pid_file(tmp_path, "trainer", trainer.pid)
    replacement = None
    try:
        kill = kill_target(NODE, tmp_path, root_pid=0, cluster=node)
        node.worker.wait(timeout=10)
        assert (kill.killed, kill.role, kill.lost) == (1, NODE, {"policy.1": node.worker.pid})
        assert kill.lost_urls == {"policy.1": "http://127.0.0.3:8123"}  # where it served, from its pid file
        assert not repaired(tmp_path, kill)  # the engine's pid file names the dead process
        replacement = _sleeper()
        write_pid_file(tmp_path, "policy.1", replacement.pid)
        assert repaired(tmp_path, kill)
    finally:
        for process in (trainer, replacement):
            if process is not None:
                process.kill()


def test_a_node_that_held_none_of_the_run_is_repaired_once_the_run_trains(tmp_path: Path):
    node = _OneProcessNode()
    kill = kill_target(NODE, tmp_path, root_pid=0, cluster=node)
    node.worker.wait(timeout=10)
    assert kill.lost == {} and repaired(tmp_path, kill)


def test_the_report_counts_what_went_with_the_node():
    rounds = [Round(1, "random", "repaired", None, 40.0, 3, target=NODE, after_kill_s=31.0, lost=["policy.1"]),
              Round(1, "random", "repaired", None, 20.0, 2, target=NODE, after_kill_s=9.0, lost=[])]
    verdict = check_invariants([])
    report = build_report(meta={"kills_requested": 2}, rounds=rounds, final=Round(1, "none", "finished", 0, 5.0),
                          verdict=verdict, snapshot_problems=[], snapshot_checks=0)
    assert report["lost_with_node"] == {"policy.1": 1}
    assert report["repair_s_by_target"] == {NODE: 31.0}
    assert "run processes lost with the node: policy.1 1" in format_report(report, verdict)


def test_a_rank_kill_takes_one_trainer_rank_and_waits_for_the_new_groups(tmp_path: Path):
    rank0, rank1, engine = _sleeper(), _sleeper(), _sleeper()
    write_pid_file(tmp_path, "trainer", rank0.pid)
    write_pid_file(tmp_path, "trainer.rank1", rank1.pid)
    write_pid_file(tmp_path, "policy", engine.pid)
    replacement = None
    try:
        kill = kill_target("rank", tmp_path, root_pid=0)
        rank1.wait(timeout=10)
        assert (kill.killed, kill.role, kill.pid) == (1, "trainer.rank1", rank1.pid)
        assert rank0.poll() is None and engine.poll() is None  # a rank kill takes the rank alone
        assert not repaired(tmp_path, kill)
        replacement = _sleeper()
        write_pid_file(tmp_path, "trainer.rank1", replacement.pid)  # the run's new group
        assert repaired(tmp_path, kill)
    finally:
        for process in (rank0, engine, replacement):
            if process is not None:
                process.kill()


def test_a_rank_kill_in_a_one_rank_run_finds_nothing(tmp_path: Path):
    trainer = _sleeper()
    write_pid_file(tmp_path, "trainer", trainer.pid)
    try:
        assert kill_target("rank", tmp_path, root_pid=0).killed == 0 and trainer.poll() is None
    finally:
        trainer.kill()


def test_a_freeze_stops_the_engine_core_of_an_engine_and_waits_for_the_engines_replacement(tmp_path: Path):
    # The engine's actor is a process whose child is titled as vLLM titles its engine core.
    actor = subprocess.Popen(["bash", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' VLLM::EngineCore "
                                            "& wait"])
    replacement = None
    try:
        core = _child_titled(actor.pid, "VLLM::EngineCore")
        write_pid_file(tmp_path, "policy", actor.pid)
        kill = kill_target("freeze-engine", tmp_path, root_pid=0)
        assert (kill.killed, kill.pid, kill.role) == (1, actor.pid, "policy")
        stopped = time.monotonic() + 5  # the signal lands a moment later
        while psutil.Process(core).status() != psutil.STATUS_STOPPED and time.monotonic() < stopped:
            time.sleep(0.02)
        assert psutil.Process(core).status() == psutil.STATUS_STOPPED  # stopped, not killed: the run must notice
        assert not repaired(tmp_path, kill)
        replacement = _sleeper()
        write_pid_file(tmp_path, "policy", replacement.pid)
        assert not repaired(tmp_path, kill)  # its core still stopped
        stopped_core = psutil.Process(core)
        stopped_core.kill()
        psutil.wait_procs([stopped_core], timeout=5)
        assert repaired(tmp_path, kill)
        assert "freeze-engine" in parse_targets("every")
    finally:
        kill_tree(actor.pid)
        if replacement is not None:
            replacement.kill()


def test_a_frozen_process_counts_as_repaired_only_once_it_is_killed_and_replaced(tmp_path: Path):
    """`freeze-env` SIGSTOPs the process its pid file names; a replacement beside the stopped process is no repair
    (it could come back half-way), the frozen one killed and a replacement running is."""
    frozen, replacement = _sleeper(), None
    try:
        write_pid_file(tmp_path, "env", frozen.pid)
        kill = kill_target("freeze-env", tmp_path, root_pid=0)
        assert (kill.killed, kill.pid, kill.role, kill.frozen) == (1, frozen.pid, "env", [frozen.pid])
        stopped = time.monotonic() + 5
        while psutil.Process(frozen.pid).status() != psutil.STATUS_STOPPED and time.monotonic() < stopped:
            time.sleep(0.02)
        assert psutil.Process(frozen.pid).status() == psutil.STATUS_STOPPED
        replacement = _sleeper()
        write_pid_file(tmp_path, "env", replacement.pid)
        assert not repaired(tmp_path, kill)
        frozen.kill()
        frozen.wait()
        assert repaired(tmp_path, kill)
        every = parse_targets("every")
        assert {"freeze-env", "freeze-temporal", "freeze-controller"} <= set(every) and "freeze-rank" not in every
        assert kill_target("freeze-temporal", tmp_path, root_pid=0).killed == 0  # no Temporal pid file: nothing
    finally:
        frozen.kill()
        if replacement is not None:
            replacement.kill()


def _child_titled(pid: int, title: str) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [p.pid for p in psutil.Process(pid).children(recursive=True) if title in " ".join(p.cmdline())]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no child titled {title}")
