"""Keeps the run's own Ray head alive across a controller crash, and no longer than that.

`turnkeep run` starts this process in a session of its own (`workers.ray_cluster.head`); it runs
`ray start --head --block` as its child, so Ray, its workers and vLLM's engine all live
in this session and none of them in the controller's. A SIGKILL of the controller (the
OOM killer, a bug) therefore leaves the trainer, the policy server and the environment
server running for the next controller to re-attach to.

It stops the whole session when
- it gets SIGTERM or SIGINT (the controller's own stop),
- the controller has been dead for `--survive-controller-s` and no new one started: nobody
  came back, so the GPUs and memory are handed back,
- Ray's head process exits.

The controller is the process named in `<run_dir>/pids/controller.json`; a new controller
writes that file before it looks for Ray, which resets the wait.

A controller that hangs without dying (SIGSTOPped, its event loop stuck) stops its heartbeat
(`primitives.heartbeat`): after `--controller-hang-s` without one, the keeper SIGKILLs it by pid, so it cannot
come back beside the next controller, with one line here and a `hang` line in metrics.jsonl; from then on it is a
dead controller, waited for as above.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from turnkeep.primitives.atomic_files import append_jsonl
from turnkeep.primitives.heartbeat import beat_file, silent_for
from turnkeep.primitives.pid_files import live_pid
from turnkeep.schemas.choices import MetricsKind

POLL_S = 0.5
TERM_GRACE_S = 10.0
"""SIGTERM first, so vLLM and Ray close their shared memory and sockets; SIGKILL after this."""
CONTROLLER_STOP_GRACE_S = 2.0
"""The same after the controller's own stop, which already stopped the processes that have anything to save."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.ray_cluster.keeper")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--survive-controller-s", type=float, required=True)
    parser.add_argument("--controller-hang-s", type=float, default=None)
    parser.add_argument("ray_args", nargs=argparse.REMAINDER, help="after --: the arguments of `ray start`")
    args = parser.parse_args(argv)
    ray_args = args.ray_args[1:] if args.ray_args[:1] == ["--"] else args.ray_args
    stop_signal: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: stop_signal.append(number))
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", *ray_args])
    reason = _watch(head, args.run_dir, args.survive_controller_s, stop_signal, args.controller_hang_s)
    _say(f"stopping the run's Ray head and everything in its session: {reason}")
    # The controller's own stop comes after it stopped the environment server and the policy server in order (the
    # journals synced, the engine shut down): what is left holds nothing to save, and a short grace will do.
    stopped = stop_session(exclude={os.getpid()}, grace_s=CONTROLLER_STOP_GRACE_S if stop_signal else TERM_GRACE_S)
    _say(f"stopped {stopped} processes")
    return 0


def _watch(head: subprocess.Popen, run_dir: Path, survive_s: float, stop_signal: list[int],
           hang_s: float | None = None) -> str:
    orphaned_since: float | None = None
    while True:
        if stop_signal:
            return f"signal {signal.Signals(stop_signal[0]).name} (the controller's stop)"
        if head.poll() is not None:
            return f"Ray's head process exited with {head.returncode}"
        controller = live_pid(run_dir, "controller")
        if controller is not None and hang_s is not None:
            controller = kill_if_hung(run_dir, controller, hang_s)
        if controller is None:
            orphaned_since = orphaned_since if orphaned_since is not None else time.monotonic()
            if time.monotonic() - orphaned_since >= survive_s:
                return (f"the controller died and no new one started within ray.survive_controller_s = "
                        f"{survive_s:g} s")
        else:
            orphaned_since = None
        time.sleep(POLL_S)


def kill_if_hung(run_dir: Path, pid: int, hang_s: float) -> int | None:
    """`pid`, or None once it is killed for a heartbeat `hang_s` old."""
    silent_s = silent_for(beat_file(run_dir, "controller"))
    if silent_s is None or silent_s < hang_s:
        return pid
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    why = f"no heartbeat for {silent_s:.0f}s (ray.controller_hang_s = {hang_s:g})"
    _say(f"the controller (pid {pid}) hangs: {why}; killed it, the run's processes wait for the next one")
    append_jsonl(run_dir / "metrics.jsonl", {
        "kind": MetricsKind.HANG, "t": round(time.time(), 3), "target": "controller", "pid": pid,
        "probe": "heartbeat", "hang_s": hang_s, "why": why})
    return None


def stop_session(exclude: set[int], grace_s: float = TERM_GRACE_S) -> int:
    """SIGTERM every other process of this session (and their children); once the workers (actors, vLLM's engine)
    are gone, or after `grace_s`, SIGKILL what is left. Ray's own daemons hold nothing the run needs and take ten
    seconds or more over SIGTERM (measured: gcs_server, raylet, `ray start --block` still there after 10 s), so
    waiting for them only delays every stop."""
    victims = _session_processes(os.getsid(0), exclude)
    for process in victims:
        _signal(process, signal.SIGTERM)
    workers = [process for process in victims if not _ray_daemon(process)]
    _, alive_workers = psutil.wait_procs(workers, timeout=grace_s)
    alive = [process for process in victims if process.is_running()]
    for process in alive:
        _signal(process, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace_s)
    if alive_workers:
        _say(f"{len(alive_workers)} workers did not stop within {grace_s:g} s of SIGTERM and were killed")
    return len(victims)


RAY_DAEMONS = ("/ray/core/src/ray/", "ray.scripts.scripts", "/ray/_private/", "/ray/dashboard/", "/ray/autoscaler/",
               "ray::RuntimeEnvAgent", "ray::DashboardAgent")
"""Command-line marks of Ray's own processes (GCS, raylet, `ray start`, monitors, agents), as opposed to workers."""


def _ray_daemon(process: psutil.Process) -> bool:
    try:
        cmdline = " ".join(process.cmdline())
    except psutil.Error:
        return True  # gone already: nothing to wait for
    return any(mark in cmdline for mark in RAY_DAEMONS)


def _session_processes(sid: int, exclude: set[int]) -> list[psutil.Process]:
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter():
        try:
            if process.pid not in exclude and os.getsid(process.pid) == sid:
                found[process.pid] = process
                # A child that made a session of its own (some engines do) goes too.
                found.update({child.pid: child for child in process.children(recursive=True)})
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return [p for pid, p in found.items() if pid not in exclude]


def _signal(process: psutil.Process, signum: int) -> None:
    try:
        process.send_signal(signum)
    except psutil.Error:
        pass


def _say(message: str) -> None:
    print(f"ray_keeper: {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
