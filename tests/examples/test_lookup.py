"""The example environment outside the package (examples/lookup) and the tiny model made from its demonstrations.

The example package is imported from its source folder when it is not installed
(`pip install -e examples/lookup` installs it for real runs).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from turnkeep.config.loader import load_config
from turnkeep.envs.calc_task import ALPHABET, synthetic_transcript
from turnkeep.envs.calc_task import sample_problem as calc_problem
from turnkeep.envs.calc_transcripts import CalcTranscripts
from turnkeep.envs.codec import LINE_TEMPLATE
from turnkeep.envs.environment import EnvContext, Environment, StepResult
from turnkeep.gpu_workers.tiny_model import recipe as tiny_recipe
from turnkeep.gpu_workers.tiny_model import warm_start
from turnkeep.gpu_workers.tiny_model.build import ensure_tiny_model
from turnkeep.gpu_workers.tiny_model.tokenizer import (
    decode,
    encode,
    load_tokenizer,
    newline_id,
    special_ids,
    train_tokenizer,
)
from turnkeep.gpu_workers.tiny_model.transcripts import TOKENIZER_CORPUS, DemonstrationsError, DemoSource
from turnkeep.schemas.config import ModelConfig, TaskConfig, TinyModelConfig, TurnkeepConfig
from turnkeep.schemas.rollout import Problem
from turnkeep.workers.model_maker import transcript_source

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "lookup"
if importlib.util.find_spec("turnkeep_example_lookup") is None:  # not installed (pip install -e examples/lookup)
    sys.path.insert(0, str(EXAMPLE / "src"))

from turnkeep_example_lookup.env import (  # noqa: E402
    KEYS,
    LookupEnvironment,
    LookupOptions,
    conversation,
    sample_problem,
    score,
)
from turnkeep_example_lookup.prompts import main as write_prompts_main  # noqa: E402
from turnkeep_example_lookup.prompts import prompt_records, write_prompts  # noqa: E402

ENTRY = "turnkeep_example_lookup.env:LookupEnvironment"
SMALL = TinyModelConfig(hidden_size=64, num_heads=2, head_dim=32, num_layers=1, intermediate_size=64,
                        warm_start_steps=5, warm_start_batch_size=4)
TABLE = {"a": 7, "c": 3, "d": 0, "f": 9}


def _problem(question: str = "K ca", table: dict | None = None, answer: str | None = "37") -> Problem:
    return Problem(question=question, answer=answer, env="lookup", metadata={"table": table or TABLE})


async def _play(env: Environment, turns: list[str]) -> list[StepResult]:
    return [await env.step(turn) for turn in turns]


def _config(options: dict | None = None, **tiny) -> TurnkeepConfig:
    return TurnkeepConfig.model_validate({
        "model": {"tiny": {"demonstrations": "lookup", **tiny}},
        "environments": {"lookup": {"kind": "python", "entry": ENTRY, "options": options or {}}},
    })


# The environment.

def test_a_right_episode_looks_up_each_key_then_answers() -> None:
    env = LookupEnvironment(_problem())
    assert env.prompt() == "K ca\n"
    steps = asyncio.run(_play(env, ["L c\n", "L a\n", "A 37\n"]))
    assert [(s.observation, s.done) for s in steps] == [("V 3\n", False), ("V 7\n", False), (None, True)]
    assert env.reward() == 1.0


@pytest.mark.parametrize("turns", [
    ["L c\n", "L a\n", "A 73\n"],          # wrong order of digits
    ["L c\n", "A 37\n"],                   # skipped a lookup (guessed right)
    ["L a\n", "L c\n", "A 37\n"],          # lookups out of the question's order
    ["L c\n", "L d\n", "A 30\n"],          # a wrong key, its value used
    ["L b\n", "L c\n", "L a\n", "A 37\n"],  # an extra lookup (of a key the table lacks)
    ["L c\n", "L a\n"],                    # no answer
    ["A 37\n"],                            # no lookups at all
])
def test_anything_but_the_exact_chain_scores_zero(turns: list[str]) -> None:
    env = LookupEnvironment(_problem())
    asyncio.run(_play(env, turns))
    assert env.reward() == 0.0


def test_the_tool_answers_unknown_keys_and_a_malformed_turn_ends_the_episode() -> None:
    env = LookupEnvironment(_problem())
    unknown, bad = asyncio.run(_play(env, ["L b\n", "hello\n"]))
    assert (unknown.observation, unknown.done) == ("V ?\n", False)
    assert (bad.observation, bad.done) == (None, True)
    assert env.reward() == 0.0
    cut = LookupEnvironment(_problem())  # a turn cut at the token limit has no newline
    assert asyncio.run(_play(cut, ["L c", "L a", "A 37"]))[0].observation == "V 3\n"
    assert cut.reward() == 1.0


def test_tool_latency_is_honoured() -> None:
    import time

    env = LookupEnvironment(_problem(), EnvContext(tool_latency_s=0.05))
    started = time.monotonic()
    asyncio.run(_play(env, ["L c\n"]))
    assert time.monotonic() - started >= 0.05


def test_stateless_recovery_replays_the_same_observations() -> None:
    assert LookupEnvironment.recovery_mode == "stateless"
    turns = ["L b\n", "L c\n", "L a\n"]
    live = LookupEnvironment(_problem())
    observations = [s.observation for s in asyncio.run(_play(live, turns))]
    fresh = LookupEnvironment(_problem())
    assert asyncio.run(fresh.replay(turns)) == observations == ["V ?\n", "V 3\n", "V 7\n"]
    asyncio.run(fresh.step("A 37\n"))
    assert fresh.reward() == 0.0  # the extra lookup of b is part of the restored episode
    assert live.export_state() is None


@pytest.mark.parametrize(("problem", "match"), [
    (Problem(question="K ca", env="lookup"), "no table"),
    (_problem(table={"a": 7, "c": 12}), "value 0..9"),
    (_problem(table={"a": 7, "z": 1}), "not a key"),
    (_problem(question="K cb"), "lacks 'b'"),
    (_problem(question="Q 1+2"), "not a lookup question"),
    (_problem(answer="38"), "disagrees"),
    (_problem(table=dict.fromkeys(KEYS, 1), question="K ab", answer="11"), "at most 7"),
])
def test_broken_records_are_refused_with_the_reason(problem: Problem, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LookupEnvironment(problem)


def test_options_are_checked() -> None:
    assert LookupOptions() == LookupOptions(keys_per_question=2, table_size=5, demo_error_rate=0.6)
    for bad in ({"keys": 3}, {"table_size": 8}, {"keys_per_question": 3, "table_size": 2}, {"demo_error_rate": 2}):
        with pytest.raises(ValueError):
            LookupOptions.model_validate(bad)
    from turnkeep.envs.loading import EnvironmentLoadError, load_environment

    loaded = load_environment(ENTRY, {"table_size": 6})
    assert loaded.cls is LookupEnvironment and loaded.options == LookupOptions(table_size=6)
    with pytest.raises(EnvironmentLoadError, match="refuses its options"):
        load_environment(ENTRY, {"table_size": 9})


def test_generated_problems_follow_the_options() -> None:
    rng = random.Random(0)
    options = LookupOptions(keys_per_question=3, table_size=6)
    for _ in range(50):
        problem = sample_problem(rng, options)
        table = problem.metadata["table"]
        assert len(table) == 6 and len(problem.question) == 2 + 3
        env = LookupEnvironment(problem)
        asyncio.run(_play(env, [f"L {k}\n" for k in problem.question[2:]] + [f"A {problem.answer}\n"]))
        assert env.reward() == 1.0


# Demonstrations.

def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def test_demonstrations_are_conversations_that_replay_through_the_environment() -> None:
    rng = random.Random(3)
    rewards = []
    for error_rate in (0.0, 1.0):
        for _ in range(200):
            problem = sample_problem(rng, LookupOptions())
            text = conversation(problem, rng, error_rate)
            lines = _lines(text)
            assert lines[0] == problem.question + "\n" and all(line.endswith("\n") for line in lines)
            env = LookupEnvironment(problem)
            turns, observations = lines[1::2], lines[2::2]  # odd lines: the policy's (the warm start's targets)
            steps = asyncio.run(_play(env, turns))
            assert [s.observation for s in steps[:-1]] == observations and steps[-1].done
            assert env.reward() == score(problem, turns)
            rewards.append(env.reward())
    assert rewards[:200] == [1.0] * 200  # correct ones score 1, each deliberately wrong one 0
    assert rewards[200:] == [0.0] * 200


def test_demonstrations_are_deterministic_and_mix_right_and_wrong() -> None:
    options = LookupOptions(demo_error_rate=0.5)
    a = LookupEnvironment.demonstrations(random.Random(7), 400, options)
    assert a == LookupEnvironment.demonstrations(random.Random(7), 400, options)
    assert len(a) == 400 and "V ?\n" in "".join(a)
    right = LookupEnvironment.demonstrations(random.Random(7), 50, LookupOptions(demo_error_rate=0.0))
    assert all(len(_lines(t)) == 6 for t in right)  # prompt, two lookups with their replies, the answer


# Prompts file and configs.

def test_the_shipped_prompts_file_is_the_generated_one() -> None:
    shipped = EXAMPLE / "prompts.jsonl"
    assert shipped.stat().st_size <= 100_000
    lines = shipped.read_text().splitlines()
    assert [json.loads(line) for line in lines] == prompt_records(500, 0)
    for record in map(json.loads, lines[:100]):
        problem = Problem(question=record["prompt"], answer=record["answer"], env=record["env"],
                          metadata={"table": record["table"]})
        env = LookupEnvironment(problem)
        asyncio.run(_play(env, [f"L {k}\n" for k in record["prompt"][2:]] + [f"A {record['answer']}\n"]))
        assert env.reward() == 1.0


@pytest.mark.parametrize("options, named", [('{"table_size": "big"}', "table_size: "), ("{oops", "options: "),
                                             ('{"colour": 1}', "colour: ")])
def test_the_prompt_writer_names_bad_options_in_one_line(options: str, named: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        write_prompts_main([str(tmp_path / "p.jsonl"), "--options", options])
    assert exited.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"error: --options {options!r}: " in last and named in last, last
    assert not (tmp_path / "p.jsonl").exists()


def test_write_prompts_writes_the_same_bytes(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "p.jsonl")
    assert path.read_bytes() == (EXAMPLE / "prompts.jsonl").read_bytes()


def test_the_example_configs_load() -> None:
    cfg = load_config(EXAMPLE / "config.toml")
    assert cfg.environments["lookup"].entry == ENTRY and cfg.model.tiny.demonstrations == "lookup"
    assert cfg.data.train == Path("examples/lookup/prompts.jsonl")
    source = transcript_source(cfg)
    assert source.cls is LookupEnvironment and source.options == LookupOptions(**cfg.environments["lookup"].options)
    remote = load_config(EXAMPLE / "remote.toml")
    spec = remote.environments["lookup"]
    assert spec.kind == "remote" and spec.url == "http://127.0.0.1:8765"
    # The remote config names the class by import path: the same demonstrations, the same model as config.toml's.
    remote_source = transcript_source(remote)
    assert remote_source.cls is LookupEnvironment and remote_source.options == source.options


def test_transcript_source_names_each_problem() -> None:
    assert isinstance(transcript_source(TurnkeepConfig()), CalcTranscripts)
    cfg = _config()
    with pytest.raises(DemonstrationsError, match=r"no \[environments.other\].*configured: lookup"):
        transcript_source(cfg.model_copy(update={"model": cfg.model.model_copy(
            update={"tiny": cfg.model.tiny.model_copy(update={"demonstrations": "other"})})}))
    with pytest.raises(DemonstrationsError, match="offers no demonstrations"):
        transcript_source(TurnkeepConfig.model_validate({
            "model": {"tiny": {"demonstrations": "mine"}},
            "environments": {"mine": {"kind": "python", "entry": "turnkeep.envs.calc_env:CalcEnvironment"}}}))
    with pytest.raises(DemonstrationsError, match='kind = "python"'):
        transcript_source(TurnkeepConfig.model_validate({
            "model": {"tiny": {"demonstrations": "calc"}}, "environments": {"calc": {"kind": "calc"}}}))
    with pytest.raises(DemonstrationsError, match="refuses its options"):
        transcript_source(_config({"table_size": 0}))
    with pytest.raises(DemonstrationsError, match="does not import"):
        transcript_source(TurnkeepConfig.model_validate({
            "model": {"tiny": {"demonstrations": "x"}},
            "environments": {"x": {"kind": "python", "entry": "no_such_module_here:Env"}}}))


# The calculator's model is unchanged by sources.

def test_calc_cache_keys_are_those_of_models_made_before_demonstrations_existed() -> None:
    recipe = tiny_recipe.Recipe(TinyModelConfig(), CalcTranscripts(TaskConfig()), 0)
    tiny = TinyModelConfig().model_dump(mode="json")
    del tiny["num_kv_heads"], tiny["demonstrations"]
    assert recipe.as_json() == {"format": tiny_recipe.FORMAT_VERSION, "tiny": tiny,
                                "task": TaskConfig().model_dump(mode="json"), "seed": 0}
    # Format 1: the directories made before `demonstrations` existed; 2 (the chat template): the same recipe.
    known = {1: ("7ae3387c0ea89c8e", "aa08130763002d72"), 2: ("7cda35e08e6525d6", "13329b6e30718384")}
    if tiny_recipe.FORMAT_VERSION in known:
        assert (tiny_recipe.cache_key(TinyModelConfig(), CalcTranscripts(TaskConfig()), 0),
                tiny_recipe.cache_key(SMALL, CalcTranscripts(TaskConfig()), 0)) == known[tiny_recipe.FORMAT_VERSION]


def _old_calc_corpus(task: TaskConfig, seed: int) -> list[str]:
    """The tokenizer corpus as build.py wrote it before transcript sources."""
    rng = random.Random(f"turnkeep-tokenizer-{seed}")
    problems = (calc_problem(task, rng) for _ in range(2000))
    return [synthetic_transcript(p, rng, 0.5) for p in problems] + ["R ERR\n"] * 8


def test_calc_tokenizer_is_unchanged() -> None:
    source = CalcTranscripts(TaskConfig())
    assert source.tokenizer_corpus(0, TOKENIZER_CORPUS) == _old_calc_corpus(TaskConfig(), 0)
    tok = train_tokenizer(source.tokenizer_corpus(0, TOKENIZER_CORPUS), source.alphabet(0))
    assert tok.to_str() == train_tokenizer(_old_calc_corpus(TaskConfig(), 0), ALPHABET).to_str()
    digest = hashlib.sha256(tok.to_str(pretty=True).encode()).hexdigest()
    assert digest.startswith("09852cf7411d9ef6")  # tokenizer.json of the models made so far


def test_calc_warm_start_batches_are_unchanged() -> None:
    """The same rows, labels and random draws as before sources (so the same weights)."""
    task, tiny = TaskConfig(), TinyModelConfig(warm_start_batch_size=8)
    tok = train_tokenizer(_old_calc_corpus(task, 0), ALPHABET)
    bos, pad = special_ids(tok)["bos_token_id"], special_ids(tok)["pad_token_id"]
    new_rng, old_rng = random.Random("w"), random.Random("w")
    for _ in range(3):
        new = warm_start._batch(tok, tiny, CalcTranscripts(task), new_rng, 0)
        rows = []
        for _ in range(tiny.warm_start_batch_size):
            text = synthetic_transcript(calc_problem(task, old_rng), old_rng, tiny.warm_start_error_rate)
            ids, labels = [bos], [-100]
            for line in text.splitlines(keepends=True):
                line_ids = encode(tok, line)
                ids += line_ids
                labels += line_ids if line.startswith(("C", "A")) else [-100] * len(line_ids)
            rows.append((ids, labels))
        old = warm_start._pad(rows, pad)
        assert all(torch.equal(new[k], old[k]) for k in ("input_ids", "labels", "attention_mask"))
    assert new_rng.random() == old_rng.random()


# The tiny model made from the demonstrations.

@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DemoSource]:
    cfg = _config()
    source = transcript_source(cfg)
    tiny = SMALL.model_copy(update={"demonstrations": "lookup"})
    model = ModelConfig(cache_dir=tmp_path_factory.mktemp("cache"), tiny=tiny)
    return ensure_tiny_model(model, source, 0, eval_rollouts=4), source


def test_the_demonstrations_tokenizer_covers_the_example(demo_model: tuple[Path, DemoSource]) -> None:
    model_dir, source = demo_model
    tok = load_tokenizer(model_dir)
    vocab = tok.get_vocab()
    alphabet = set("KLVA ?\n0123456789" + KEYS)
    assert alphabet <= set(vocab) and set(source.alphabet(0)) == alphabet
    for tag in ("K ", "L ", "V ", "A "):
        assert tag in vocab
    assert len(encode(tok, "\n")) == 1 and newline_id(tok) == vocab["\n"]
    for text in LookupEnvironment.demonstrations(random.Random(11), 100, LookupOptions()) + ["V ?\n"]:
        assert decode(tok, encode(tok, text)) == text
        assert encode(tok, text) == [i for line in text.splitlines(keepends=True) for i in encode(tok, line)]
    assert tok.get_vocab_size() < 64  # the calculator's has 64: the example's alphabet is small


def test_the_demonstrations_recipe_names_entry_options_and_content(demo_model: tuple[Path, DemoSource],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir, source = demo_model
    recipe = json.loads((model_dir / tiny_recipe.RECIPE_FILE).read_text())
    assert recipe["demonstrations"]["entry"] == ENTRY
    assert recipe["demonstrations"]["options"] == LookupOptions().model_dump()
    assert len(recipe["demonstrations"]["digest"]) == 64 and "task" not in recipe
    assert recipe["starting_reward"] is None and recipe["starting_reward_rollouts"] == 0  # no rules to play demonstrations
    key = tiny_recipe.cache_key(SMALL, source, 0)
    assert model_dir.name == f"tiny-{key}"
    other_options = DemoSource("lookup", ENTRY, LookupEnvironment, LookupOptions(table_size=6), LINE_TEMPLATE)
    assert tiny_recipe.cache_key(SMALL, other_options, 0) != key

    class Changed(LookupEnvironment):  # the same entry and options, other conversations
        @classmethod
        def demonstrations(cls, rng, count, options):
            return [t.replace("K ", "K  ") for t in super().demonstrations(rng, count, options)]

    changed = DemoSource("lookup", ENTRY, Changed, LookupOptions(), LINE_TEMPLATE)
    assert tiny_recipe.cache_key(SMALL, changed, 0) != key


def test_demonstrations_are_checked_before_training() -> None:
    class Broken(LookupEnvironment):
        @classmethod
        def demonstrations(cls, rng, count, options):
            return ["K ab"] * count  # one line, no newline

    with pytest.raises(DemonstrationsError, match="not a whole conversation"):
        DemoSource("lookup", ENTRY, Broken, LookupOptions(), LINE_TEMPLATE).tokenizer_corpus(0)
    source = DemoSource("lookup", ENTRY, LookupEnvironment, LookupOptions(), LINE_TEMPLATE)
    with pytest.raises(DemonstrationsError, match="'Z'"):
        source.check_covered(["K aZ\nA 1\n"], 0)


# Starting reward: sampled rollouts of the warm-started model through the environment.

@dataclass
class _Rollout:
    env: Environment
    ids: list[int]
    turn: list[int] = field(default_factory=list)
    turns: int = 0
    done: bool = False


def sampled_reward(model_dir: Path, env_cls: type[Environment], problems: list[Problem], seed: int = 0,
                   temperature: float = 1.0, max_turns: int = 6, max_tokens: int = 8) -> tuple[float, list[str]]:
    """Mean reward of one rollout per problem, sampled in lockstep as the environment server plays them
    (bos and the prompt line, then turn by turn until the newline token, the observation fed back)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = load_tokenizer(model_dir)
    nl, bos = newline_id(tok), special_ids(tok)["bos_token_id"]
    gen = torch.Generator().manual_seed(seed)
    rollouts = []
    for p in problems:
        env = env_cls(p, EnvContext())
        rollouts.append(_Rollout(env, [bos] + encode(tok, env.prompt())))
    texts = [r.env.prompt() for r in rollouts]
    loop = asyncio.new_event_loop()
    with torch.inference_mode():
        while active := [i for i, r in enumerate(rollouts) if not r.done]:
            seqs = [rollouts[i].ids for i in active]
            lengths = torch.tensor([len(s) for s in seqs])
            batch = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
            for row, s in enumerate(seqs):
                batch[row, : len(s)] = torch.tensor(s)
            logits = model(input_ids=batch).logits[torch.arange(len(seqs)), lengths - 1].float()
            probs = torch.softmax(logits / temperature, dim=-1)
            for i, token in zip(active, torch.multinomial(probs, 1, generator=gen).squeeze(1).tolist()):
                r = rollouts[i]
                r.ids.append(token)
                r.turn.append(token)
                if token != nl and len(r.turn) < max_tokens:
                    continue
                text = tok.decode(r.turn, skip_special_tokens=False)
                r.turn, r.turns = [], r.turns + 1
                step = loop.run_until_complete(r.env.step(text))
                texts[i] += text + (step.observation or "")
                if step.observation is not None:
                    r.ids += encode(tok, step.observation)
                r.done = step.done or r.turns >= max_turns or len(r.ids) >= 200
    loop.close()
    return sum(r.env.reward() for r in rollouts) / len(rollouts), texts


def _prompt_problems(n: int) -> list[Problem]:
    records = [json.loads(line) for line in (EXAMPLE / "prompts.jsonl").read_text().splitlines()[:n]]
    return [Problem(question=r["prompt"], answer=r["answer"], env=r["env"], metadata={"table": r["table"]})
            for r in records]


def test_the_small_model_plays_the_environment(demo_model: tuple[Path, DemoSource]) -> None:
    reward, texts = sampled_reward(demo_model[0], LookupEnvironment, _prompt_problems(8))
    assert 0.0 <= reward <= 1.0 and len(texts) == 8


@pytest.mark.integration
def test_the_example_config_starts_rl_often_right_but_not_always(example_model: Path) -> None:
    """The model config.toml makes: it follows the format and is right for some of the prompts (measured)."""
    reward, texts = sampled_reward(example_model, LookupEnvironment, _prompt_problems(128))
    assert 0.2 <= reward <= 0.7, (reward, texts[:8])


# End to end: `turnkeep run` for a few steps, the class as a plugin and behind `turnkeep env-server`.

def _example_env(*first: Path) -> dict[str, str]:
    """The subprocesses' environment: the example package importable (its source folder, if not installed), after
    the folders `first`."""
    import os

    paths = [*map(str, first), str(EXAMPLE / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths), "RAY_AUTH_MODE": "disabled"}


USER_ENV = '''"""A user's own environment in a package of theirs named `envs` (turnkeep claims no such name)."""

import os
from pathlib import Path

from turnkeep import EnvContext, Problem
from turnkeep_example_lookup.env import LookupEnvironment

EPISODES = Path(__file__).with_name("episodes.log")


class MyLookup(LookupEnvironment):
    """The example's lookups; each episode's question noted in EPISODES with where it ran (the run's own environment
    server, or a remote one the user started), so the test sees this class trained in both."""

    def __init__(self, problem: Problem, ctx: EnvContext = EnvContext()) -> None:
        super().__init__(problem, ctx)
        with EPISODES.open("a") as episodes:
            episodes.write(f"{os.environ.get('LOOKUP_SERVER', 'plugin')} {problem.question}\\n")
'''


def _user_project(root: Path) -> Path:
    """A user's project folder holding their package `envs` (`envs/my_lookup.py`); the folder."""
    package = root / "project" / "envs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "my_lookup.py").write_text(USER_ENV)
    return package.parent


def _two_environments_prompts(path: Path) -> Path:
    """The example's prompts, every other one for the remote server's environment, in file order."""
    lines = (EXAMPLE / "prompts.jsonl").read_text().splitlines()[:40]
    records = [{**json.loads(line), "env": "lookup" if i % 2 == 0 else "remote_lookup"} for i, line in enumerate(lines)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def _run_settings(cache: Path) -> list[str]:
    settings = {"model.cache_dir": str(cache), "rollout.group_size": 4, "train.prompts_per_step": 4,
                "train.save_period": 2, "temporal.port": 0, "temporal.ui_port": 0}
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="module")
def example_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model config.toml makes, in a cache the runs below share."""
    cfg = load_config(EXAMPLE / "config.toml", {"model.cache_dir": str(tmp_path_factory.mktemp("example-cache"))})
    return ensure_tiny_model(cfg.model, transcript_source(cfg), cfg.run.seed, eval_rollouts=0)


def _start_env_server(project: Path, root: Path):
    """`turnkeep env-server` serving the user's class from their project folder, as a user starts one; the process,
    its URL and its token file."""
    import os
    import socket
    import subprocess

    from tests.run_command import wait_until

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = load_config(EXAMPLE / "config.toml").environments["lookup"].options
    server_log = root / "env-server.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "turnkeep", "env-server", "--entry", "envs.my_lookup:MyLookup",
         "--options", json.dumps(options), "--port", str(port), "--token-file", str(root / "env_token")],
        stdout=open(server_log, "ab"), stderr=subprocess.STDOUT, start_new_session=True, cwd=project,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "LOOKUP_SERVER": "remote"},
    )
    wait_until(lambda: "serving" in server_log.read_text(), 60, "the env-server", server)
    return server, f"http://127.0.0.1:{port}", root / "env_token"


@pytest.mark.integration
def test_the_example_trains_as_a_plugin_and_against_a_remote_server(
        example_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """From a user's package named `envs` (the example's class subclassed there), run in the user's project folder:
    turnkeep's own folders are `turnkeep.envs`, ..., so the user's `envs` is the one imported, both by the run's own
    environment server (a plugin) and by a `turnkeep env-server` the user started (a remote environment)."""
    import os
    import signal

    from tests.run_command import deep_run_dir, metrics, turnkeep

    project = _user_project(tmp_path)
    for key, value in _example_env(project).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(project)  # as a user runs it; the repository (its folder envs/ among them) is not on the path
    run_dir = deep_run_dir("tk-example-")  # and from a run directory too deep for Ray's sockets under it
    root = run_dir.parent
    server, url, token_file = _start_env_server(project, root)
    options = load_config(EXAMPLE / "config.toml").environments["lookup"].options
    environments = {"lookup": {"kind": "python", "entry": "envs.my_lookup:MyLookup", "options": options},
                    "remote_lookup": {"kind": "remote", "url": url, "token_file": str(token_file)}}
    log = root / "turnkeep.log"
    proc = None
    try:
        # The demonstrations name the example's class by import path: the same cached model as config.toml's.
        proc = turnkeep("run", "--config", str(EXAMPLE / "config.toml"), "--run-dir", str(run_dir), "--steps", "3",
                        *_run_settings(example_model.parent), "--set", f"environments={json.dumps(environments)}",
                        "--set", f"model.tiny.demonstrations={ENTRY}", "--set", "data.shuffle=false",
                        "--set", f"data.train={_two_environments_prompts(tmp_path / 'prompts.jsonl')}", log=log)
        assert proc.wait(timeout=400) == 0, log.read_text()[-3000:]
    finally:
        for running in (proc, server):
            if running is not None and running.poll() is None:
                os.killpg(running.pid, signal.SIGKILL)
    steps = metrics(run_dir, "train_step")
    assert [m["step"] for m in steps] == [1, 2, 3] and all(0.0 <= m["reward_mean"] <= 1.0 for m in steps)
    episodes = [line.split(" ", 1) for line in (project / "envs" / "episodes.log").read_text().splitlines()]
    where = {name for name, _ in episodes}
    assert where == {"plugin", "remote"}, where  # MyLookup ran in both servers
    assert len(episodes) >= 3 * 4 and all(q.startswith("K ") for _, q in episodes)  # 3 steps of 4 prompts
    assert (run_dir / "ray").is_symlink() and (run_dir / "ray" / "session_latest").exists()
    # The run made no model of its own: it found the one made from the demonstrations.
    assert [p.name for p in example_model.parent.iterdir() if p.is_dir()] == [example_model.name]
