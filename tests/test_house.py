"""The house's rules, checked by the suite: the import contracts in pyproject.toml ([tool.importlinter], run by
import-linter) hold, a contract does catch an arrow that runs back up, and no product file is over 400 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PRODUCT = ("schemas", "primitives", "participants", "envs", "controller", "activities", "workflows", "gpu_workers",
           "workers", "chaos", "bench", "cli")
MAX_LINES = 400


def _lint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_every_import_contract_holds():
    result = _lint()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


def test_an_arrow_that_runs_back_up_breaks_the_layers(tmp_path):
    # The same tree held to a house with schemas above the controller: the controller's imports of schemas run up.
    config = tmp_path / "upside_down.ini"
    config.write_text("[importlinter]\nroot_packages =\n    schemas\n    controller\n\n"
                      "[importlinter:contract:upside-down]\nname = upside down\ntype = layers\n"
                      "layers =\n    schemas\n    controller\n")
    result = _lint("--config", str(config))
    assert result.returncode != 0
    assert "controller is not allowed to import schemas" in result.stdout


def test_no_product_file_is_over_400_lines():
    long = {str(path.relative_to(REPO)): lines for folder in PRODUCT for path in (REPO / folder).rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by responsibility: {long}"
