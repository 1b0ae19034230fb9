"""A Temporal client and a worker, the same way in every process that runs one.

Each process has its own task queue (`schemas.names`): the controller's runs the
workflows and the control activities, the trainer's runs the hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker


async def connect(address: str, namespace: str) -> Client:
    return await Client.connect(address, namespace=namespace, data_converter=pydantic_data_converter)


def start_worker(client: Client, task_queue: str, *, activities: Sequence = (), workflows: Sequence = ()) -> tuple[Worker, asyncio.Task]:
    worker = Worker(
        client, task_queue=task_queue, activities=list(activities), workflows=list(workflows),
        max_concurrent_activities=32,
    )
    return worker, asyncio.get_running_loop().create_task(worker.run(), name=f"worker:{task_queue}")
