"""The soak benchmark's samples and slopes: a real process found by its pid file, a leak measured per 1,000."""

from __future__ import annotations

import os

from turnkeep.bench.soak_samples import sample_processes, slope_per_1000
from turnkeep.primitives.pid_files import write_pid_file


def test_a_process_of_the_run_is_sampled_by_its_pid_file_and_an_unknown_role_is_not(tmp_path):
    write_pid_file(tmp_path, "controller", os.getpid())
    write_pid_file(tmp_path, "not-a-role", os.getpid())
    sampled = sample_processes(tmp_path)
    assert list(sampled) == ["controller"]
    assert sampled["controller"]["fds"] >= 3 and sampled["controller"]["threads"] >= 1
    assert sampled["controller"]["rss_mib"] > 1


def test_slopes_per_thousand_attempts():
    attempts = [100.0, 200.0, 300.0, 400.0]
    assert slope_per_1000(attempts, [50.0, 50.0, 50.0, 50.0]) == 0.0  # flat
    assert slope_per_1000(attempts, [10.0, 11.0, 12.0, 13.0]) == 10.0  # one descriptor per 100 attempts: a leak
    assert slope_per_1000([5.0, 5.0], [1.0, 2.0]) == 0.0 and slope_per_1000([1.0], [1.0]) == 0.0
