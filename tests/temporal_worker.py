"""A Temporal worker in its own process, for the test that SIGKILLs one mid-wait.

    python -m tests.temporal_worker <address> <task-queue> [sticky]

Prints ``ready`` once it polls, then runs until killed. No workflow cache
(``max_cached_workflows=0``), so the server does not keep the killed worker's sticky
queue: the next workflow task goes to whichever worker polls the task queue. With
``sticky``, a cache and ``sticky_queue_schedule_to_start_timeout`` of
``smt.STICKY_QUEUE_TIMEOUT_S``, as the docs advise: the next workflow task waits that
long on the dead worker's sticky queue.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from statemachine import temporal as smt

from .temporal_support import activities


async def main(address: str, task_queue: str, sticky: bool) -> None:
    """Poll ``task_queue`` until killed."""
    client = await Client.connect(address)
    cache: dict[str, Any] = {"max_cached_workflows": 0}
    if sticky:
        cache = {
            "sticky_queue_schedule_to_start_timeout": timedelta(seconds=smt.STICKY_QUEUE_TIMEOUT_S)
        }
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[smt.SessionWorkflow],
        activities=activities().all,
        workflow_runner=smt.sandbox_runner(),
        **cache,
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["sticky"]))
    finally:
        os._exit(0)  # never run interpreter teardown under the SDK's runtime threads
