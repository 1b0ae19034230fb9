"""`turnkeep bench <name>`: run one benchmark, print its table, write `<out>/<name>.json`;
`turnkeep bench markdown` renders every result in `<out>` into BENCHMARKS.md, keeping the file's sections of
benchmarks that `<out>` has no result for."""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from pathlib import Path

import orjson

from turnkeep.cli.bench_pass import PASS_FILE, PASS_SENTENCE, bench_pass, pass_line

BENCHMARKS = {
    "overhead": "snapshots off vs on in alternating pairs, same seed and length: rollout tokens/s, train steps/min",
    "wasted": "a slow participant, with and without the trainer hold: attempts thrown away, trainer wait",
    "lower_bound": "admission-closed seconds per attempt against the shortest possible",
    "orchestration": "per attempt, wall time minus time inside activities (what Temporal adds)",
    "scaling": "synthetic agents and rows: seconds per phase and bytes as they grow",
    "recovery": "restart to first generation and tokens generated again, from a chaos run",
    "memory": "peak RSS of each process of the overhead runs",
    "fanout": "one attempt's Gym phase over 16, 64 and 256 environment servers, some slow: all at once vs one by one",
    "soak": "snapshot attempts back to back (--attempts, 1,000 by default): file descriptors, threads, RSS and "
            "Temporal histories stay flat",
    "engines": "1 and 2 engines: rollout tokens/s, the refit against one memory copy, an engine's death to its "
               "replacement taking turns",
    "partial_turns": "long turns cut by kills at the turn and the token level: tokens generated again, restart "
                     "time, and what journaling a turn's tokens as they stream costs",
    "journal_cost": "rollouts alone on one policy server, whole turns against streamed and journaled ones: "
                    "rollout tokens/s in alternating rounds",
    "ranks": "1 and 2 trainer ranks: step time, refit gather, checkpoint save and load, memory per rank; a rank's "
             "death to the next train step, from a chaos run",
    "restart": "a whole-tree kill a few steps after a snapshot, then the same command: seconds from the command to "
               "each piece being up, the first train step and the first generated turn; CPU seconds by process",
    "learn": "the tool_chat task on the tiny chat model: reward curve, wall time, tokens/s; the export, and the base "
             "and trained models' held-out pass@k",
    "learn_real": "a real pretrained model, SmolLM2-135M-Instruct from its package, by RL alone on one-digit sums "
                  "(configs/smollm2.toml): held-out pass@1 before and after, reward curve, step seconds, tokens/s",
    "lora": "full fine-tuning against LoRA refit as merged weights and as adapters alone, alternating: refit bytes "
            "and seconds, trainer compute, steps/min, checkpoint size, memory",
    "variants": "grpo, dr_grpo, dapo (clip-higher + dynamic sampling), rloo and grpo with KL on the tool_chat task: "
                "reward curves, held-out pass@1, steps/min",
    "hangs": "each process of a run frozen (SIGSTOP) in turn: seconds to the probe that caught it, its replacement "
             "and the next train step; train steps the repair undid",
    "replay": "environments of verifiers, NeMo Gym and OpenEnv under whole-tree kills, continued by replay against "
              "regenerated from scratch: tokens generated again, restart time, replay seconds against turns",
    "peers": "turnkeep against TRL's GRPOTrainer on one tiny chat model and single-turn task: time to a reward, "
             "tokens/s, steps/min, memory; each killed halfway and resumed: steps lost, restart to next step",
}
ORDER = list(BENCHMARKS)
REPO = Path(__file__).resolve().parents[1]


def add_bench_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="measure what snapshots and recovery cost (prints tables)")
    names = bench.add_subparsers(dest="bench", required=True)
    for name, text in BENCHMARKS.items():
        parser = names.add_parser(name, help=text, description=text)
        parser.add_argument("--out", type=Path, default=Path("runs/bench"), help="where runs and results go")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="config override for the runs it starts")
        importlib.import_module(f"turnkeep.bench.{name}").add_arguments(parser)
    about = "every benchmark, sized for about two hours on 2 cores, into one --out; then BENCHMARKS.md from it"
    every = names.add_parser("all", help=about, description=about)
    every.add_argument("--out", type=Path, default=Path("runs/bench"), help="where runs and results go")
    every.add_argument("--file", type=Path, default=REPO / "BENCHMARKS.md", help="the markdown file to write")
    every.add_argument("--only", type=_names, default=None, metavar="NAME,NAME",
                       help="these benchmarks of the pass only, in the pass's order")
    markdown = names.add_parser("markdown", help="render every result in --out into BENCHMARKS.md (sections of "
                                             "benchmarks --out has no result for stay as they are)")
    markdown.add_argument("--out", type=Path, default=Path("runs/bench"))
    markdown.add_argument("--file", type=Path, default=REPO / "BENCHMARKS.md")


def run_bench(args: argparse.Namespace) -> int:
    from turnkeep.bench.report import write_result

    if args.bench == "all":
        return bench_pass(args.out, args.file, args.only)
    if args.bench == "markdown":
        args.file.write_text(render_markdown(args.out, args.file.read_text() if args.file.exists() else ""))
        print(f"turnkeep bench: wrote {args.file}")
        return 0
    result = importlib.import_module(f"turnkeep.bench.{args.bench}").run(args)
    command = "turnkeep " + " ".join(shlex.quote(a) for a in args.argv)
    path = write_result(args.out, result, command)
    print(f"\n## {result.name}\n\n{result.table}\n")
    for note in result.notes:
        print(f"- {note}")
    print(f"\nturnkeep bench: {path}")
    return 0


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"no benchmark is named {', '.join(unknown) or repr(text)}; the benchmarks "
                                         f"are {', '.join(BENCHMARKS)}")
    return [name for name in BENCHMARKS if name in names]


def render_markdown(out: Path, previous: str = "") -> str:
    """Every result in `out` as a section; a benchmark without one keeps its section of `previous` (its own command
    and machine lines say when and how it was measured)."""
    results = _results(out)
    if not results:
        raise SystemExit(f"no results in {out}; run `turnkeep bench <name>` first")
    sections = {name: body for name, body in _sections(previous).items() if name not in results}
    for name, r in results.items():
        m = r["machine"]
        about = BENCHMARKS.get(name, "")
        lines = [f"## {name}", "", about[:1].upper() + about[1:] + ".", "", r["table"], ""]
        lines += [f"- {note}" for note in r["notes"]]
        lines += ["", f"Command: `{r['command']}`  ", f"Machine: {m['cpu']}, {m['cores']} cores, "
                  f"{m['memory_gib']} GiB, Python {m['python']}, {m['os']}", ""]
        sections[name] = "\n".join(lines)
    head = ["# Benchmarks", "", "What a snapshot and a recovery cost, measured side by side on one machine. "
            "Every table is written by `turnkeep bench <name>` (the command is under each table; results are "
            "JSON in `--out`, default `runs/bench`) and collected here with `turnkeep bench markdown`; "
            "`turnkeep bench all` runs them all and collects them. Figures, not timed tests.", ""]
    line = pass_line(out)
    if line is None:
        # `out` is not a pass: the sections it keeps still come from the pass the previous file named.
        line = next((kept for kept in previous.split("\n## ", 1)[0].splitlines() if kept.startswith(PASS_SENTENCE)),
                    None)
    if line is not None:
        head += [line, ""]
    ordered = sorted(sections, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
    return "\n".join(head + [sections[name] for name in ordered])


RESULT_KEYS = {"table", "notes", "command", "machine"}
"""What `bench.report.write_result` writes into every result."""


def _results(out: Path) -> dict[str, dict]:
    """The results in `out`, by benchmark. A JSON file named after no benchmark is skipped with a line on stderr; a
    benchmark's own file that is not a result stops the render with one line (its section would be lost)."""
    results = {}
    for path in sorted(out.glob("*.json")):
        if path.name == PASS_FILE:  # the pass's own record
            continue
        if path.stem not in BENCHMARKS:
            print(f"turnkeep bench: skipped {path}: no benchmark is named {path.stem!r}", file=sys.stderr)
            continue
        try:
            value = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as err:
            value, problem = None, f"not JSON: {err}"
        else:
            missing = RESULT_KEYS - (value.keys() if isinstance(value, dict) else set())
            problem = f"no {', '.join(sorted(missing))}" if missing else None
        if problem is not None:
            raise SystemExit(f"{path} is not a result of `turnkeep bench {path.stem}` ({problem}); run that command "
                             "again or move the file out of --out")
        results[path.stem] = value
    return results


def _sections(text: str) -> dict[str, str]:
    """`## name` -> that section's text up to the next `## ` heading (the file's head is not a section)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        if current is not None:
            sections[current].append(line)
    return {name: "\n".join(lines).rstrip("\n") + "\n" for name, lines in sections.items()}
