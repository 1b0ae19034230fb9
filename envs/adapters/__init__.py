"""Environments people already wrote for another ecosystem, trained through one adapter class per ecosystem.

`[environments.<name>] kind = "verifiers" | "nemo_gym" | "openenv"` resolves to the class named here, loaded only
when a run uses it: each ecosystem's package is an optional extra (`pip install 'turnkeep[openenv]'`; NeMo Gym's
servers run in a venv of their own, `scripts/nemo_gym_venv.sh`), and a run that names one without it installed stops
at start-up with the install line. The class is an `Environment` like
the built-in kinds (journaled, snapshotted, retried, fenced), whose `Options` name the ecosystem's environment.
"""

from __future__ import annotations

ADAPTERS: dict[str, tuple[str, str]] = {
    "verifiers": ("turnkeep.envs.adapters.verifiers_env:VerifiersEnvironment", "pip install 'turnkeep[verifiers]'"),
    "nemo_gym": ("turnkeep.envs.adapters.nemo_gym_env:NemoGymEnvironment",
                 "bash scripts/nemo_gym_venv.sh (the resources server runs in a venv of its own)"),
    "openenv": ("turnkeep.envs.adapters.openenv_env:OpenEnvEnvironment", "pip install 'turnkeep[openenv]'"),
}
"""kind: (the adapter class's entry, what installs what it needs)."""
