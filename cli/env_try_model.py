"""`turnkeep env try --policy model`: turns sampled from the run's model on the CPU, with transformers.

The conversation is built as the agent loop builds it (`envs/agent_loop.py`): the chat template's opening for the
prompt, then each sampled turn up to its stop token and the template's text for the observation after it
(`envs/codec.py`), so the environment sees what a run's engine would make it see. Sampling is transformers'
`generate` (plain temperature sampling, no top-k or top-p, as the engine's requests), not vLLM.
"""

from __future__ import annotations

from pathlib import Path

from turnkeep.cli.config_args import DEFAULT_CONFIG
from turnkeep.config.loader import ConfigError, load_config, parse_overrides
from turnkeep.envs.codec import TurnCodec
from turnkeep.envs.environment import Environment, StepResult
from turnkeep.gpu_workers.tiny_model.transcripts import DemonstrationsError
from turnkeep.workers.model_maker import tiny_model_dir


def model_policy(config: Path | None, settings: list[str], seed: int) -> tuple[ModelPolicy, int]:
    """The policy of the config's model (made first when it is the tiny model and not cached) and the config's
    `rollout.max_turns`; raises ConfigError with the one-line reason."""
    cfg = load_config(config or DEFAULT_CONFIG, parse_overrides(settings))
    try:
        model_dir = tiny_model_dir(cfg)
    except DemonstrationsError as err:
        raise ConfigError(str(err)) from None
    print(f"turnkeep env try: sampling from {model_dir}")
    policy = ModelPolicy(model_dir, cfg.rollout.max_tokens_per_turn, cfg.rollout.temperature, seed)
    return policy, cfg.rollout.max_turns


class ModelPolicy:
    """One conversation at a time: its token ids so far, extended by each sampled turn and its observation."""

    def __init__(self, model_dir: Path, max_tokens: int, temperature: float, seed: int) -> None:
        import torch  # the trainer extra: only --policy model needs it
        from transformers import AutoModelForCausalLM  # the trainer extra, as torch

        self._torch = torch
        torch.manual_seed(seed)
        self._codec = TurnCodec(model_dir)
        self._model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self._max_len = int(getattr(self._model.config, "max_position_embeddings", 0) or 1 << 30)
        self._max_tokens, self._temperature = max_tokens, temperature
        self._ids: list[int] = []
        self._turn: list[int] = []

    def begin(self, episode: int, env: Environment) -> None:
        self._ids = self._codec.conversation_start(env.prompt(), env.tools(), env.system_prompt())
        self._turn = []

    def next_turn(self, previous: StepResult | None) -> str | None:
        if previous is not None:
            self._ids += self._codec.after_turn(self._turn, previous.observation, previous.role, previous.done)
        budget = min(self._max_tokens, self._max_len - len(self._ids))
        if budget <= 0:
            return None  # the conversation fills the model's length, as a run's max_model_len ends it
        self._turn = self._sample(budget)
        self._ids += self._turn
        return self._codec.turn_text(self._turn)

    def _sample(self, budget: int) -> list[int]:
        torch, stops = self._torch, self._codec.stop_ids
        prompt = torch.tensor([self._ids])
        with torch.inference_mode():
            out = self._model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                       max_new_tokens=budget, do_sample=True, temperature=self._temperature,
                                       top_k=0, top_p=1.0, eos_token_id=stops, pad_token_id=stops[0])
        turn = out[0, len(self._ids):].tolist()
        ends = [i for i, token in enumerate(turn) if token in stops]
        return turn[: ends[0] + 1] if ends else turn
