import os
import subprocess
import sys
from pathlib import Path

import pytest

from turnkeep.config.loader import ConfigError, check_key_path, load_config, parse_config, parse_overrides

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
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a directory"):
        load_config(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[run]\n")
    with pytest.raises(ConfigError, match="binary.toml cannot be read"):
        load_config(binary)


def test_a_startup_fault_plan_needs_fault_injection(tmp_path) -> None:
    from turnkeep.schemas.config import TurnkeepConfig

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
        [sys.executable, "-m", "turnkeep", "run", "--run-dir", str(run_dir),
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


def test_the_gpu_config_shares_one_gpu_between_the_trainer_and_vllm_and_warm_starts():
    cfg = load_config(REPO / "configs" / "gpu.toml")
    assert (cfg.placement.trainer_gpus, cfg.placement.policy_gpus, cfg.placement.gpus_needed()) == (1, 1, 1)
    assert cfg.placement.share_gpus and cfg.policy.gpu_memory_utilization < 0.5 and cfg.model.tiny.warm_start_steps > 0
    tiny = cfg.model.tiny
    body = tiny.num_layers * (  # attention (GQA) plus the gated MLP, per layer
        tiny.hidden_size * tiny.head_dim * (2 * tiny.num_heads + 2 * tiny.num_kv_heads)
        + 3 * tiny.hidden_size * tiny.intermediate_size)
    assert 300e6 < body < 600e6  # the shape of a 0.5B model


def _config_files() -> list[Path]:
    """Every TOML file in the repo but the package metadata (pyproject.toml)."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("runs", "__pycache__", "node_modules")]
        found += [Path(root) / name for name in files if name.endswith(".toml") and name != "pyproject.toml"]
    return sorted(found)


def test_every_config_file_in_the_repo_loads():
    files = _config_files()
    assert REPO / "configs" / "tiny.toml" in files and REPO / "examples" / "lookup" / "remote.toml" in files
    for path in files:
        load_config(path)


@pytest.mark.parametrize(("dotted", "named", "keys"), [
    ("train.lr.x", "'train.lr' is a single value, not a table, so it has no key 'x'; set it with --set train.lr=VALUE",
     "train's keys: autocast_bf16, clip_eps,"),
    ("run.seed.x.y", "'run.seed' is a single value, not a table, so it has no key 'x'",
     "run's keys: run_dir, seed, steps"),
    ("environments.calc.weight.x", "'environments.calc.weight' is a single value", "environments.calc's keys: entry,"),
    ("rollout_recovery.overrides.judge.x", "'rollout_recovery.overrides.judge' is a single value",
     "--set rollout_recovery.overrides.judge=VALUE"),
    ("train.lrr", "unknown key 'train.lrr': remove it or use one of: autocast_bf16, clip_eps,", "lr, max_grad_norm"),
    ("trainer.lr", "unknown key 'trainer': remove it or use one of: algorithm, data, env, environments, eval,", "train"),
    ("model.tiny.depth.x", "unknown key 'model.tiny.depth': remove it or use one of: demonstrations,", "head_dim"),
    ("env.startup_faults.delay", "unknown key 'env.startup_faults.delay'", "delay_s"),
    ("train..lr", "a key path needs a name between every two dots", "--set train.lr=1e-4"),
])
def test_a_set_key_path_is_checked_against_the_tree_in_one_line(dotted, named, keys):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "configs" / "tiny.toml", {dotted: 1})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--set ") and named in message and keys in message


@pytest.mark.parametrize("dotted", [
    "train.lr", "model.tiny.hidden_size", "environments.calc.kind", "environments.mine.options.depth.limit",
    "rollout_recovery.overrides.calc", "env.startup_faults.delay_s.prepare", "train", "environments",
])
def test_set_key_paths_the_tree_has_pass_the_check(dotted):
    check_key_path(dotted)


def test_a_set_below_a_value_the_file_gives_is_one_line(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[environments.mine]\nkind = "python"\nentry = "m:C"\noptions = { depth = 3 }\n')
    assert load_config(path, {"environments.mine.options.width": 2}).environments["mine"].options == \
        {"depth": 3, "width": 2}
    with pytest.raises(ConfigError) as err:
        load_config(path, {"environments.mine.options.depth.limit": 2})
    assert "\n" not in str(err.value)
    assert "'environments.mine.options.depth' is already 3" in str(err.value)


def test_the_run_command_refuses_a_set_through_a_value_in_one_line_before_starting_anything(tmp_path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "turnkeep", "run", "--run-dir", str(run_dir), "--set", "train.lr.x=1"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("turnkeep: --set train.lr.x: 'train.lr' is a single value"), done.stderr
    assert "clip_eps" in done.stderr
    assert not run_dir.exists()


@pytest.mark.parametrize(("flag", "named"), [
    ("train.lrr=1e-3", "turnkeep: --set train.lrr: unknown key 'train.lrr'"),
    ("=1", "turnkeep: --set '=1': expected KEY=VALUE"),
    ("snapshot.lease_s=inf", "  snapshot.lease_s = 'inf': inf and nan are not allowed; use a finite number"),
    ("task.operators=+/", "  task.operators = '+/': '/' is not supported; use a non-empty subset of '+-*'"),
    ("environments={}", "  environments: at least one environment is needed"),
])
def test_bad_set_flags_stop_the_cli_with_exit_code_2(flag, named, tmp_path, capsys) -> None:
    from turnkeep.cli.main import main

    run_dir = tmp_path / "run"
    assert main(["run", "--run-dir", str(run_dir), "--set", flag]) == 2
    stderr = capsys.readouterr().err
    assert any(line.startswith(named) for line in stderr.splitlines()) and "Traceback" not in stderr, stderr
    assert not run_dir.exists()


def test_set_flags_become_dotted_overrides_with_json_values():
    assert parse_overrides(["train.lr=1e-4", "run.run_dir=runs/x", " snapshot.enabled =false"]) == {
        "train.lr": 1e-4, "run.run_dir": "runs/x", "snapshot.enabled": False}
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_overrides(["train.lr"])
