"""Handles of the run's processes, as the controller reaches them.

`workers.placement` starts the processes and fills this in; the controller only uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Processes:
    trainer: object
    policy: object
    env: object
    model_dir: Path
    policy_url: str
    env_url: str
    control_token: str
    """Bearer token of the participants' `/checkpoint/*` routes."""
