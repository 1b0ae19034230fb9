"""`vf-vault`: a verifiers (v1) taskset with a tool, written as any verifiers user writes one.

Every task hides a vault of one-letter keys and one-digit values (in its data, never in the prompt). The prompt
names some keys; the model reads each value with the `vault_read` tool (an MCP toolset, one per rollout, whose state
counts the reads), then answers the values in order as digits. Two rewards score it: `correct` (0.8: the answer) and
`read_all` (0.2: every named key was read).

Install with `pip install -e examples/verifiers_vault`; `vf-eval vf-vault` or turnkeep's `kind = "verifiers"`,
`env_id = "vf-vault"` load it by its id.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Literal

import verifiers.v1 as vf

__all__ = ["VaultConfig", "VaultData", "VaultState", "VaultTask", "VaultTaskset", "Vault"]

KEYS = "abcdefgh"


class VaultConfig(vf.TasksetConfig):
    count: int = 200
    """Tasks in the taskset."""
    split: Literal["train", "eval"] = "train"
    """Which tasks: the two splits draw from different seeds."""
    keys_per_task: int = 2
    """Keys a prompt names."""
    vault_size: int = 4
    """Keys in a task's vault (the others are distractors)."""


class VaultData(vf.TaskData):
    vault: dict[str, int]
    """The hidden key -> digit table."""
    asked: list[str]
    """The keys the prompt names, in order."""


class VaultState(vf.State):
    reads: list[str] = []
    """Keys read so far in this rollout."""


class Vault(vf.Toolset[vf.ToolsetConfig, VaultState]):
    """The vault's reader: one server per rollout, set up with its task."""

    def __init__(self, config: vf.ToolsetConfig) -> None:
        super().__init__(config)
        self.vault: dict[str, int] = {}

    async def setup_task(self, task: VaultData) -> None:
        self.vault = dict(task.vault)

    @vf.tool
    async def read(self, key: str) -> str:
        """Read the digit stored under a one-letter key."""
        self.state.reads = [*self.state.reads, key]
        value = self.vault.get(key)
        return "?" if value is None else str(value)


class VaultTask(vf.Task[VaultData, VaultState, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Vault(vf.ToolsetConfig())]

    @vf.reward(weight=0.8)
    async def correct(self, task: VaultData, trace: vf.Trace) -> float:
        expected = "".join(str(task.vault[key]) for key in task.asked)
        return float(trace.last_reply.strip() == expected)

    @vf.reward(weight=0.2)
    async def read_all(self, task: VaultData, trace: vf.Trace) -> float:
        return float(set(task.asked) <= set(trace.state.reads))

    @vf.metric
    async def reads(self, trace: vf.Trace) -> float:
        return float(len(trace.state.reads))


class VaultTaskset(vf.Taskset[VaultTask, VaultConfig]):
    def load(self) -> Iterator[VaultTask]:
        rng = random.Random(f"vf-vault-{self.config.split}")
        for i in range(self.config.count):
            keys = rng.sample(KEYS, self.config.vault_size)
            vault = {key: rng.randrange(10) for key in keys}
            asked = rng.sample(keys, self.config.keys_per_task)
            yield VaultTask(
                VaultData(id=f"{self.config.split}-{i}", prompt=f"keys {' '.join(asked)}", vault=vault, asked=asked),
                self.config.task,
            )
