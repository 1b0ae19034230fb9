#!/usr/bin/env bash
# Install what is missing, then run the whole test suite (unit and integration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export RAY_AUTH_MODE=disabled
exec .venv/bin/python -m pytest "$@"
