#!/usr/bin/env bash
# Make the venv NeMo Gym's resources servers run in (idempotent): nemo-gym needs Python >= 3.12 and turnkeep's venv
# is 3.11, so the `nemo_gym` adapter starts a server with this venv's python, as NeMo Gym runs each server in a venv
# of its own anyway. Usage: scripts/nemo_gym_venv.sh [VENV_DIR] (default .venvs/nemo_gym); prints the python.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venvs/nemo_gym}"
NEMO_GYM_VERSION="0.4.0"
# nemo-gym 0.4.0 is the newest release for Python 3.12.1 (0.5 needs 3.13.14): python3.12 on PATH, else pyenv's.
is_312() { "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; }
PYTHON="${PYTHON:-python3.12}"
if ! is_312 "$PYTHON"; then  # a pyenv shim answers `command -v` without a 3.12 selected: ask pyenv's folder
  for found in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python; do is_312 "$found" && PYTHON="$found"; done
fi
is_312 "$PYTHON" || { echo "nemo_gym_venv.sh: no Python 3.12 found; set PYTHON=/path/to/python3.12" >&2; exit 1; }
stamp="$VENV/.turnkeep-nemo-gym-installed"
want="nemo-gym==$NEMO_GYM_VERSION $(sha256sum scripts/nemo_gym_venv.sh | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
"$VENV/bin/python" -m pip install --quiet "nemo-gym==$NEMO_GYM_VERSION" >&2
"$VENV/bin/python" -c "import nemo_gym, resources_servers" >&2
echo "$want" > "$stamp"
echo "$VENV/bin/python"
