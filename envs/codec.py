"""Text <-> token ids for the agent loop: the policy model's own chat template, read from its directory.

A conversation is rendered once and then only ever extended, so the token ids of
earlier turns are never re-tokenised (a policy turn keeps exactly the ids the policy
generated, which is what the trainer scores):

- `conversation_start(prompt)`: the ids of the template's rendering of the first user
  message with the generation prompt (`add_generation_prompt=True`), e.g.
  `<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n`.
- a policy turn: the ids the policy generated, up to and including the end-of-turn
  token it stopped on (`stop_ids`: the template's end-of-turn token plus the model's
  declared end-of-sequence tokens).
- `after_turn(turn_ids, observation, role, done)`: the ids of the template's text
  between the end of that generated turn and the start of the next generation.

The text after a turn (the "delta") comes from a probe conversation: the template
renders `[user: <probe>, assistant: <placeholder>, <role>: observation]` (with the
generation prompt unless the episode is done), and the delta is everything after the
placeholder and the end-of-turn text that closes it. Cutting right after the
end-of-turn token, not at the end of the rendered assistant message, is what keeps the
"\\n" a ChatML template writes after `<|im_end|>`: the policy stopped on `<|im_end|>`,
so that "\\n" belongs to the delta. The delta is tokenised in the context of the
end-of-turn text (`encode(closing + delta)` minus `encode(closing)`), so a tokenizer
that treats the start of a text specially (a SentencePiece prefix space) gives the ids
a whole rendering would.

The end-of-turn token is read off the template itself: the first token the template
writes after an assistant message's content (preferring one the model declares as
end-of-sequence: `generation_config.json`'s `eos_token_id`, an int or a list, else
config.json's, and `tokenizer_config.json`'s `eos_token`; then a special token; then
the first token at all, as the made-up tiny model's "\\n"). A template that writes
nothing after an assistant message ends turns on the declared end-of-sequence tokens.

A generated turn that does not end on a stop token was cut (max_tokens, or the model's
length): before anything follows it, `after_turn` closes it with the template's
end-of-turn text (`closing_ids`), so the next message is well-formed. Those closing
tokens are not the policy's: they travel in the following non-policy segment (the agent
loop's `kind="tool"` segment, which holds all template glue: the end of a cut turn, the
observation's role header and content, the next generation prompt) and are never
trained on. A turn that ended on a declared end-of-sequence token other than the
template's end-of-turn (e.g. Qwen's `<|endoftext|>`) counts as ended and is left as
generated; only the template's end-of-turn token is cut off the text an environment
sees (`turn_text`), so such a token stays visible in it (and the made-up model's
`<eos>` keeps making a turn malformed, as before).

Template sources, first found: `chat_template.jinja`, `chat_template.json`'s
`chat_template`, `tokenizer_config.json`'s `chat_template` (a string, or a list of named
templates: "default" is used). It is rendered like transformers' `apply_chat_template`
(jinja2 sandbox, trim_blocks, lstrip_blocks, loopcontrols, `tojson`, `raise_exception`,
`strftime_now`, the tokenizer config's special tokens as `bos_token`, `eos_token`, ...,
and `tools` when given). A model directory with no template gets `LINE_TEMPLATE`, the
made-up tiny model's one-line protocol (each message's content as is, an assistant
turn ended by "\\n", which must then be one token).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

LINE_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ '\\n' }}{% endif %}{% endfor %}"
)
"""The one-line protocol as a chat template: the beginning-of-sequence token, then every message's
content as is, each assistant turn ended by "\\n" (its end-of-turn token); the generation prompt is
empty. The made-up tiny model ships it (`gpu_workers/tiny_model/tokenizer.py`); it is also the
fallback for a model directory without a template."""

LINE_SOURCE = "built-in line template"
"""`TurnCodec.template_source` of a model directory without a chat template."""

_PROBE_USER = "TURNKEEP_PROBE_USER_4d1f"
_PROBE_TURN = "TURNKEEP_PROBE_TURN_8c2e"
"""Placeholders of the probe conversation; plain words, so no template trims or escapes them."""


class ChatTemplateError(RuntimeError):
    """The chat template cannot render a conversation the agent loop needs (the message says which)."""


class TurnCodec:
    def __init__(self, model_dir: Path) -> None:
        model_dir = Path(model_dir)
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tok_config = _read_json(model_dir / "tokenizer_config.json") or {}
        template, self.template_source = _find_template(model_dir, tok_config)
        """Where the template came from: a file name, or LINE_SOURCE."""
        if self.template_source == LINE_SOURCE and len(self.encode("\n")) != 1:
            raise ValueError(
                f"the tokenizer in {model_dir} has no chat template and encodes a newline as "
                f"{self.encode(chr(10))}; without a template turns end at a newline, so it must be a single token"
            )
        self._template = _compile(template)
        self._special_tokens = self._special_token_strings(model_dir, tok_config)
        self.declared_eos_ids = self._declared_eos_ids(model_dir)
        """The model's own end-of-sequence ids (generation config, else config; tokenizer config)."""
        try:
            self._closing_text, self.end_of_turn_ids = self._probe_end_of_turn()
        except ChatTemplateError as err:
            raise ValueError(f"{model_dir}: {err}") from None
        self.closing_ids: list[int] = self.encode(self._closing_text)
        """What closes a cut turn: the template's text after an assistant message's content, through its
        end-of-turn token (`<|im_end|>`; "\\n" for the line template)."""
        self.stop_ids: list[int] = sorted(set(self.end_of_turn_ids) | self.declared_eos_ids)
        """Generation stops on any of these (the request's `stop_token_ids`)."""
        if not self.stop_ids:
            raise ValueError(f"{model_dir}: no end-of-turn token: the chat template ({self.template_source}) writes "
                             "nothing after an assistant message and the model declares no eos_token_id")

    # -- text and ids ----------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; special tokens written in it (`<|im_start|>`) become their ids, none are added."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        # Specials stay in, so a turn that emits <eos> parses as malformed instead of silently clean.
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def turn_text(self, turn_ids: list[int]) -> str:
        """The text of a generated turn as an environment sees it: without its end-of-turn token."""
        if turn_ids and turn_ids[-1] in self.end_of_turn_ids:
            turn_ids = turn_ids[:-1]
        return self.decode(turn_ids)

    def turn_closed(self, turn_ids: list[int]) -> bool:
        """True when the turn ended on a stop token; False when it was cut (max_tokens)."""
        return bool(turn_ids) and turn_ids[-1] in self.stop_ids

    # -- the conversation ------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The template's text of `messages`, as transformers' `apply_chat_template(tokenize=False)` gives it."""
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
                **self._special_tokens,
            )
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as err:
            # raise_exception() in the template, or a template that breaks on these messages.
            roles = [m.get("role") for m in messages]
            raise ChatTemplateError(f"the chat template ({self.template_source}) cannot render roles {roles}: "
                                    f"{err}") from None

    def conversation_start(self, prompt: str, tools: list[dict[str, Any]] | None = None,
                           system: str | None = None) -> list[int]:
        """Ids of the opening (the `system` message when given, then the first user message) and the generation
        prompt: the only rendering that is tokenised whole.

        `tools` (JSON schemas) reach this rendering only (templates put them in the system message);
        the probes of later deltas render without them."""
        opening = [{"role": "system", "content": system}] if system is not None else []
        return self.encode(self.render([*opening, {"role": "user", "content": prompt}], True, tools))

    def after_turn(self, turn_ids: list[int], observation: str | None, role: str = "tool",
                   done: bool = False) -> list[int]:
        """Ids that follow a generated turn: closing tokens if it was cut, then the observation's message
        (`role`) and, unless `done`, the next generation prompt. Empty when nothing follows (a final turn
        with no observation, or the line template's turn with none)."""
        if observation is None and done:
            return []
        delta = self.observation_ids(observation, role, done)
        if self.turn_closed(turn_ids):
            return delta
        return self.closing_ids + delta

    def observation_ids(self, observation: str | None, role: str = "tool", done: bool = False) -> list[int]:
        """Ids of the template's text between a closed assistant turn and the next generation, with the
        observation in between (None: no message, only the next generation prompt)."""
        messages = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_TURN}]
        if observation is not None:
            messages.append({"role": role, "content": observation})
        rendered = self.render(messages, add_generation_prompt=not done)
        after = _after_placeholder(rendered, self.template_source)
        if not after.startswith(self._closing_text):
            raise ChatTemplateError(
                f"the chat template ({self.template_source}) ends an assistant message followed by a {role!r} "
                f"message with {after[:40]!r}, not with {self._closing_text!r} as it ends the last one"
            )
        return self._ids_after(self._closing_text, after[len(self._closing_text):])

    # -- restoring -------------------------------------------------------------------

    @staticmethod
    def turns_with_glue(segments: Sequence[Any]) -> list[tuple[list[int], list[int]]]:
        """Each policy turn's ids (of `Segment`s) with the ids of the non-policy segments after it."""
        turns: list[tuple[list[int], list[int]]] = []
        for seg in segments:
            if seg.kind == "policy":
                turns.append((list(seg.token_ids), []))
            elif turns:
                turns[-1][1].extend(seg.token_ids)
        return turns

    def first_replay_difference(self, segments: Sequence[Any], observations: list[str | None]) -> int | None:
        """The first turn whose replayed observation does not give back the glue saved after it (None: all do).

        A saved boundary is mid-episode, so no saved turn was the last (done=False).
        `Environment.replay` returns observations without their roles; a match as either
        role counts. Fewer or more observations than turns differ at the first turn without a pair.
        """
        turns = self.turns_with_glue(segments)
        for index, ((turn_ids, saved), observation) in enumerate(zip(turns, observations)):
            if saved not in self._possible_glue(turn_ids, observation):
                return index
        return None if len(observations) == len(turns) else min(len(observations), len(turns))

    def _possible_glue(self, turn_ids: list[int], observation: str | None) -> list[list[int]]:
        found = []
        for role in ("tool", "user") if observation is not None else ("tool",):
            try:
                found.append(self.after_turn(turn_ids, observation, role))
            except ChatTemplateError:  # a template without that role
                continue
        return found

    # -- reading the model directory ---------------------------------------------------

    def _ids_after(self, context: str, text: str) -> list[int]:
        """Ids of `text` as they come after `context` in one tokenisation (alone if that does not split there)."""
        if not context:
            return self.encode(text)
        head, both = self.encode(context), self.encode(context + text)
        if both[: len(head)] == head:
            return both[len(head):]
        return self.encode(text)

    def _probe_end_of_turn(self) -> tuple[str, tuple[int, ...]]:
        """(closing text, end-of-turn ids) from what the template writes after an assistant message's content."""
        rendered = self.render(
            [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_TURN}], False)
        tail = _after_placeholder(rendered, self.template_source)
        tail_ids = self.encode(tail)
        if not tail_ids:
            return "", tuple(sorted(self.declared_eos_ids))
        special = {i for i, tok in self._tokenizer.get_added_tokens_decoder().items() if tok.special}
        eot = next((i for i in tail_ids if i in self.declared_eos_ids),
                   next((i for i in tail_ids if i in special), tail_ids[0]))
        eot_text = self.decode([eot])
        at = tail.find(eot_text)
        closing = tail[: at + len(eot_text)] if at >= 0 else tail
        return closing, (eot,)

    def _declared_eos_ids(self, model_dir: Path) -> set[int]:
        # Like transformers' GenerationConfig: generation_config.json, else the model config.
        source = _read_json(model_dir / "generation_config.json")
        if source is None:
            source = _read_json(model_dir / "config.json") or {}
        found = source.get("eos_token_id")
        ids = {int(i) for i in (found if isinstance(found, list) else [found]) if isinstance(i, int)}
        eos = self._special_tokens.get("eos_token")
        if eos is not None and (eos_id := self._tokenizer.token_to_id(eos)) is not None:
            ids.add(eos_id)
        return ids

    def _special_token_strings(self, model_dir: Path, tok_config: dict[str, Any]) -> dict[str, str]:
        """bos_token, eos_token, ... as the template sees them (transformers passes its special tokens map)."""
        out = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = tok_config.get(name)
            if isinstance(value, dict):  # an AddedToken as older tokenizer configs save it
                value = value.get("content")
            if isinstance(value, str):
                out[name] = value
        if "bos_token" not in tok_config:
            # No tokenizer config says (a null one does): the model config's beginning-of-sequence id, as the
            # line protocol always used.
            bos_id = (_read_json(model_dir / "config.json") or {}).get("bos_token_id")
            if isinstance(bos_id, int) and (bos := self._tokenizer.id_to_token(bos_id)) is not None:
                out["bos_token"] = bos
        return out


def _find_template(model_dir: Path, tok_config: dict[str, Any]) -> tuple[str, str]:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8"), jinja_file.name
    for source, config in (("chat_template.json", _read_json(model_dir / "chat_template.json") or {}),
                           ("tokenizer_config.json", tok_config)):
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default", next(iter(named.values()), None))
        if isinstance(template, str) and template:
            return template, source
    return LINE_TEMPLATE, LINE_SOURCE


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask markers): rendered as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _compile(template: str) -> jinja2.Template:
    """Compile as transformers does (`chat_template_utils._compile_jinja_template`)."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as err:
        raise ValueError(f"the chat template does not parse: {err}") from None


def _after_placeholder(rendered: str, source: str) -> str:
    at = rendered.rfind(_PROBE_TURN)
    if at < 0:
        raise ChatTemplateError(f"the chat template ({source}) does not render an assistant message's content")
    return rendered[at + len(_PROBE_TURN):]


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else None
