"""Crash-detection latency: a real MCP stdio server killed mid-call -> failed outcome.

One ``statemachine.mcp.MCPStdioTools`` runs tests/servers/mcp_crashy.py (an official
SDK ``MCPServer``). For each of ``kills`` rounds: start the server (a restart after
the previous kill), call its ``hang`` tool, let the request reach the server
(50 ms), then ``SIGKILL`` the server's process and time from just before the kill
to the moment ``invoke`` returns its ``process_crashed`` outcome (exit signal and
stderr tail included). No timeout is set anywhere: the outcome comes from watching
the process, not from a clock running out. Target: median <= 20 ms.

The mcp SDK's own stdio client reports such a death as ``MCPError(-32000,
'Connection closed')`` (no exit status, no stderr) about 6-9 ms after it; the
numbers here include building the diagnostics.

    python -m benchmarks.crash_latency [kills]
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SERVER = Path(__file__).resolve().parent.parent / "tests" / "servers" / "mcp_crashy.py"
TARGET_MS = 20.0


async def _measure(kills: int) -> dict[str, Any]:
    import statemachine as sm
    from statemachine.mcp import MCPStdioTools

    samples: list[float] = []
    starts: list[float] = []
    categories: set[str] = set()
    signalled = 0
    async with MCPStdioTools("crashy", [sys.executable, str(SERVER)], max_restarts=kills) as tools:
        for i in range(kills):
            t0 = time.perf_counter()
            await tools.start()
            starts.append((time.perf_counter() - t0) * 1000)
            pid = tools.pid
            if pid is None:
                raise RuntimeError("the MCP test server did not start")
            call = sm.ToolCall(f"k{i}", "crashy", "hang", {})
            pending = asyncio.ensure_future(tools.invoke(call))
            await asyncio.sleep(0.05)  # the tools/call request reaches the server
            if pending.done():
                raise RuntimeError(f"the hang call returned early: {pending.result()!r}")
            killed = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            outcome = await pending
            samples.append((time.perf_counter() - killed) * 1000)
            categories.add(str(outcome.category))
            signalled += "SIGKILL" in str(outcome.content)
    median = statistics.median(samples)
    return {
        "kills": kills,
        "median_ms": median,
        "worst_ms": max(samples),
        "best_ms": min(samples),
        "samples_ms": samples,
        "all_process_crashed": categories == {"process_crashed"},
        "signal_reported": signalled,
        "server_start_median_ms": statistics.median(starts),
        "target_ms": TARGET_MS,
        "met": median <= TARGET_MS and categories == {"process_crashed"},
    }


def run(kills: int = 20) -> dict[str, Any]:
    """Kill the server ``kills`` times mid-call; median and worst latency in ms."""
    if kills < 1:
        raise ValueError(f"kills: must be >= 1, got {kills!r}")
    return asyncio.run(_measure(kills))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    result = run(int(args[0]) if args else 20)
    print(
        f"crash -> process_crashed outcome over {result['kills']} SIGKILLs mid-call: "
        f"median {result['median_ms']:.2f} ms, worst {result['worst_ms']:.2f} ms, "
        f"best {result['best_ms']:.2f} ms (target median <= {TARGET_MS:g} ms: "
        f"{'met' if result['met'] else 'MISSED'}); "
        f"all process_crashed: {result['all_process_crashed']}, "
        f"signal named: {result['signal_reported']}/{result['kills']}; "
        f"server (re)start median {result['server_start_median_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
