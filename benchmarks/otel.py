"""What an observer costs: µs per event of a retry turn, with and without telemetry.

A retry turn (start -> Assembled -> ModelFailed(rate_limited) -> WaitDone ->
ModelReplied: five events) is played in ``n`` fresh sessions for each variant (the
sessions and observers are made before the clock starts; only the events are timed):

* ``none``: no observer (the engine builds no trace record: the baseline);
* ``list``: ``observers=[records.append]`` (the cost of building the records);
* ``trace file``: a ``TraceWriter`` on an in-memory stream;
* ``otel no-op``: ``statemachine.otel.Telemetry`` on the global providers with no SDK
  configured (what a host pays with the extra installed and no SDK set up);
* ``otel sdk``: ``Telemetry`` on the SDK with an in-memory exporter and reader (spans
  and metrics really recorded, every GenAI attribute built; the SDK's own cost
  dominates);
* ``otel sdk, metrics only``: the same with every span sampled out (``ALWAYS_OFF``):
  what the metrics cost alone.

The variants run interleaved (one batch of each per round); each reports the median
µs per event, the extra over ``none``, and its ratio over ``none`` (the median of the
per-round ratios). The target (issue 25): ``otel no-op`` at most 2x ``none``. Every
observer pays the engine's building of the records (the ``list`` row); what
telemetry adds on the no-op path is the rest.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Callable
from typing import Any

import statemachine as sm

from ._timing import Variant, interleaved

REQUEST = {"messages": [{"role": "user", "content": "hi"}]}
EVENTS = 5


def _play(observers: Callable[[], list[Any]], n: int) -> Variant:
    """(setup, body, ops): the sessions (and their observers) are made in the setup,
    so only the events are timed."""
    failed = sm.ModelFailed(sm.ModelError("rate_limited"))
    assembled = sm.Assembled(REQUEST, 1000)

    def setup() -> list[sm.Turn]:
        turns = []
        for i in range(n):
            session = sm.Session(sm.Settings(), seed=i, clock=lambda: 0.0, observers=observers())
            turns.append(session.new_turn())
        return turns

    def body(turns: list[sm.Turn]) -> None:
        for turn in turns:
            turn.start()
            turn.send(assembled)
            turn.send(failed)
            turn.send(sm.WaitDone())
            turn.send(sm.ModelReplied())

    return (setup, body, n * EVENTS)


TARGET = 2.0
"""``otel no-op`` over ``none``, at most."""


def _variants(n: int) -> dict[str, Variant]:
    from statemachine.io._trace_file import TraceWriter
    from statemachine.otel import Telemetry

    def nothing() -> list[Any]:
        return []

    def records() -> list[Any]:
        return [[].append]

    def trace_file() -> list[Any]:
        return [TraceWriter(io.StringIO())]

    def noop() -> list[Any]:
        return [Telemetry(clock_offset=0.0)]  # the global providers: none set in this process

    variants: dict[str, Variant] = {
        "none": _play(nothing, n),
        "list": _play(records, n),
        "trace file": _play(trace_file, n),
        "otel no-op": _play(noop, n),
    }
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    except ImportError:  # pragma: no cover - the SDK is a dev dependency
        return variants
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def sdk() -> list[Any]:
        exporter.clear()
        return [
            Telemetry(
                tracer_provider=tracer_provider, meter_provider=meter_provider, clock_offset=0.0
            )
        ]

    variants["otel sdk"] = _play(sdk, n)
    sampled_out = TracerProvider(sampler=ALWAYS_OFF)
    metrics_only = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def sdk_metrics() -> list[Any]:
        return [
            Telemetry(tracer_provider=sampled_out, meter_provider=metrics_only, clock_offset=0.0)
        ]

    variants["otel sdk, metrics only"] = _play(sdk_metrics, n)
    return variants


def run(n: int = 500, repeats: int = 7) -> dict[str, Any]:
    """Median µs per event of each variant, its extra over no observer, and its ratio
    over no observer (the median of the per-round ratios)."""
    runs = interleaved(_variants(n), repeats=repeats)
    medians = {name: statistics.median(values) * 1e6 for name, values in runs.items()}
    base = medians["none"]
    ratios = {
        name: statistics.median(v / b for v, b in zip(values, runs["none"], strict=True))
        for name, values in runs.items()
    }
    shown = ", ".join(f"{name} {ratios[name]:.2f}x" for name in ratios if name != "none")
    return {
        "unit": (
            "µs per event (median over interleaved rounds; a retry turn of 5 events); "
            f"over no observer: {shown} (target: otel no-op <= {TARGET:g}x)"
        ),
        "n": n,
        "us_per_event": medians,
        "extra_us_per_event": {name: value - base for name, value in medians.items()},
        "over_none": ratios,
        "met": ratios["otel no-op"] <= TARGET,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
