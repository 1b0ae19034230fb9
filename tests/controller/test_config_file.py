from pathlib import Path

import pytest

from controller.config_file import ConfigError, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]


def test_every_toml_in_configs_parses():
    tomls = sorted((REPO / "configs").glob("*.toml"))
    assert tomls, "configs/ has no TOML files"
    for path in tomls:
        load_config(path)


def test_unknown_key_names_the_key_and_what_is_allowed():
    with pytest.raises(ConfigError) as err:
        parse_config({"train": {"lrr": 0.1}})
    message = str(err.value)
    assert "unknown key 'train.lrr'" in message
    assert "lr" in message and "clip_eps" in message


def test_unknown_section_is_refused():
    with pytest.raises(ConfigError, match="unknown key 'trainer'"):
        parse_config({"trainer": {}})


def test_bad_value_names_the_key_and_the_bound():
    with pytest.raises(ConfigError) as err:
        parse_config({"rollout": {"group_size": 1}})
    assert "rollout.group_size = 1" in str(err.value)
    assert "greater than or equal to 2" in str(err.value)


def test_head_dim_below_32_is_refused():
    with pytest.raises(ConfigError, match="head_dim"):
        parse_config({"model": {"tiny": {"head_dim": 16, "num_heads": 8}}})


def test_overrides_apply_dotted_keys(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[train]\nlr = 0.001\n")
    cfg = load_config(path, {"train.prompts_per_step": 4, "run.steps": 3})
    assert cfg.train.lr == 0.001
    assert cfg.train.prompts_per_step == 4
    assert cfg.run.steps == 3


def test_missing_file_and_bad_toml_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_a_startup_fault_plan_needs_fault_injection(tmp_path) -> None:
    from schemas.config import TurnkeepConfig

    plan = {"delay_s": {"prepare": 3.0}}
    cfg = TurnkeepConfig.model_validate({"env": {"fault_injection": True, "startup_faults": plan}})
    assert cfg.env.startup_faults.delay_s == {"prepare": 3.0}
    with pytest.raises(ValueError, match="needs env.fault_injection"):
        TurnkeepConfig.model_validate({"env": {"startup_faults": plan}})


def test_the_run_command_refuses_an_override_of_an_unknown_environment_before_starting_anything(tmp_path) -> None:
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", "--run-dir", str(run_dir),
         "--set", 'rollout_recovery.overrides={"jduge": "sibling"}'],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "rollout_recovery.overrides names environment 'jduge'" in done.stderr
    assert not run_dir.exists()


@pytest.mark.parametrize(("settings", "named"), [
    ({"train": {"device": "cuda"}}, "placement.trainer_gpus"),
    ({"placement": {"policy_gpus": 1}, "policy": {"tensor_parallel_size": 2}}, "tensor_parallel_size = 2"),
    ({"placement": {"share_gpus": True, "trainer_gpus": 1}}, "share_gpus"),
    ({"model": {"tiny": {"num_heads": 4, "num_kv_heads": 3}}}, "num_kv_heads"),
    ({"policy": {"gpu_memory_utilization": 1.5}}, "policy.gpu_memory_utilization"),
])
def test_gpu_settings_that_cannot_work_are_refused_with_the_setting_named(settings, named):
    with pytest.raises(ConfigError, match=named):
        parse_config(settings)


def test_the_gpu_config_places_the_trainer_and_vllm_on_their_own_gpus():
    cfg = load_config(REPO / "configs" / "gpu.toml")
    assert (cfg.placement.trainer_gpus, cfg.placement.policy_gpus, cfg.placement.gpus_needed()) == (1, 1, 2)
    tiny = cfg.model.tiny
    body = tiny.num_layers * (  # attention (GQA) plus the gated MLP, per layer
        tiny.hidden_size * tiny.head_dim * (2 * tiny.num_heads + 2 * tiny.num_kv_heads)
        + 3 * tiny.hidden_size * tiny.intermediate_size)
    assert 300e6 < body < 600e6  # the shape of a 0.5B model
