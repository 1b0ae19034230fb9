"""On a user's cluster the warden watches the controller's beats: a controller that is frozen (SIGSTOPped) is
killed by pid on its own node once its beats stopped for `ray.controller_hang_s`, with one `hang` line; one that
beats is left alone."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import orjson
import psutil
import ray

from tests.workers.ray_cluster.test_keeper import BEATING_CONTROLLER
from turnkeep.workers.ray_cluster.warden import stop_warden, warden

HANG_S = 2.0


def test_a_frozen_controller_is_killed_on_its_node_by_the_warden(stack, tmp_path) -> None:
    controller = subprocess.Popen([sys.executable, "-c", BEATING_CONTROLLER, str(tmp_path)])
    handle = warden(survive_s=600.0)
    try:
        while not (tmp_path / "pids" / "controller.beat").exists():
            time.sleep(0.05)
        identity = {"pid": controller.pid, "create_time": psutil.Process(controller.pid).create_time(),
                    "node_id": ray.get_runtime_context().get_node_id(), "run_dir": str(tmp_path), "hang_s": HANG_S}
        for _ in range(int(2 * HANG_S)):  # beating: left alone
            ray.get(handle.beat.remote(identity))
            time.sleep(1.0)
        assert controller.poll() is None
        controller.send_signal(signal.SIGSTOP)  # its beats stop: the file's and the warden's
        assert controller.wait(HANG_S + 15) == -signal.SIGKILL
    finally:
        controller.kill()
        asyncio.run(stop_warden())
    [hang] = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
    assert (hang["kind"], hang["target"], hang["pid"], hang["probe"]) == ("hang", "controller", controller.pid,
                                                                         "heartbeat")
