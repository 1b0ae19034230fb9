"""docs/config.md is what `turnkeep config-docs` makes of schemas/config.py: every key, with its docstring."""

import subprocess
import sys
from pathlib import Path

from turnkeep.cli.config_docs import config_reference
from turnkeep.schemas.config import TurnkeepConfig

ROOT = Path(__file__).resolve().parents[2]


def _config_docs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turnkeep", "config-docs", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_the_committed_reference_is_what_the_schema_gives() -> None:
    checked = _config_docs("--check")
    assert checked.returncode == 0, checked.stderr


def test_every_key_is_in_it_with_its_docstring() -> None:
    text = config_reference()
    for section, field in TurnkeepConfig.model_fields.items():
        assert f"`[{section}" in text, section
    assert "| `engines` | integer | `1` |" in text  # policy.engines
    assert "| `tiny.demonstrations` |" in text  # a nested table's keys
    assert "| `token_file` | path or none | none | remote only:" in text  # environments.<name>.token_file


def test_a_stale_reference_fails_the_check_and_a_rewrite_fixes_it(tmp_path: Path) -> None:
    out = tmp_path / "config.md"
    out.write_text("# old\n")
    stale = _config_docs("--check", "--out", str(out))
    assert stale.returncode == 1 and "run `turnkeep config-docs`" in stale.stderr
    assert _config_docs("--out", str(out)).returncode == 0
    assert _config_docs("--check", "--out", str(out)).returncode == 0
    missing = _config_docs("--out", str(tmp_path / "absent" / "config.md"))
    assert missing.returncode == 2 and "no folder" in missing.stderr
