"""The house's rules, checked by the suite: the import contracts in pyproject.toml ([tool.importlinter], run by
import-linter over the installed layout) hold and each one catches a violation made on purpose, no import inside a
function gets around them, no product file is over 400 lines and no product function over 60."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
FOLDERS = PYPROJECT["tool"]["turnkeep"]["folders"]
CONTRACTS = PYPROJECT["tool"]["importlinter"]["contracts"]
PRODUCT = [*FOLDERS, "turnkeep"]
MAX_LINES = 400
MAX_FUNCTION_LINES = 60

_spec = importlib.util.spec_from_file_location("lint_imports", REPO / "scripts" / "lint_imports.py")
lint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lint)

VIOLATIONS = {
    "layers": ("schemas/violation.py", "turnkeep.controller.errors"),
    "workflows-import-only-schemas": ("workflows/violation.py", "turnkeep.primitives.holds"),
    "gpu-side-never-imports-the-controller": ("gpu_workers/violation.py", "turnkeep.controller.errors"),
    "no-task-below-the-plugins": ("controller/violation.py", "turnkeep.envs.tool_calls"),
    "environments-stand-alone": ("envs/violation.py", "turnkeep.workers.prompts"),
    "shared-pieces-import-nothing-above": ("participants/violation.py", "turnkeep.controller.errors"),
    "processes-never-import-the-tools": ("workers/violation.py", "turnkeep.cli.main"),
    "env-server-needs-no-trainer": ("envs/server.py", "torch"),
}
"""For each contract: a file (new, or one of the tree's) and an import that breaks it, made on purpose in a copy of
that file's folder."""


def test_every_import_contract_holds(tmp_path):
    result = lint.lint_imports([], lint.build_view(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"{len(CONTRACTS)} kept, 0 broken" in result.stdout


def test_every_contract_catches_a_violation_made_on_purpose(tmp_path):
    assert {c["id"] for c in CONTRACTS} == set(VIOLATIONS), "give each contract a violation here"
    copies = {}
    for file, target in VIOLATIONS.values():
        folder, _, name = file.partition("/")
        copy = copies.setdefault(folder, tmp_path / "copies" / folder)
        if not copy.exists():
            shutil.copytree(REPO / folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
        with (copy / name).open("a") as out:
            out.write(f"\nimport {target}\n")
    result = lint.lint_imports([], lint.build_view(tmp_path / "view", replaced=copies))
    assert result.returncode != 0
    for contract in CONTRACTS:
        # import-linter pads or wraps a contract's line: compare without whitespace
        broken = "".join(contract["name"].split()) + "BROKEN"
        assert broken in "".join(result.stdout.split()), (contract["id"], result.stdout[-3000:])


def _layer_ranks() -> dict[str, int]:
    layers = next(c for c in CONTRACTS if c["id"] == "layers")["layers"]
    return {name.strip(): len(layers) - i for i, layer in enumerate(layers) for name in layer.split("|")}


def _late_imports(path: Path, root: Path = REPO) -> list[tuple[int, list[str]]]:
    """(line, modules) of each import inside a function body of `path` (a file of the tree at `root`)."""
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom):
                found.append((node.lineno, [f"turnkeep.{path.relative_to(root).parts[0]}" if node.level else node.module]))
            elif isinstance(node, ast.Import):
                found.append((node.lineno, [alias.name for alias in node.names]))
    return sorted(set((line, tuple(modules)) for line, modules in found))


def _says_why(lines: list[str], line: int) -> bool:
    """A comment on the import's line, or on a line of the run of imports and comments just above it (one comment
    explains a block of late imports)."""
    index = line - 1
    while index >= 0 and lines[index].strip().startswith(("import ", "from ", "#")):
        if "#" in lines[index]:
            return True
        index -= 1
    return False


def test_no_import_inside_a_function_gets_around_a_contract(root: Path = REPO):
    """A late import names a module of its own folder or of a lower layer, or says why it must be late (a heavy or
    optional dependency, a process that must not load it): a late import up the house hides an arrow the contracts
    forbid."""
    ranks = _layer_ranks()
    unexplained = []
    for folder in FOLDERS:
        for path in (root / folder).rglob("*.py"):
            lines = path.read_text().splitlines()
            for line, modules in _late_imports(path, root):
                for module in modules:
                    parts = module.split(".")
                    ours = parts[0] == "turnkeep" and len(parts) > 1
                    if ours and (parts[1] == folder or ranks[parts[1]] < ranks[folder]):
                        continue
                    if not _says_why(lines, line):
                        unexplained.append(f"{path.relative_to(root)}:{line} imports {module}")
    assert not unexplained, "import at the top, or say on the line why it must be late:\n" + "\n".join(unexplained)


def test_the_late_import_finder_sees_one_made_on_purpose(tmp_path):
    # In a copy of the tree's schemas folder, so its folder is a layer and the tree itself is never written (another
    # test worker reads it meanwhile).
    shutil.copytree(REPO / "schemas", tmp_path / "schemas", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "schemas" / "violates_late.py"
    path.write_text("def f():\n    from turnkeep.controller import errors\n    return errors\n")
    assert _late_imports(path, tmp_path) == [(2, ("turnkeep.controller",))]
    with pytest.raises(AssertionError, match="violates_late.py:2 imports turnkeep.controller"):
        test_no_import_inside_a_function_gets_around_a_contract(tmp_path)


def _product_files() -> list[Path]:
    return [path for folder in PRODUCT for path in (REPO / folder).rglob("*.py")]


def test_no_product_file_is_over_400_lines():
    long = {str(path.relative_to(REPO)): lines for path in _product_files()
            if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by responsibility: {long}"


def test_no_product_function_is_over_60_lines():
    long = [f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in _product_files() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "name the steps of these:\n" + "\n".join(long)


def test_every_import_of_turnkeeps_code_names_turnkeep():
    """From the repository's folder `import envs...` would still find the folder, and hide a module left behind the
    move under `turnkeep` until a wheel install fails."""
    old = set(FOLDERS)
    stale = []
    for path in [*_product_files(), *(REPO / "tests").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            stale += [f"{path.relative_to(REPO)}:{node.lineno} {name}" for name in names if name.split(".")[0] in old]
    assert not stale, "import these as turnkeep.<folder>...:\n" + "\n".join(stale)
