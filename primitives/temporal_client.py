"""A Temporal client and a worker, the same way in every process that runs one, and the activities a worker
registers: every method of its activity classes that defines one, each checked against its step.

Each process has its own task queue (`schemas.names`): the controller's runs the
workflows and the control activities, the trainer's runs the hold. A server we did not
start may need TLS (a client certificate, a CA) or an API key (Temporal Cloud): every
process reads the same files named by `[temporal]`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, get_type_hints

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig
from temporalio.worker import Worker

from turnkeep.primitives.build_id import code_build_id
from turnkeep.schemas.config_services import TemporalSecurity
from turnkeep.schemas.step_registry import declared_steps
from turnkeep.schemas.steps import Runs, Step


class TemporalSecurityError(ValueError):
    """A TLS or API key file named by [temporal] cannot be read; the message names it."""


async def connect(address: str, namespace: str, security: TemporalSecurity | None = None) -> Client:
    security = security or TemporalSecurity()
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter, tls=tls_config(security),
        api_key=_api_key(security),
    )


def _api_key(security: TemporalSecurity) -> str | None:
    if security.api_key_file:
        return _read_text(security.api_key_file, "api_key_file").strip()
    if not security.api_key_from_environment:
        return None
    from temporalio.envconfig import ClientConfigProfile  # reads temporal.toml only when asked to

    key = ClientConfigProfile.load(security.profile).api_key
    if not key:
        where = f"profile {security.profile!r} of temporal.toml" if security.profile else "TEMPORAL_API_KEY"
        raise TemporalSecurityError(f"the run connects to Temporal with the API key of {where}, which this process "
                                    "does not have; set it where this process runs (every node of a cluster), or "
                                    "name a file in temporal.api_key_file")
    return key


def tls_config(security: TemporalSecurity) -> TLSConfig | bool:
    if not security.uses_tls():
        return False
    return TLSConfig(
        server_root_ca_cert=_read(security.tls_ca, "tls_ca"),
        client_cert=_read(security.tls_cert, "tls_cert"),
        client_private_key=_read(security.tls_key, "tls_key"),
        domain=security.tls_server_name,
    )


def _read(path: Path | None, key: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as err:
        raise TemporalSecurityError(f"temporal.{key} = {str(path)!r} cannot be read ({err.strerror}); "
                                    "give a readable PEM file") from None


def _read_text(path: Path, key: str) -> str:
    data = _read(path, key)
    assert data is not None
    return data.decode()


def start_worker(client: Client, task_queue: str, *, activities: Sequence = (), workflows: Sequence = ()) -> tuple[Worker, asyncio.Task]:
    worker = Worker(
        client, task_queue=task_queue, activities=list(activities), workflows=list(workflows),
        max_concurrent_activities=32, build_id=code_build_id(),
    )
    return worker, asyncio.get_running_loop().create_task(worker.run(), name=f"worker:{task_queue}")


class StepImplementationError(ValueError):
    """An activity that does not match the step of its name; the message names both and the fix."""


def step_activities(*implementations: object, runs: Collection[Runs]) -> list:
    """Every activity method the objects define, checked against its step (`schemas.steps`): a declared step that
    runs where this worker runs (`runs`), taking the step's input model and returning its result model. A new
    method is registered by defining it; a mismatch stops the worker's start with one line."""
    steps = declared_steps()
    found = [method for obj in implementations for _, method in inspect.getmembers(obj, inspect.ismethod)
             if activity_name(method) is not None]
    for method in found:
        _check_against_step(method, steps, runs)
    return found


def activity_name(fn: Any) -> str | None:
    """The activity name `fn` is defined as, or None when it is no activity."""
    definition = activity._Definition.from_callable(fn)  # noqa: SLF001 - the SDK's own record of @activity.defn
    return None if definition is None else definition.name


def _check_against_step(method: Any, steps: dict[str, Step], runs: Collection[Runs]) -> None:
    name = activity_name(method)
    where = f"{type(method.__self__).__name__}.{method.__name__} (activity {name!r})"
    step = steps.get(name)
    if step is None:
        raise StepImplementationError(f"{where} implements no declared step; declare it with Step(...) beside its "
                                      "models in schemas/")
    if step.runs not in runs:
        raise StepImplementationError(f"{where}: its step runs on the {step.runs} worker, this one serves "
                                      f"{', '.join(sorted(runs))}; move the method to that process's activities")
    hints = get_type_hints(method)
    params = [p for p in inspect.signature(method).parameters if p in hints]
    taken, returned = (hints[params[0]] if params else None), hints.get("return")
    if taken is not step.input or returned is not step.result:
        raise StepImplementationError(
            f"{where} takes {getattr(taken, '__name__', taken)} and returns {getattr(returned, '__name__', returned)}; "
            f"its step takes {step.input.__name__} and returns {step.result.__name__}")
