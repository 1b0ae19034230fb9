"""[placement] as Ray reservations: who sits in which bundle, and a refusal with the numbers."""

from __future__ import annotations

import pytest

from schemas.config_services import PlacementConfig
from workers.ray_cluster.gpu_placement import PlacementError, Seat, actor_options, check_gpus, plan_gpus


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


@pytest.mark.integration
def test_a_run_asking_for_a_gpu_on_a_machine_without_one_stops_in_one_line(stack_config):
    import torch

    from tests.run_command import short_run_dir, small_run_settings, turnkeep

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")  # never on the CPU machines that run the suite
    run_dir = short_run_dir("tk-gpu-")
    log = run_dir.parent / "turnkeep.log"
    settings = [*small_run_settings(stack_config), "--set", "placement.trainer_gpus=1", "--set", "temporal.port=0",
                "--set", "temporal.ui_port=0"]
    proc = turnkeep("run", "--run-dir", str(run_dir), "--steps", "1", *settings, log=log)
    assert proc.wait(timeout=120) == 2, log.read_text()[-2000:]
    output = log.read_text()
    assert "turnkeep: [placement] asks for 1 GPU(s) (trainer 1 + policy server 0), but the Ray cluster has 0" in output
    assert "Traceback" not in output
