"""A Temporal worker in its own process, for the test that SIGKILLs one mid-wait.

    python -m tests.temporal_worker <address> <task-queue>

Prints ``ready`` once it polls, then runs until killed. No workflow cache
(``max_cached_workflows=0``), so the server does not keep the killed worker's sticky
queue: the next workflow task goes to whichever worker polls the task queue.
"""

from __future__ import annotations

import asyncio
import os
import sys

from temporalio.client import Client
from temporalio.worker import Worker

from statemachine import temporal as smt

from .temporal_support import activities


async def main(address: str, task_queue: str) -> None:
    """Poll ``task_queue`` until killed."""
    client = await Client.connect(address)
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[smt.SessionWorkflow],
        activities=activities().all,
        workflow_runner=smt.sandbox_runner(),
        max_cached_workflows=0,
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1], sys.argv[2]))
    finally:
        os._exit(0)  # never run interpreter teardown under the SDK's runtime threads
