"""Load a user's environment class by import path and check it before anything starts.

`load_environment(entry, options)` is all-or-nothing: it either returns the class and
its validated options, or raises `EnvironmentLoadError` with one line that names the
entry, the problem and the fix (the module does not import, the name is missing, it is
not an `Environment` subclass, it is abstract, its recovery mode is missing or unknown,
its `Options` refuse the configured options). The run checks every python environment
this way at start-up, before the run directory is written.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from turnkeep._moved import moved_module_message
from turnkeep.envs.environment import Environment
from turnkeep.schemas.choices import RecoveryMode

RECOVERY_MODES = tuple(mode.value for mode in RecoveryMode)


class EnvironmentLoadError(ValueError):
    """A configured environment cannot be used; the message is one line with the fix."""


@dataclass(frozen=True)
class LoadedEnvironment:
    cls: type[Environment]
    options: BaseModel


def load_environment(entry: str, options: dict[str, Any] | None = None, where: str = "entry") -> LoadedEnvironment:
    cls = load_environment_class(entry, where)
    return LoadedEnvironment(cls, check_options(cls, options or {}, where))


def load_environment_class(entry: str, where: str = "entry") -> type[Environment]:
    module_name, sep, attribute = entry.partition(":")
    if not sep or not module_name or not attribute:
        raise EnvironmentLoadError(f"{where} = {entry!r}: use the form \"package.module:ClassName\"")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name.split(".")[0] and moved_module_message(module_name):
            raise EnvironmentLoadError(f"{where} = {entry!r}: turnkeep's modules moved under the one name `turnkeep`; "
                                       f"use 'turnkeep.{entry}'") from None
        raise _does_not_import(where, entry, module_name, err) from None
    except Exception as err:  # noqa: BLE001 - any import-time error of the user's module is named, whatever it is
        raise _does_not_import(where, entry, module_name, err) from None
    obj = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise EnvironmentLoadError(f"{where} = {entry!r}: {module_name} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    return check_environment_class(obj, f"{where} = {entry!r}")


def _does_not_import(where: str, entry: str, module_name: str, err: Exception) -> EnvironmentLoadError:
    return EnvironmentLoadError(
        f"{where} = {entry!r}: module {module_name!r} does not import ({type(err).__name__}: {err}); "
        "install its package where the environment server runs (pip install -e <your package>)"
    )


def check_environment_class(obj: Any, label: str) -> type[Environment]:
    if not (inspect.isclass(obj) and issubclass(obj, Environment)):
        raise EnvironmentLoadError(
            f"{label}: {obj!r} is not an environment class; subclass turnkeep.Environment"
        )
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        raise EnvironmentLoadError(f"{label}: {obj.__name__} does not implement {missing}")
    mode = getattr(obj, "recovery_mode", None)
    if mode is None:
        raise EnvironmentLoadError(
            f"{label}: {obj.__name__} has no recovery_mode; set recovery_mode = one of {list(RECOVERY_MODES)}"
        )
    if mode not in RECOVERY_MODES:
        raise EnvironmentLoadError(
            f"{label}: {obj.__name__}.recovery_mode = {mode!r}; use one of {list(RECOVERY_MODES)}"
        )
    if not isinstance(getattr(obj, "kind", None), str):
        raise EnvironmentLoadError(f"{label}: {obj.__name__} has no kind; set kind = \"<a short name>\"")
    options_model = getattr(obj, "Options", None)
    if not (inspect.isclass(options_model) and issubclass(options_model, BaseModel)):
        raise EnvironmentLoadError(f"{label}: {obj.__name__}.Options must be a pydantic model class")
    return obj


def check_options(cls: type[Environment], options: dict[str, Any], where: str = "entry") -> BaseModel:
    try:
        return cls.Options.model_validate(options)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in err.errors()[:5]
        )
        raise EnvironmentLoadError(
            f"{where}: {cls.__name__} refuses its options ({problems}); fix [environments.<name>] options"
        ) from None
