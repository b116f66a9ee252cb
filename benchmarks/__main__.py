"""Run every benchmark in one process and print the numbers side by side, with ratios.

    python -m benchmarks                  # everything available (about a minute)
    python -m benchmarks --quick          # tiny counts: a smoke run, numbers meaningless
    python -m benchmarks --only retry,events --json results.json
    python -m benchmarks --skip crash,redis,hypothesis
    python -m benchmarks --profile        # also profile the engine's hot path

Measurements: ``retry`` (per retry decision vs tenacity, a hand loop, raw transitions
and a dict table), ``events`` (µs per event on every path), ``creation`` (session and
turn creation, and against 1k/10k/100k live turns), ``memory`` (bytes per live turn at
10,000 live), ``copy`` (snapshot + restore against JSON, ``Worker.advance`` against one
event), ``driver`` (events/s through ``sm.arun_turn`` at 10,000 concurrent
turns), ``classify`` (µs per ``sm.classify`` on a small and on 10 MB bodies), ``otel``
(what an observer costs per event: records, a trace file, telemetry), ``temporal``
(the engine's share of a session inside a Temporal workflow, sessions/s),
``frameworks`` (an agent run through pydantic-ai's and the Agents SDK's ``EngineModel``
against the framework alone, zero-latency fake models), ``check`` (the model check of
default settings), ``hypothesis`` (examples/s
of the stateful suite), ``crash`` (crash-detection latency of real plugin processes)
and ``redis`` (the Redis session store), the last two when their modules and
prerequisites are present. A measurement that cannot run says why and is skipped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

QUICK: dict[str, dict[str, Any]] = {
    "retry": {"n": 20, "repeats": 2},
    "events": {"n": 20, "repeats": 2},
    "creation": {
        "n": 50,
        "repeats": 2,
        "levels": (10, 100),
        "batch": 20,
        "add_model_levels": (10, 20),
    },
    "memory": {"n": 50, "compare": 10},
    "driver": {"n": 20, "repeats": 1},
    "check": {"repeats": 1},
    "hypothesis": {},
    "crash": {"kills": 2},
    "redis": {"workers": (1,), "steps": 50, "sessions": 4, "rounds": 1},
    "copy": {"n": 10, "repeats": 1},
    "tools": {"turns": 5, "repeats": 1},
    "classify": {"n": 5, "big_n": 2, "repeats": 1, "size": 100_000},
    "otel": {"n": 50, "repeats": 2},
    "temporal": {"sessions": 3, "levels": (1, 2), "repeats": 1},
    "frameworks": {"n": 5, "repeats": 1},
}

ALL = (
    "retry",
    "events",
    "creation",
    "memory",
    "copy",
    "tools",
    "driver",
    "classify",
    "otel",
    "frameworks",
    "check",
    "hypothesis",
    "crash",
    "redis",
    "temporal",
)


def machine_info() -> dict[str, Any]:
    """Where the numbers come from: CPU, cores, Python, library versions, date, commit."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for dist in ("turnstate", "transitions", "attrs", "tenacity", "hypothesis"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    commit = None
    git = shutil.which("git")
    if git:
        done = subprocess.run(  # noqa: S603 - read-only git query
            [git, "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        commit = done.stdout.strip() or None
    return {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "versions": versions,
        "commit": commit,
    }


# -- running ------------------------------------------------------------------------


def _optional(module: str, needs: Callable[[], str | None]) -> Callable[..., dict[str, Any]]:
    """A runner for another helper's module: skip if missing or unprepared."""

    def run(**kwargs: Any) -> dict[str, Any]:
        try:
            mod = importlib.import_module(f"benchmarks.{module}")
        except ImportError as exc:
            return {"skipped": f"benchmarks/{module}.py is not available ({exc})"}
        missing = needs()
        if missing:
            return {"skipped": missing}
        result: dict[str, Any] = mod.run(**kwargs)
        return result

    return run


def _needs_redis() -> str | None:
    return None if shutil.which("redis-server") else "redis-server is not on PATH"


def _nothing() -> str | None:
    return None


def _runner(name: str) -> Callable[..., dict[str, Any]]:
    if name == "crash":
        return _optional("crash_latency", _nothing)
    if name == "redis":  # the random fleets and the 90 %-affinity ones
        redis = _optional("redis_store", _needs_redis)
        return lambda **kwargs: redis(affinity=0.9, **kwargs)
    if name == "temporal":  # its run() says "skipped" itself without the temporal CLI
        return _optional("temporal", _nothing)
    if name == "frameworks":  # its run() skips a framework that is not installed
        return _optional("frameworks", _nothing)
    module = {
        "check": "model_check",
        "hypothesis": "hypothesis_rate",
        "copy": "state_copy",
        "tools": "tool_round",
        "classify": "classify_bodies",
    }.get(name, name)
    run: Callable[..., dict[str, Any]] = importlib.import_module(f"benchmarks.{module}").run
    return run


def run_all(
    names: Sequence[str] = ALL, *, quick: bool = False, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the named measurements; ``{"machine": ..., name: result, ...}``."""
    from . import _timing

    _timing.FULL_COLLECT = not quick
    results: dict[str, Any] = {"machine": machine_info(), "quick": quick}
    for name in names:
        kwargs = QUICK[name] if quick else {}
        log(f"… {name}")
        t0 = time.perf_counter()
        try:
            result = _runner(name)(**kwargs)
        except Exception as exc:  # one broken measurement must not hide the others
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        result["wall_s"] = time.perf_counter() - t0
        results[name] = result
    return results


# -- printing -----------------------------------------------------------------------


def _fmt(value: Any, unit: str = "") -> str:
    if isinstance(value, list | tuple) and len(value) > 6:
        numbers = [v for v in value if isinstance(v, int | float)]
        if len(numbers) == len(value):
            return f"{len(value)} values, {_fmt(min(numbers))}..{_fmt(max(numbers))}"
        return f"{len(value)} items"
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        return f"{text}{unit}"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    return f"{value}{unit}"


def _table(rows: list[tuple[str, str]], indent: str = "  ") -> list[str]:
    width = max((len(k) for k, _ in rows), default=0)
    return [f"{indent}{k:<{width}}  {v}" for k, v in rows]


def _verdict(result: dict[str, Any]) -> str:
    if "met" not in result:
        return ""
    return "  [target MET]" if result["met"] else "  [target MISSED]"


def _section(name: str, title: str, result: dict[str, Any]) -> list[str]:
    head = f"== {title}{_verdict(result)}  ({result.get('wall_s', 0):.1f} s)"
    if "skipped" in result:
        return [head, f"  skipped: {result['skipped']}"]
    if "error" in result:
        return [head, f"  ERROR: {result['error']}"]
    printer = _PRINTERS.get(name, _generic)
    return [head, *printer(result)]


def _generic(result: dict[str, Any]) -> list[str]:
    rows = []
    for key, value in result.items():
        if key in {"wall_s", "traceback"}:
            continue
        if isinstance(value, dict):
            for k, v in value.items():
                rows.append((f"{key}.{k}", _fmt(v)))
        else:
            rows.append((key, _fmt(value)))
    return _table(rows)


def _print_retry(r: dict[str, Any]) -> list[str]:
    lines = [f"  {r['unit']}; pattern: {r['pattern']}"]
    lines += _table([(k, _fmt(v, " µs")) for k, v in r["rows"].items()])
    lines.append("  ratios:")
    lines += _table([(k, f"{v:.3f}x") for k, v in r["ratios"].items()], "    ")
    lines += [f"  target: {k} <= {v}" for k, v in r["target"].items()]
    return lines


def _print_events(r: dict[str, Any]) -> list[str]:
    lines = [f"  {r['unit']}"]
    for path, data in r["paths"].items():
        steps = ", ".join(f"{k} {v:.2f}" for k, v in data["steps_us"].items())
        lines.append(
            f"  {path:<11} median {data['median_us_per_event']:.2f} µs/event, "
            f"mean {data['mean_us_per_event']:.2f}, worst {data['worst_us']:.2f}"
        )
        lines.append(f"  {'':<11}   {steps}")
    lines.append(
        f"  worst event: {r['worst_event_us']:.2f} µs median, "
        f"{r['worst_event_best_us']:.2f} µs best of repeats (target <= 5 µs)"
    )
    return lines


def _print_creation(r: dict[str, Any]) -> list[str]:
    lines = _table([(k, _fmt(v, " µs")) for k, v in r["creation_us"].items()])
    lines.append("  Session()+new_turn()+start() with L live turns (flat = no growth):")
    lines += _table(
        [(k, _fmt(v, " µs")) for k, v in r["growth_us_per_session_turn_start"].items()], "    "
    )
    lines.append(f"    last/first: {r['growth_ratio_last_first']:.2f}x")
    lines.append("  for comparison, transitions add_model into one shared machine:")
    lines += _table([(k, _fmt(v, " µs")) for k, v in r["transitions_add_model_us"].items()], "    ")
    lines.append(f"    last/first: {r['transitions_add_model_ratio_last_first']:.2f}x")
    lines.append("  target: new_turn() <= 10 µs")
    return lines


def _print_memory(r: dict[str, Any]) -> list[str]:
    lines = [f"  {r['unit']}, {r['live']:,} live turns, each in its own session"]
    for shape, data in r["shapes"].items():
        lines.append(
            f"  {shape:<16} turn {data['per_turn_bytes']:,.0f} B, session "
            f"{data['per_session_bytes']:,.0f} B, session+turn "
            f"{data['per_session_and_turn_bytes']:,.0f} B"
        )
    lines.append("  for comparison (bytes per object):")
    lines += _table([(k, _fmt(v, " B")) for k, v in r["comparison"].items()], "    ")
    lines.append("  target: <= 2 KB per live turn")
    return lines


def _print_driver(r: dict[str, Any]) -> list[str]:
    paths = [(f"  µs/event, {k}", _fmt(v, " µs")) for k, v in r["us_per_event_by_path"].items()]
    paths += [
        (f"  arun_turn / hand-written asyncio loop, {k}", f"{v:.2f}x")
        for k, v in r.get("over_hand_written_floor", {}).items()
    ]
    paths += [
        (f"  run_turn / plain loop, {k}", f"{v:.2f}x")
        for k, v in r.get("run_turn_over_plain_loop", {}).items()
    ]
    return _table(
        [
            ("concurrent turns", _fmt(r["concurrent_turns"])),
            ("transitions per run", _fmt(r["events_per_run"])),
            ("seconds per run (median)", _fmt(r["seconds_per_run"], " s")),
            ("events/s through arun_turn", _fmt(r["events_per_s"])),
            ("µs per event through arun_turn", _fmt(r["us_per_event"], " µs")),
            ("events/s by hand (turn.send, no asyncio)", _fmt(r["by_hand_events_per_s"])),
            ("driver cost / engine cost", f"{r['driver_overhead_x']:.2f}x"),
            ("statuses", str(r["statuses"])),
            *paths,
        ]
    )


def _print_hypothesis(r: dict[str, Any]) -> list[str]:
    lines = [
        f"  profile {r['profile']}, pytest exit {r['pytest_exit']}, wall {r['pytest_wall_s']:.1f} s"
    ]
    lines += _table(
        [
            (
                name,
                f"{t['examples']:.0f} examples ({t.get('invalid', 0):.0f} invalid) in "
                f"{t['seconds']:.2f} s = {t['examples_per_s']:.0f}/s",
            )
            for name, t in r["tests"].items()
        ]
    )
    lines.append(f"  total: {r['examples']:.0f} examples, {r['examples_per_s']:.0f} examples/s")
    return lines


def _print_tools(r: dict[str, Any]) -> list[str]:
    lines = _table([(f"{n} call(s)", f"{v:.2f} µs per call") for n, v in r["per_call_us"].items()])
    lines.append(f"  largest / 1-call round: {r['worst_over_one_call']:.2f}x (target <= 2)")
    return lines


def _print_copy(r: dict[str, Any]) -> list[str]:
    lines = _table([(k, f"{v:.2f} µs") for k, v in r["snapshot_us"].items()])
    target = r["target"]["snapshot_restore_over_json"]
    lines.append(
        f"  snapshot+restore / json: {r['snapshot_restore_over_json']:.2f}x (target <= {target:g})"
    )
    lines += _table([(k, f"{v:.2f} µs per event") for k, v in r["advance_us"].items()])
    advance = r["target"]["advance_over_event"]
    lines.append(
        f"  Worker.advance / one event: {r['advance_over_event']:.1f}x (target <= {advance:g})"
    )
    lines.append(f"  json.dumps of the record / one event: {r['record_dumps_over_event']:.1f}x")
    return lines


def _print_otel(r: dict[str, Any]) -> list[str]:
    lines = [f"  {r['unit']}"]
    lines += _table(
        [
            (k, f"{v:.2f} µs (+{r['extra_us_per_event'][k]:.2f})")
            for k, v in r["us_per_event"].items()
        ]
    )
    return lines


def _print_classify(r: dict[str, Any]) -> list[str]:
    lines = [f"  {r['unit']}, big bodies of {r['body_bytes']:,} bytes"]
    lines += _table([(k, _fmt(v, " µs")) for k, v in r["rows"].items()])
    bounds = ", ".join(f"{k} {v:,}" for k, v in r["bounds"].items())
    lines.append(f"  read within: {bounds}")
    return lines


_PRINTERS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "classify": _print_classify,
    "otel": _print_otel,
    "temporal": lambda r: importlib.import_module("benchmarks.temporal").lines(r),
    "redis": lambda r: importlib.import_module("benchmarks.redis_store").lines(r),
    "copy": _print_copy,
    "tools": _print_tools,
    "retry": _print_retry,
    "events": _print_events,
    "creation": _print_creation,
    "memory": _print_memory,
    "driver": _print_driver,
    "hypothesis": _print_hypothesis,
}

TITLES = {
    "retry": "1. per retry decision, side by side",
    "events": "2. per event on every path",
    "creation": "3. creating a session and a turn",
    "memory": "4a. memory per live turn",
    "copy": "6. copying state: snapshot/restore and Worker.advance",
    "tools": "8. a tool round of n calls, per call",
    "driver": "4b. asyncio driver throughput",
    "classify": "7. sm.classify on small and hostile bodies",
    "otel": "9. what an observer costs per event (records, trace file, telemetry)",
    "check": "5a. model check of default settings",
    "hypothesis": "5b. hypothesis examples per second (stateful suite)",
    "crash": "crash-detection latency (real plugin processes)",
    "redis": "Redis session store",
    "temporal": "Temporal: engine share of a session, sessions/s against no engine",
    "frameworks": "10. a model call through an integration over the framework alone",
}


def report(results: dict[str, Any]) -> str:
    """The printed report: machine, every section, and a summary of the targets."""
    m = results["machine"]
    lines = [
        f"statemachine benchmarks, {m['date_utc']}, commit {m['commit']}",
        f"{m['cpu']}, {m['nproc']} cores, {m['python']}, {m['platform']}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        "timings: median of repeats over batches, warm-up discarded, GC off while timing",
    ]
    if results.get("quick"):
        lines.append("QUICK RUN: tiny counts, the numbers mean nothing")
    summary = []
    for name in ALL:
        if name not in results:
            continue
        result = results[name]
        lines.append("")
        lines += _section(name, TITLES[name], result)
        if "met" in result:
            summary.append(f"  {TITLES[name]}: {'met' if result['met'] else 'MISSED'}")
    if summary:
        lines += ["", "== targets", *summary]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny counts (smoke run)")
    parser.add_argument("--only", help=f"comma-separated subset of: {','.join(ALL)}")
    parser.add_argument("--skip", default="", help="comma-separated measurements to skip")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--profile", action="store_true", help="also profile the engine's hot path")
    args = parser.parse_args(argv)
    names = [n for n in (args.only.split(",") if args.only else ALL) if n]
    skip = [n for n in args.skip.split(",") if n]
    unknown = sorted((set(names) | set(skip)) - set(ALL))
    if unknown:
        parser.error(f"unknown measurement(s): {', '.join(unknown)}; known: {', '.join(ALL)}")
    names = [n for n in names if n not in skip]

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    results = run_all(names, quick=args.quick, log=log)
    if args.profile:
        from . import hotpath

        results["profile"] = hotpath.run(quick=args.quick)
    print(report(results))
    if args.profile:
        print()
        print(results["profile"]["text"])
    if args.json:
        Path(args.json).write_text(
            json.dumps(results, indent=2, ensure_ascii=False, default=str) + "\n",
            encoding="utf-8",
        )
        log(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
