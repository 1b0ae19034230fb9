"""A node that lacks a module the run imports, or has another version of turnkeep, vLLM, torch or Ray, is named
with what it lacks (the two-node cluster test runs the check against real nodes that have everything)."""

from __future__ import annotations

from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.ray_cluster.node_checks import installed, modules_needed, problems


def test_every_node_that_lacks_something_is_named_with_it() -> None:
    here = {"missing": [], "versions": {"turnkeep": "0.1.0", "vllm": "0.32.0", "torch": "2.13.0", "ray": "2.60.0"}}
    fine = {"missing": [], "versions": dict(here["versions"])}
    stale = {"missing": ["my_envs.lookup"], "versions": {**here["versions"], "vllm": "0.31.0"}}
    found = problems(here, {"127.0.0.2": fine, "127.0.0.3": stale})
    assert found == ["node 127.0.0.3: my_envs.lookup (not importable), vllm 0.31.0 (this machine has 0.32.0)"]


def test_the_modules_asked_for_include_each_python_environments_own() -> None:
    cfg = TurnkeepConfig.model_validate({"environments": {
        "calc": {"kind": "calc"}, "mine": {"kind": "python", "entry": "my_envs.lookup:Lookup"}}})
    assert modules_needed(cfg)[-1] == "my_envs.lookup" and "vllm" in modules_needed(cfg)
    here = installed(["turnkeep.envs.env_actor", "no_such_module_here"])
    assert here["missing"] == ["no_such_module_here"] and here["versions"]["ray"]
