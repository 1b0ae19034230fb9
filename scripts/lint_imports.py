"""Run import-linter's contracts (pyproject's [tool.importlinter]) over turnkeep as it is installed.

import-linter finds a package's modules by walking its folder, and the folders of the design card sit at the top of
the repository while installed they are `turnkeep.<folder>` (setup.py). So the contracts run over a view: a
temporary `turnkeep/` of links to `turnkeep/*` and to each folder, first on PYTHONPATH.

    .venv/bin/python scripts/lint_imports.py [lint-imports arguments]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def folders(repo: Path = REPO) -> list[str]:
    return tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["turnkeep"]["folders"]


def build_view(view: Path, repo: Path = REPO, replaced: dict[str, Path] | None = None) -> Path:
    """`view/turnkeep` as installed, each entry a link into `repo` (or into `replaced[folder]`); returns `view`."""
    package = view / "turnkeep"
    package.mkdir(parents=True)
    for entry in (repo / "turnkeep").iterdir():
        if entry.suffix == ".py":
            (package / entry.name).symlink_to(entry)
    for folder in folders(repo):
        (package / folder).symlink_to((replaced or {}).get(folder, repo / folder), target_is_directory=True)
    return view


def lint_imports(args: list[str], view: Path) -> subprocess.CompletedProcess:
    """lint-imports from inside `view` (it puts its working folder first on sys.path, and the repository's own
    `turnkeep/` holds none of the folders), with the repository's contracts unless `args` names a `--config`."""
    config = [] if "--config" in args else ["--config", str(REPO / "pyproject.toml")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(view), os.environ.get("PYTHONPATH")]))}
    tool = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(tool), "--no-cache", *config, *args], cwd=view, env=env, capture_output=True,
                          text=True, timeout=300)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="turnkeep-house-") as tmp:
        done = lint_imports(sys.argv[1:], build_view(Path(tmp)))
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
