"""The run's own local Ray, in a session of its own so that it outlives a controller crash.

Started through `workers.ray_cluster.keeper` (which stops it when the controller is gone for good)
and recorded in `<run_dir>/pids/ray.json` with its address. A restarted controller finds
it there: the very process (pid and start time) still running and its address answering,
it joins that Ray instead of starting one; otherwise the leftover is stopped and a new
head starts.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from turnkeep.config.loader import ConfigError
from turnkeep.primitives.pid_files import live_record, write_pid_file
from turnkeep.primitives.process_tree import kill_tree
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.ray_cluster.temp_dir import prepare_ray_temp_dir

log = logging.getLogger("turnkeep.run")

RAY_ROLE = "ray"
KEEPER_LOG = "ray_keeper.log"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 40.0
ADDRESS_FILE = "ray_current_cluster"
"""Ray writes the head's address here under its temp dir once the head node is up."""


class RayHeadError(ConfigError):
    """The run's Ray head did not start; one line naming its log."""


@dataclass(frozen=True)
class RayHead:
    address: str
    pid: int
    """The keeper's pid (`workers.ray_cluster.keeper`), the leader of the head's session."""
    reused: bool
    """Left running by an earlier controller and joined again."""


def start_or_find_head(cfg: TurnkeepConfig, run_dir: Path) -> RayHead:
    record = live_record(run_dir, RAY_ROLE)
    if record is not None:
        address = str(record.get("address", ""))
        if _answers(address):
            log.info("joining this run directory's Ray (keeper pid %s at %s), left running by an earlier controller",
                     record["pid"], address)
            return RayHead(address, int(record["pid"]), reused=True)
        log.warning("stopping this run directory's leftover Ray (keeper pid %s): %s does not answer",
                    record["pid"], address or "no address recorded")
        kill_tree(int(record["pid"]))
    return _start(cfg, run_dir)


def stop_head(head: RayHead, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the keeper (it stops its whole session); SIGKILL the session if it takes longer than `timeout_s`."""
    try:
        keeper = psutil.Process(head.pid)
        keeper.send_signal(signal.SIGTERM)
        keeper.wait(timeout_s)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        log.warning("the run's Ray did not stop within %.0f s; killing its session", timeout_s)
        kill_tree(head.pid)


def _start(cfg: TurnkeepConfig, run_dir: Path) -> RayHead:
    temp_dir = prepare_ray_temp_dir(run_dir)
    address_file = temp_dir / ADDRESS_FILE
    address_file.unlink(missing_ok=True)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    ray_args = [
        "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
        "--num-cpus", str(cfg.ray.num_cpus or os.cpu_count()), "--temp-dir", str(temp_dir),
        "--include-dashboard", "false", "--disable-usage-stats",
        # No autoscaler: the run's own head is one machine that never grows, and its monitor process is half a
        # second of CPU taken from the trainer's and vLLM's imports on every start.
        "--no-monitor",
    ]
    log_path = run_dir / KEEPER_LOG
    with open(log_path, "ab") as out:
        keeper = subprocess.Popen(
            [sys.executable, "-m", "turnkeep.workers.ray_cluster.keeper", "--run-dir", str(run_dir),
             "--survive-controller-s", str(cfg.ray.survive_controller_s),
             *(["--controller-hang-s", str(cfg.ray.controller_hang_s)] if cfg.ray.controller_hang_s else []),
             "--", *ray_args],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    write_pid_file(run_dir, RAY_ROLE, keeper.pid, address=address)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (address_file.exists() and _answers(address)):
        if keeper.poll() is not None:
            raise RayHeadError(f"the run's Ray head exited with {keeper.returncode} while starting; see {log_path}")
        if time.monotonic() > deadline:
            kill_tree(keeper.pid)
            raise RayHeadError(f"the run's Ray head did not start within {START_TIMEOUT_S:.0f} s; see {log_path}")
        time.sleep(0.2)
    return RayHead(address, keeper.pid, reused=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            return True
    except OSError:
        return False
