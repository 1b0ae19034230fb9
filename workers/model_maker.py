"""The model a run trains: the configured `model.path` (a folder, or a hub id's folder in the Hugging Face cache:
`model_source.py`), or the tiny model made (once, cached) from the conversations this run's environments hand in.

`transcript_source(cfg)` picks them: the default task's transcripts, or, with
`[model.tiny] demonstrations`, an environment class's demonstrations. The name is an
`[environments.<name>]` of kind "python" (its entry and options), or an import path
`package.module:ClassName` (a remote environment's class, with its default options). The
class is imported (its package must be installed where the model is made) and must offer
demonstrations; `DemonstrationsError` names the problem otherwise.
"""

from __future__ import annotations

from pathlib import Path

from turnkeep.envs.adapters import ADAPTERS
from turnkeep.envs.calc_transcripts import CalcTranscripts
from turnkeep.envs.codec import LINE_TEMPLATE
from turnkeep.envs.environment import Environment, NoOptions
from turnkeep.envs.kinds import ENV_KINDS
from turnkeep.envs.loading import EnvironmentLoadError, load_environment
from turnkeep.gpu_workers.tiny_model.model_files import check_model_files
from turnkeep.gpu_workers.tiny_model.recipe import cached_model_dir
from turnkeep.gpu_workers.tiny_model.transcripts import DemonstrationsError, DemoSource, TranscriptSource
from turnkeep.schemas.choices import EnvironmentKind
from turnkeep.schemas.config import TurnkeepConfig
from turnkeep.workers.model_source import with_model_resolved


def tiny_model_dir(cfg: TurnkeepConfig, eval_rollouts: int | None = None) -> Path:
    """`model.path`, or the tiny model's cached directory (made first if it is not there yet; `eval_rollouts`
    measure its starting reward, the maker's default when None)."""
    if cfg.model.path is not None:  # a folder, checked, not made (a tool's hub id is resolved here; a run's was)
        return check_model_files(Path(with_model_resolved(cfg).model.path).expanduser())
    from turnkeep.gpu_workers.tiny_model.build import ensure_tiny_model  # torch: only where a model is made

    measure = {} if eval_rollouts is None else {"eval_rollouts": eval_rollouts}
    return ensure_tiny_model(cfg.model, transcript_source(cfg), cfg.run.seed, **measure)


def cached_tiny_model_dir(cfg: TurnkeepConfig) -> Path | None:
    """The tiny model's directory when it was made before on this machine (no torch imported to find it); None
    when `model.path` is set or the model must be made (`tiny_model_dir`, on a node of the cluster)."""
    if cfg.model.path is not None:
        return None
    return cached_model_dir(cfg.model, transcript_source(cfg), cfg.run.seed)


def transcript_source(cfg: TurnkeepConfig) -> TranscriptSource:
    """The conversations the tiny model learns from; raises DemonstrationsError for unusable demonstrations."""
    name = cfg.model.tiny.demonstrations
    if name is None:
        return CalcTranscripts(cfg.task)
    where = f"model.tiny.demonstrations = {name!r}"
    entry, options = _entry_and_options(cfg, name, where)
    try:
        loaded = load_environment(entry, options, "entry")
    except EnvironmentLoadError as err:
        raise DemonstrationsError(f"{where}: {err}") from None
    if getattr(loaded.cls.demonstrations, "__func__", None) is Environment.demonstrations.__func__:
        raise DemonstrationsError(
            f"{where}: {entry} offers no demonstrations; implement the classmethod demonstrations(rng, count, "
            "options), or unset model.tiny.demonstrations to warm-start on the calculator"
        )
    template = loaded.cls.demonstration_template or LINE_TEMPLATE
    return DemoSource(name, entry, loaded.cls, loaded.options, template, loaded.cls.demonstration_tokens)


def _entry_and_options(cfg: TurnkeepConfig, name: str, where: str) -> tuple[str, dict]:
    if ":" in name:
        return name, {}
    spec = cfg.environments.get(name)
    if spec is None:
        raise DemonstrationsError(f"{where}: there is no [environments.{name}] (configured: "
                                  f"{', '.join(sorted(cfg.environments))}); name one of them")
    if spec.kind in ENV_KINDS and ENV_KINDS[spec.kind].Options is not NoOptions:  # a built-in kind with options
        cls = ENV_KINDS[spec.kind]
        return f"{cls.__module__}:{cls.__qualname__}", spec.options
    if spec.kind in ADAPTERS:  # an ecosystem's environment: its adapter class makes them
        return ADAPTERS[spec.kind][0], spec.options
    if spec.kind != EnvironmentKind.PYTHON or spec.entry is None:
        raise DemonstrationsError(
            f"{where}: [environments.{name}] is kind = '{spec.kind}'; demonstrations come from a class loaded by "
            'entry (kind = "python"). For a remote server, name its class instead: demonstrations = '
            '"package.module:ClassName" (installed where the model is made)'
        )
    return spec.entry, spec.options
