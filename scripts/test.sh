#!/usr/bin/env bash
# Install what is missing, then run the whole test suite: the unit tier first, stopping at its first failure (a
# broken build fails in about 2 minutes) on two pytest workers (pytest-xdist), then the integration tier in one
# process: two whole runs side by side can start two Ray instances at once, and one of them once joined the other's
# GCS (an authentication error at start). Arguments go to pytest; one that selects tests itself (-m, -k, a path)
# runs that selection alone, in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/nemo_gym_venv.sh >/dev/null  # the NeMo Gym adapter's tests start a resources server from it
export RAY_AUTH_MODE=disabled
for arg in "$@"; do
  case "$arg" in
    -m|-k|-m*|-k*|tests*|*.py|*::*) exec .venv/bin/python -m pytest "$@" ;;
  esac
done
.venv/bin/python -m pytest -m "not integration" -x -n 2 "$@"
exec .venv/bin/python -m pytest -m integration "$@"
