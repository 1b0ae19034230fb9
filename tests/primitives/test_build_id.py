"""The workers' build id follows turnkeep's own loaded code, and nothing else loaded."""

from __future__ import annotations

import sys
import types

from turnkeep.primitives.build_id import code_build_id


def _build_id() -> str:
    code_build_id.cache_clear()
    return code_build_id()


def test_the_build_id_changes_with_turnkeeps_code_and_not_with_other_modules(tmp_path, monkeypatch) -> None:
    before = _build_id()
    assert before.startswith("turnkeep-") and before == _build_id()
    foreign = types.ModuleType("not_turnkeep_at_all")
    foreign.__file__ = str(tmp_path / "foreign.py")
    (tmp_path / "foreign.py").write_text("x = 1\n")
    monkeypatch.setitem(sys.modules, "not_turnkeep_at_all", foreign)
    assert _build_id() == before
    ours = types.ModuleType("turnkeep.primitives.a_module_of_ours")
    ours.__file__ = str(tmp_path / "ours.py")
    (tmp_path / "ours.py").write_text("x = 1\n")
    monkeypatch.setitem(sys.modules, "turnkeep.primitives.a_module_of_ours", ours)
    with_ours = _build_id()
    assert with_ours != before
    (tmp_path / "ours.py").write_text("x = 2\n")
    assert _build_id() != with_ours
    code_build_id.cache_clear()

