import json
import random
from collections import Counter
from pathlib import Path

import pytest

from turnkeep.controller.state.dataloader import PromptDataloader
from turnkeep.controller.state.prompt_files import PromptFile
from turnkeep.envs.calc_task import CalcProblems, sample_problem
from turnkeep.schemas.config import EnvironmentSpec, TaskConfig

ENVS = {"calc": EnvironmentSpec(weight=3), "judge": EnvironmentSpec(kind="judge", weight=1)}


def prompts_file(tmp_path: Path, count: int, name: str = "p.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"prompt": f"Q {i}+1", "answer": i + 1, "id": i}) + "\n" for i in range(count)))
    return path


def file_loader(path: Path, seed: int = 0, shuffle: bool = True, environments=None) -> PromptDataloader:
    return PromptDataloader(PromptFile(path, (environments or {"calc": None}).keys()), seed, environments,
                            shuffle=shuffle)


def generated(task: TaskConfig, seed: int) -> PromptDataloader:
    return PromptDataloader(CalcProblems(task, seed), seed)


def draw(loader: PromptDataloader, count: int) -> list:
    return [loader.next_group()[1] for _ in range(count)]


def test_generated_problems_are_unchanged_without_a_prompts_file():
    task = TaskConfig(num_operands=4, operators="+-*")
    for loader in (generated(task, 7),):
        groups = [loader.next_group() for _ in range(5)]
        for index, (group_id, problem) in enumerate(groups):
            expected = sample_problem(task, random.Random(f"7:{index}"))
            assert group_id == f"g{index:07d}"
            assert problem.model_dump_json() == expected.model_copy(update={"env": "calc"}).model_dump_json()
        assert loader.epoch == 0


def test_generated_state_loads_old_checkpoints_and_keeps_their_keys():
    loader = generated(TaskConfig(), 3)
    draw(loader, 4)
    state = loader.state_dict()
    assert state["seed"] == 3 and state["next_index"] == 4 and state["prompts_digest"] is None
    json.dumps(state)  # it goes into controller_state.json
    old = generated(TaskConfig(), 3)
    old.load_state_dict({"seed": 3, "next_index": 4})  # a state written before prompts files existed
    assert old.next_group() == loader.next_group()


def test_records_become_problems_with_their_metadata_and_env(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "Q 1+2", "answer": 3, "id": "a"}\n{"prompt": "Q 5-4", "answer": 1, "env": "judge"}\n')
    loader = file_loader(path, shuffle=False, environments=ENVS)
    first, second = draw(loader, 2)
    assert (first.question, first.answer, first.metadata) == ("Q 1+2", 3, {"id": "a"})
    assert first.env in ENVS
    assert (second.question, second.env, second.metadata) == ("Q 5-4", "judge", {})


def test_records_without_env_go_to_environments_by_weight(tmp_path):
    loader = file_loader(prompts_file(tmp_path, 10), seed=5, environments=ENVS)
    shares = Counter(problem.env for problem in draw(loader, 400))
    assert 240 < shares["calc"] < 360 and shares["calc"] + shares["judge"] == 400


def test_without_shuffle_the_file_order_repeats_every_epoch(tmp_path):
    loader = file_loader(prompts_file(tmp_path, 3), shuffle=False)
    assert [p.question for p in draw(loader, 7)] == ["Q 0+1", "Q 1+1", "Q 2+1"] * 2 + ["Q 0+1"]
    assert loader.epoch == 2


def test_shuffle_gives_every_record_once_per_epoch_in_an_order_seeded_by_seed_and_epoch(tmp_path):
    path, n = prompts_file(tmp_path, 20), 20
    loader = file_loader(path, seed=1)
    epochs = []
    for epoch in range(3):
        assert loader.epoch == epoch
        epochs.append([p.metadata["id"] for p in draw(loader, n)])
    assert loader.epoch == 3
    for order in epochs:
        assert sorted(order) == list(range(n))
    assert len({tuple(order) for order in epochs}) == 3  # each epoch is reshuffled
    assert [p.metadata["id"] for p in draw(file_loader(path, seed=1), n)] == epochs[0]  # the seed decides
    assert [p.metadata["id"] for p in draw(file_loader(path, seed=2), n)] != epochs[0]


def test_a_restored_state_resumes_exactly_mid_epoch(tmp_path):
    path = prompts_file(tmp_path, 7)
    loader = file_loader(path, seed=4, environments=ENVS)
    draw(loader, 10)  # epoch 1, position 3
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["epoch"] == 1 and state["next_index"] == 10 and len(state["prompts_digest"]) == 64
    assert state["prompts_file"] == str(path)
    ahead = [loader.next_group() for _ in range(12)]
    restored = file_loader(path, seed=4, environments=ENVS)
    restored.load_state_dict(state)
    assert restored.epoch == 1
    assert [restored.next_group() for _ in range(12)] == ahead


def test_a_copy_of_the_same_records_elsewhere_restores(tmp_path):
    state = file_loader(prompts_file(tmp_path, 5)).state_dict()
    (tmp_path / "moved").mkdir()
    file_loader(prompts_file(tmp_path / "moved", 5)).load_state_dict(state)


def test_a_state_from_other_prompts_is_refused_with_the_fix(tmp_path):
    saved = file_loader(prompts_file(tmp_path, 5)).state_dict()
    other = file_loader(prompts_file(tmp_path, 6, name="other.jsonl"))
    with pytest.raises(ValueError, match="whose records differ") as err:
        other.load_state_dict(saved)
    assert "\n" not in str(err.value) and "p.jsonl" in str(err.value) and "data.train" in str(err.value)
    from_task = generated(TaskConfig(), 0)
    with pytest.raises(ValueError, match="this run uses generated problems; set data.train"):
        from_task.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"saved with generated problems \(\[task\]\).*unset data.train"):
        other.load_state_dict(from_task.state_dict())
    with pytest.raises(ValueError, match=r"saved with generated problems"):
        other.load_state_dict({"seed": 0, "next_index": 3})  # an old state
    with pytest.raises(ValueError, match="set run.seed back"):
        file_loader(prompts_file(tmp_path, 5), seed=9).load_state_dict(saved)
