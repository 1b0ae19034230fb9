"""Values the run would refuse (or choke on) later are refused when the config is loaded."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from turnkeep.config.loader import ConfigError, _value_type, parse_config
from turnkeep.envs.calc_task import SUPPORTED_OPERATORS
from turnkeep.schemas.config import CALC_OPERATORS, TurnkeepConfig


def _leaf_paths(model: type[BaseModel], wanted: type, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Dotted paths of every field of type `wanted` in the tree (named tables get one entry, `calc`)."""
    paths = []
    for name, field in model.model_fields.items():
        kind = _value_type(field.annotation)
        if get_origin(kind) is dict and isinstance(_value_type(get_args(kind)[1]), type) \
                and issubclass(_value_type(get_args(kind)[1]), BaseModel):
            paths += _leaf_paths(_value_type(get_args(kind)[1]), wanted, (*prefix, name, "calc"))
        elif isinstance(kind, type) and issubclass(kind, BaseModel):
            paths += _leaf_paths(kind, wanted, (*prefix, name))
        elif kind is wanted:
            paths.append((*prefix, name))
    return paths


def _nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for key in reversed(path):
        value = {key: value}
    return value


FLOAT_FIELDS = _leaf_paths(TurnkeepConfig, float)
PATH_FIELDS = _leaf_paths(TurnkeepConfig, Path)


def test_the_tree_has_the_floats_and_paths_these_tests_walk() -> None:
    assert ("snapshot", "lease_s") in FLOAT_FIELDS and ("environments", "calc", "weight") in FLOAT_FIELDS
    assert ("run", "run_dir") in PATH_FIELDS and ("temporal", "tls_ca") in PATH_FIELDS


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, "inf", "nan"])
@pytest.mark.parametrize("path", FLOAT_FIELDS, ids=".".join)
def test_every_float_in_the_config_must_be_finite(path: tuple[str, ...], bad: Any) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_nested(path, bad))
    assert f"{'.'.join(path)} = " in str(err.value) and "use a finite number" in str(err.value)


def test_a_startup_fault_delay_must_be_finite() -> None:
    # env.startup_faults is a wire model (schemas/wire.py), which refuses inf and nan the same way.
    plan = {"delay_s": {"prepare": math.inf}}
    with pytest.raises(ConfigError, match="env.startup_faults.delay_s.prepare = inf: .* use a finite number"):
        parse_config({"env": {"fault_injection": True, "startup_faults": plan}})
    assert parse_config({"env": {"fault_injection": True, "startup_faults": {"delay_s": {"prepare": 3.0}}}})


def test_the_defaults_pass_the_configs_own_rules() -> None:
    # Defaults are not validated by pydantic: validating them explicitly proves none relies on inf, nan or "".
    defaults = TurnkeepConfig()
    assert TurnkeepConfig.model_validate(defaults.model_dump()) == defaults


def test_the_config_mirrors_the_calculators_operators() -> None:
    assert sorted(CALC_OPERATORS) == sorted(SUPPORTED_OPERATORS)


@pytest.mark.parametrize("operators", ["+/", "x", "", "+ -"])
def test_unsupported_operators_are_refused_at_load(operators: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"task": {"operators": operators}})
    assert f"task.operators = {operators!r}" in str(err.value) and "subset of '+-*'" in str(err.value)


@pytest.mark.parametrize("operators", ["+", "-", "*", "+-", "+-*", "*-+"])
def test_supported_operators_load(operators: str) -> None:
    assert parse_config({"task": {"operators": operators}}).task.operators == operators


def test_an_empty_environments_table_is_refused_with_how_to_declare_one() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"environments": {}})
    message = str(err.value)
    assert "environments: at least one environment is needed" in message
    assert '[environments.calc] with kind = "calc"' in message
    assert "{}" not in message  # the empty table itself is not echoed back


def test_leaving_environments_out_still_gives_the_calculator() -> None:
    assert list(parse_config({}).environments) == ["calc"]


@pytest.mark.parametrize("path", PATH_FIELDS, ids=".".join)
def test_an_empty_path_is_refused(path: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match=f"{'.'.join(path)} = '': an empty path"):
        parse_config(_nested(path, ""))


@pytest.mark.parametrize(("seed", "ok"), [(0, True), (2**32 - 1, True), (-1, False), (2**32, False)])
def test_the_seed_fits_what_vllm_seeds_numpy_with(seed: int, ok: bool) -> None:
    if ok:
        assert parse_config({"run": {"seed": seed}}).run.seed == seed
    else:
        with pytest.raises(ConfigError, match=f"run.seed = {seed}"):
            parse_config({"run": {"seed": seed}})


def test_an_inflight_limit_below_one_step_is_refused() -> None:
    settings = {"train": {"prompts_per_step": 4}, "rollout": {"max_inflight_groups": 3}}
    with pytest.raises(ConfigError, match="rollout.max_inflight_groups = 3 is below train.prompts_per_step = 4"):
        parse_config(settings)
    settings["rollout"]["max_inflight_groups"] = 4
    assert parse_config(settings).inflight_group_limit() == 4


@pytest.mark.parametrize("path", [("temporal", "namespace"), ("temporal", "address"), ("ray", "address")], ids=".".join)
def test_empty_names_and_addresses_are_refused(path: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match=f"{'.'.join(path)} = ''"):
        parse_config(_nested(path, ""))
