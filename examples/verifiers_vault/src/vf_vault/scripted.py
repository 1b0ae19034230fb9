"""Scripted turns for turnkeep's made-up tiny model (`options.demo_script = "vf_vault.scripted:turns"`): read each
named key with the tool, then answer; `WRONG` of them make one mistake (a wrong digit, or a guess without reading)."""

from __future__ import annotations

import json
import random

from vf_vault import VaultData

WRONG = 0.5


def turns(task: VaultData, rng: random.Random) -> list[str]:
    digits = [str(task.vault[key]) for key in task.asked]
    reads = [_read(key) for key in task.asked]
    if rng.random() < WRONG:
        at = rng.randrange(len(digits))
        digits[at] = str((int(digits[at]) + rng.choice([1, 2, 3])) % 10)
        if rng.random() < 0.5:
            reads = reads[:at]
    return [*reads, "".join(digits)]


def _read(key: str) -> str:
    return "<tool_call>" + json.dumps({"name": "vault_read", "arguments": {"key": key}}) + "</tool_call>"
