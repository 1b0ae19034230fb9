"""[placement] as Ray reservations: who sits in which bundle, and a refusal with the numbers."""

from __future__ import annotations

import pytest

from turnkeep.schemas.config_services import PlacementConfig
from turnkeep.workers.ray_cluster.gpu_placement import PlacementError, Seat, actor_options, check_gpus, plan_gpus


def test_separate_gpus_get_a_bundle_each_and_shared_ones_half_of_one():
    apart = plan_gpus(PlacementConfig(trainer_gpus=2, policy_gpus=1))
    assert apart.bundles == [{"GPU": 2.0}, {"GPU": 1.0}]
    assert (apart.trainer, apart.policy) == (Seat(0, 2.0), Seat(1, 1.0))
    shared = plan_gpus(PlacementConfig(trainer_gpus=1, policy_gpus=1, share_gpus=True))
    assert shared.bundles == [{"GPU": 1.0}] and shared.trainer == shared.policy == Seat(0, 0.5)
    vllm_only = plan_gpus(PlacementConfig(policy_gpus=1))
    assert vllm_only.bundles == [{"GPU": 1.0}] and vllm_only.trainer is None and vllm_only.policy == Seat(0, 1.0)


def test_a_process_without_gpus_asks_for_none():
    assert actor_options(PlacementConfig(policy_gpus=1), None, "trainer") == {"num_gpus": 0}
    assert actor_options(PlacementConfig(), None, "policy") == {"num_gpus": 0}


def test_more_gpus_than_the_cluster_has_is_refused_with_both_numbers():
    with pytest.raises(PlacementError) as err:
        check_gpus(PlacementConfig(trainer_gpus=1, policy_gpus=2), cluster_gpus=2)
    message = str(err.value)
    assert "asks for 3 GPU(s) (trainer 1 + policy server 2)" in message and "has 2" in message
    assert "placement.trainer_gpus" in message
    check_gpus(PlacementConfig(trainer_gpus=1, policy_gpus=1, share_gpus=True), cluster_gpus=1)  # fits


def test_a_run_asking_for_more_gpus_than_this_machine_has_stops_in_one_line_before_anything_starts(
        tmp_path, capsys, monkeypatch):
    """Its own Ray would get this machine's GPUs: refused before Temporal and Ray start or the run directory is
    made (it was refused after both had started, leaving run.json, a database and a Ray folder behind)."""
    import torch

    from turnkeep.cli.main import main

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # a one-GPU machine, wherever the suite runs
    run_dir = tmp_path / "run"
    code = main(["run", "--run-dir", str(run_dir), "--steps", "1", "--set", "placement.trainer_gpus=1",
                 "--set", "placement.policy_gpus=1"])
    assert code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert ("[placement] asks for 2 GPU(s) (trainer 1 + policy server 1), but this machine (the run starts its own "
            "Ray here) has 1") in line, line
    assert not run_dir.exists()


def test_each_engine_gets_its_own_bundle_and_a_replacement_the_same_one() -> None:
    plan = plan_gpus(PlacementConfig(trainer_gpus=1, policy_gpus=2), engines=3)
    assert plan.bundles == [{"GPU": 1.0}, {"GPU": 2.0}, {"GPU": 2.0}, {"GPU": 2.0}]
    assert plan.engines == [Seat(1, 2.0), Seat(2, 2.0), Seat(3, 2.0)]
    with pytest.raises(PlacementError, match=r"trainer 1 \+ policy server 2 x 3 engines.*has 4"):
        check_gpus(PlacementConfig(trainer_gpus=1, policy_gpus=2), cluster_gpus=4, engines=3)


def test_cpu_engines_spread_over_the_nodes_when_asked(monkeypatch) -> None:
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # the suite's shared stack may run Ray in-process
    assert actor_options(PlacementConfig(), None, "policy", engine=1, engines=2, spread=True) == {
        "num_gpus": 0, "scheduling_strategy": "SPREAD"}
    assert actor_options(PlacementConfig(), None, "policy", engine=1, engines=2) == {"num_gpus": 0}


def test_each_trainer_rank_gets_its_own_bundle_before_the_engines() -> None:
    plan = plan_gpus(PlacementConfig(trainer_gpus=1, policy_gpus=1), engines=2, ranks=2)
    assert plan.bundles == [{"GPU": 1.0}] * 4
    assert plan.trainer_ranks == [Seat(0, 1.0), Seat(1, 1.0)] and plan.engines == [Seat(2, 1.0), Seat(3, 1.0)]
    assert PlacementConfig(trainer_gpus=1, policy_gpus=1).gpus_needed(engines=2, ranks=2) == 4
    with pytest.raises(PlacementError, match=r"asks for 3 GPU\(s\) \(trainer 1 x 2 ranks \+ policy server 1\).*has 2"):
        check_gpus(PlacementConfig(trainer_gpus=1, policy_gpus=1), cluster_gpus=2, ranks=2)
    assert actor_options(PlacementConfig(policy_gpus=1), None, "trainer", ranks=2, rank=1) == {"num_gpus": 0}
