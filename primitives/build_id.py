"""The build id every Temporal worker of turnkeep reports: turnkeep's own code, not every module loaded.

Temporal's default build id hashes the bytecode of every module in `sys.modules`. In the trainer's and the policy
engines' processes that is torch, transformers and vLLM, and reading transformers' lazy modules imports them: the
first worker of such a process took over a second to construct (py-spy on a restarted trainer: 46 of its 74
samples in `start_temporal_worker` were `load_default_build_id`), on the restart's path. The build id only labels
workers in the UI and in workflow task events (no worker versioning is used), so a digest of turnkeep's loaded
modules, which change when turnkeep's code does, serves.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path


@functools.cache
def code_build_id() -> str:
    """`turnkeep-` and a digest of the source of every turnkeep module this process has loaded."""
    digest = hashlib.sha256()
    for name in sorted(sys.modules):
        if name.split(".")[0] != "turnkeep":
            continue
        path = getattr(sys.modules[name], "__file__", None)
        if path is None:
            continue
        digest.update(name.encode())
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            continue
    return f"turnkeep-{digest.hexdigest()[:16]}"
