"""The made-up tiny model's demonstrations for a verifiers environment: its own episodes, played with scripted turns.

A verifiers taskset knows no answers in general (its rewards decide), so the script is the environment author's
(`options.demo_script`: `module:function(task_data, rng) -> list[str]`, the policy turns for one task, some of them
deliberately wrong). Each script is played through the real environment (its toolsets answer, its prompt opens), so
every character the environment sends appears in the demonstrations; each message is one line of
`tool_chat_demos.TEMPLATE` (a tool's reply inside `<tool_response>` tags).
"""

from __future__ import annotations

import random

from turnkeep.envs.adapters.verifiers_env import VerifiersEnvironment, VerifiersOptions, import_script, run_to_end
from turnkeep.envs.environment import EnvContext
from turnkeep.envs.tool_chat_demos import played_conversation
from turnkeep.schemas.rollout import Problem


def demonstrations(cls: type[VerifiersEnvironment], rng: random.Random, count: int,
                   options: VerifiersOptions) -> list[str]:
    if options.demo_script is None:
        raise ValueError(f"verifiers environment {options.env_id!r} has no demonstrations for the made-up tiny "
                         f"model: set options.demo_script = \"module:function\", or train a real chat model "
                         f"(model.path) that needs none")
    script = import_script(options.demo_script)
    records = cls.dataset(options, "train")[: options.demo_count_tasks]
    return run_to_end(_play_all(cls, options, script, [rng.choice(records) for _ in range(count)], rng))


async def _play_all(cls, options, script, records, rng) -> list[str]:
    conversations = []
    for record in records:
        problem = Problem(question=record.prompt, answer=None, env="verifiers", metadata=record.metadata)
        env = cls(problem, EnvContext(options=options))
        conversations.append(await played_conversation(env, script(env.task.data, rng)))
    return conversations
