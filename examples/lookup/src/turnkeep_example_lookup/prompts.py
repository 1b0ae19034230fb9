"""Write the example's prompts file: `python -m turnkeep_example_lookup.prompts [PATH] [--count N] [--seed S]`.

One JSON record per line, as turnkeep's `[data] train` reads them: `prompt` (the
question), `answer`, `env` (the `[environments]` name of the configs, "lookup") and the
hidden `table`, which reaches the environment as `problem.metadata["table"]`. The same
count, seed and options always write the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from pydantic import ValidationError

from turnkeep_example_lookup.env import LookupOptions, sample_problem

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "prompts.jsonl"
"""examples/lookup/prompts.jsonl when run from the source tree (pip install -e)."""


def prompt_records(count: int = 500, seed: int = 0, options: LookupOptions = LookupOptions()) -> list[dict]:
    rng = random.Random(f"turnkeep-example-lookup-prompts-{seed}")
    records = []
    for _ in range(count):
        problem = sample_problem(rng, options)
        records.append({"prompt": problem.question, "answer": problem.answer, "env": problem.env,
                        "table": problem.metadata["table"]})
    return records


def write_prompts(path: Path, count: int = 500, seed: int = 0, options: LookupOptions = LookupOptions()) -> Path:
    lines = [json.dumps(record, separators=(", ", ": ")) + "\n" for record in prompt_records(count, seed, options)]
    path = Path(path)
    path.write_text("".join(lines))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--options", default="{}", help="the environment's options as JSON, e.g. '{\"table_size\": 6}'")
    args = parser.parse_args(argv)
    try:
        options = LookupOptions.model_validate_json(args.options)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in err.errors())
        parser.error(f"--options {args.options!r}: {problems}")
    print(write_prompts(args.path, args.count, args.seed, options))


if __name__ == "__main__":
    main()
