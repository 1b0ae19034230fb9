#!/usr/bin/env bash
# Install what is missing, then train on the embedded default. Extra arguments go to `turnkeep run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/turnkeep run --config configs/tiny.toml "$@"
