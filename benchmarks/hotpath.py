"""Where the engine's time and memory go: a profile of ``Turn._fire`` and its parts.

``python -m benchmarks.hotpath`` (or ``python -m benchmarks --profile``) prints:

1. ``cProfile`` of the retry decision loop and of the tool-crash round (top functions
   by own time; cProfile inflates tiny functions, so read it for shape, not size);
2. micro-timings of the parts of a transition (``timeit``, best of 5), the cost
   model behind the suggestions;
3. *what-if* runs: the same end-to-end event timings as ``benchmarks.events`` with one
   change applied in-process (monkeypatched, the engine's files untouched), so each
   suggestion comes with a measured gain;
4. the bytes a trace holds per transition, in the old and current layouts.

Nothing here is a test: it informs whoever tunes the engine.
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import hashlib
import io
import json
import math
import pstats
import statistics
import timeit
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import statemachine as sm
from statemachine.core import _backoff
from statemachine.core import _engine as _session
from statemachine.core import _engine as _turn
from statemachine.core._actions import CallModel, Finish, Wait
from statemachine.core._taxonomy import ErrorCategory, TurnStatus

from . import events as ev
from ._timing import Variant, interleaved

RATE = sm.ModelFailed(sm.ModelError("rate_limited"))
DONE = sm.WaitDone()
CALL = ev.CALL


def _profile(body: Callable[[], Any], top: int) -> str:
    profiler = cProfile.Profile()
    gc.collect()
    gc.disable()  # as in the timings: a collection would be charged to whoever allocated
    try:
        profiler.enable()
        body()
        profiler.disable()
    finally:
        gc.enable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(lines[start:])


def _retry_loop(n: int) -> Callable[[], None]:
    turns = ev._turns_at(ev.PATHS["retry"], 2, n)

    def body() -> None:
        for turn in turns:
            for _ in range(5):
                turn.send(RATE)
                turn.send(DONE)

    return body


def _tool_round(n: int) -> Callable[[], None]:
    steps = ev.PATHS["tool crash"]
    turns = ev._turns_at(steps, 2, n)

    def body() -> None:
        for turn in turns:
            turn.send(steps[2][1])
            turn.send(steps[3][1])

    return body


# -- the parts ----------------------------------------------------------------------


def _best(stmt: str, namespace: dict[str, Any], number: int) -> float:
    times = timeit.repeat(stmt, globals=namespace, number=number, repeat=5)
    return min(times) / number * 1e6


def _slot_setters(cls: type, names: tuple[str, ...]) -> list[Callable[[Any, Any], None]]:
    return [cls.__dict__[name].__set__ for name in names]


def fast_wait_factory() -> Callable[..., Wait]:
    """``Wait(...)`` without attrs' frozen ``__init__``: slot descriptors set directly."""
    new = object.__new__
    s, c, a, r = _slot_setters(Wait, ("seconds", "category", "attempt", "retry_after"))

    def make(
        seconds: float, category: ErrorCategory, attempt: int, retry_after: float | None = None
    ) -> Wait:
        w = new(Wait)
        s(w, seconds)
        c(w, category)
        a(w, attempt)
        r(w, retry_after)
        return w

    return make


def fast_call_model_factory() -> Callable[..., CallModel]:
    """``CallModel(...)`` the same way."""
    new = object.__new__
    r, a, m, w = _slot_setters(CallModel, ("request", "attempt", "model", "withhold_tools"))

    def make(
        request: Any, attempt: int, model: str | None = None, withhold_tools: bool = False
    ) -> CallModel:
        c = new(CallModel)
        r(c, request)
        a(c, attempt)
        m(c, model)
        w(c, withhold_tools)
        return c

    return make


def fast_finish_factory() -> Callable[..., Finish]:
    """``Finish(...)`` (8 fields, all passed, as ``_finish_action`` does) the same way."""
    new = object.__new__
    st, tr, er, mo, fb, ra, rp, do, rd = _slot_setters(
        Finish,
        (
            "status",
            "tool_results",
            "error",
            "model",
            "fallbacks",
            "retry_at",
            "reply",
            "done",
            "reply_data",
        ),
    )

    def make(
        status: TurnStatus,
        tool_results: Any = (),
        error: Any = None,
        model: Any = None,
        fallbacks: Any = (),
        retry_at: Any = None,
        reply: Any = None,
        done: bool = False,
        *,
        reply_data: Any = None,
    ) -> Finish:
        f = new(Finish)
        st(f, status)
        tr(f, tool_results)
        er(f, error)
        mo(f, model)
        fb(f, fallbacks)
        ra(f, retry_at)
        rp(f, reply)
        do(f, done)
        rd(f, reply_data)
        return f

    return make


def fast_tool_result_factory() -> Callable[..., sm.ToolResult]:
    """``ToolResult(...)`` (6 fields) through its slot descriptors."""
    new = object.__new__
    i, c, e, k, y, d = _slot_setters(
        sm.ToolResult, ("call_id", "content", "is_error", "category", "retryable", "details")
    )

    def make(
        call_id: str,
        content: Any,
        is_error: bool = False,
        category: Any = None,
        *,
        retryable: bool = False,
        details: Any = None,
    ) -> sm.ToolResult:
        r = new(sm.ToolResult)
        i(r, call_id)
        c(r, content)
        e(r, is_error)
        k(r, category)
        y(r, retryable)
        d(r, details)
        return r

    return make


def check_tools_done_fast() -> Callable[[Any, Any], None]:
    """``_check_tools_done`` with a fast path for the common one-call round."""
    original = _turn._check_tools_done

    def check(core: Any, turn: Any, event: Any) -> None:
        calls, outcomes = turn.in_flight, event.outcomes
        if len(calls) == 1 and len(outcomes) == 1 and outcomes[0].call_id == calls[0].id:
            return
        original(core, turn, event)

    return check


def fingerprint_unhashed(call: sm.ToolCall) -> str:
    """The canonical JSON of (name, arguments) itself, unhashed (a snapshot would hold
    it as is, or hash it only when it is long)."""
    return str(_session.canonical_json([call.name, call.arguments]))


def _parts(number: int) -> dict[str, float]:
    session = sm.Session(seed=1, clock=lambda: 0.0)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("r", 10))
    rate_group = _turn.DISPATCH.failures["calling"][ErrorCategory.RATE_LIMITED]
    cheap_guards = [g for row in rate_group.rows[:3] for g in row.guards]  # partial, final, ceiling
    retries_left = _turn.GUARDS["retries_left"]
    core = session._core
    turn_state = core.state.turn
    wait_facts = _turn._wait_facts(core, turn_state, RATE, 0.0, None)
    fast_wait = fast_wait_factory()
    fast_call = fast_call_model_factory()
    ns: dict[str, Any] = {
        "T": _turn,
        "B": _backoff,
        "S": _session,
        "turn": turn,
        "session": session,
        "core": core,
        "ts": turn_state,
        "ev": RATE,
        "cat": ErrorCategory.RATE_LIMITED,
        "guards": cheap_guards,
        "rate_group": rate_group,
        "facts": wait_facts,
        "retries_left": retries_left,
        "Wait": Wait,
        "CallModel": CallModel,
        "Finish": Finish,
        "done": TurnStatus.COMPLETED,
        "fast_wait": fast_wait,
        "fast_call": fast_call,
        "call": CALL,
        "json": json,
        "hashlib": hashlib,
        "trace": [],
        "calls": (CALL,),
        "outcomes": (ev.CRASH,),
        "ToolResult": sm.ToolResult,
        "fast_result": fast_tool_result_factory(),
        "fast_finish": fast_finish_factory(),
    }
    tool_steps = ev.PATHS["tool crash"]
    (tturn,) = ev._turns_at(tool_steps, 3, 1)
    ns["tcore"] = tturn.session._core
    ns["tts"] = tturn.session._core.state.turn
    ns["tdone"] = tool_steps[3][1]
    parts = {
        "dispatch: TRIGGERS.get + failures[state].get(category) + checks": (
            "T.TRIGGERS.get(type(ev)); T.DISPATCH.failures.get('calling').get("
            "ev.error.category); T._PAYLOAD_CHECKS.get('ModelReplied')"
        ),
        "  the same by the full key, groups.get((state, trigger, category))": (
            "T.TRIGGERS.get(type(ev)); T.DISPATCH.groups.get(('calling', 'ModelFailed',"
            " ev.error.category)); T._PAYLOAD_CHECKS.get('ModelReplied')"
        ),
        "a rate limit's trial, its guards written out (the engine's)": (
            "rate_group.choose(core, ts, ev, facts)"
        ),
        "  guards partial, final_answer, ceiling_reached, retries_left (4 calls)": (
            "[g(core, ts, ev, None) for g in guards]; retries_left(core, ts, ev, None)"
        ),
        "_wait_facts (retry_after + jitter + wait_seconds)": (
            "T._wait_facts(core, ts, ev, 0.0, None)"
        ),
        "  retry_after(error, wall)": "T.retry_after(ev.error, 1.7e9)",
        "  jitter(seed, draw) (SplitMix64 on Python ints)": "B.jitter(core.state.seed, 3)",
        "  wait_seconds(...)": "B.wait_seconds(2, 0.3, None, 500.0, 2.0, 30000.0)",
        "Wait(...) (attrs frozen __init__)": "Wait(0.5, cat, 0)",
        "Wait as the engine makes it (a twin given the class)": "T.make_wait(0.5, cat, 0, None)",
        "Wait via slot descriptors (no frozen __setattr__ dance)": "fast_wait(0.5, cat, 0)",
        "CallModel(...) (attrs frozen __init__)": "CallModel('r', 1, None, False)",
        "CallModel as the engine makes it": "T.make_call_model('r', 1, None, False)",
        "CallModel via slot descriptors": "fast_call('r', 1, None, False)",
        "Finish(8 fields) (attrs frozen __init__)": (
            "Finish(done, (), None, None, (), None, None, False)"
        ),
        "Finish via slot descriptors": "fast_finish(done, (), None, None, (), None, None, False)",
        "Finish as the engine makes it": (
            "T.make_finish(done, (), None, None, (), None, None, False, None)"
        ),
        "ToolResult(6 fields) (attrs frozen __init__)": "ToolResult('c', 'x', True, None)",
        "ToolResult via slot descriptors": "fast_result('c', 'x', True, None)",
        "trace: two appends (shared row info, action)": (
            "trace.append(None); trace.append(None)\nif len(trace) > 1000: trace.clear()"
        ),
        "model_of(core, turn)": "T.model_of(core, ts)",
        "core.check_bounds(now)": "core.check_bounds(0.0)",
        "call_fingerprint (the engine's)": "S.call_fingerprint(call)",
        "  json.dumps with options (builds an encoder per call, the old way)": (
            "json.dumps([call.name, call.arguments], sort_keys=True, separators=(',', ':'),"
            " ensure_ascii=False, default=repr)"
        ),
        "  blake2b of the canonical text": (
            'hashlib.blake2b(b\'["search",{"limit":3}]\', digest_size=12).hexdigest()'
        ),
        "_tool_facts(core, turn, ToolsDone)": "T._tool_facts(tcore, tts, tdone, 0.0, None)",
        "_check_tools_done, one call": "T._check_tools_done(tcore, tts, tdone)",
    }
    out: dict[str, float] = {}
    for label, stmt in parts.items():
        try:
            out[label] = _best(stmt, ns, number)
        except Exception:  # the engine's internals moved: report the rest
            out[label] = math.nan
    return out


# -- what-if runs ------------------------------------------------------------------


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    """``target.name = value`` (or ``target[name]`` for a dict) for the duration."""
    if isinstance(target, dict):
        old = target[name]
        target[name] = value
    else:
        old = getattr(target, name)
        setattr(target, name, value)
    try:
        yield
    finally:
        if isinstance(target, dict):
            target[name] = old
        else:
            setattr(target, name, old)


def _step_variant(path: str, label: str, n: int) -> Variant:
    steps = ev.PATHS[path]
    k = next(i for i, (name, _) in enumerate(steps) if name == label)
    return ev.step_variant(steps, k, n)


def _retry_variant(n: int) -> Variant:
    def body(turns: list[sm.Turn]) -> None:
        for turn in turns:
            send = turn.send
            for _ in range(5):
                send(RATE)
                send(DONE)

    return (lambda: ev._turns_at(ev.PATHS["retry"], 2, n), body, n * 5)


def _with_patches(variant: Variant, patches: list[tuple[Any, str, Any]]) -> Variant:
    setup, body, ops = variant

    def patched_body(state: Any) -> None:
        with contextlib.ExitStack() as stack:
            for target, name, value in patches:
                stack.enter_context(_patched(target, name, value))
            body(state)

    return (setup, patched_body, ops)


def _compare(
    variant: Variant, patches: list[tuple[Any, str, Any]], repeats: int
) -> dict[str, float]:
    """Best (and median) µs/op before and after ``patches``, interleaved round by round.

    The best of the rounds leads: noise on a shared machine only ever adds time.
    """
    runs = interleaved(
        {"before": variant, "after": _with_patches(variant, patches)}, repeats=repeats
    )
    return {
        "before_us": min(runs["before"]) * 1e6,
        "after_us": min(runs["after"]) * 1e6,
        "before_median_us": statistics.median(runs["before"]) * 1e6,
        "after_median_us": statistics.median(runs["after"]) * 1e6,
    }


def _finish_by_init(*values: Any) -> Finish:
    """``make_finish``'s arguments through ``Finish``'s own ``__init__``."""
    return Finish(*values[:8], reply_data=values[8])


def _what_if(n: int, repeats: int) -> dict[str, dict[str, float]]:
    replied = "ModelReplied(1 tool call)"
    tools_done = "ToolsDone(process_crashed)"
    plans: dict[str, Callable[[], dict[str, float]]] = {
        "retry decision: Wait/CallModel built by attrs' __init__ (as before issue 29)": lambda: (
            _compare(
                _retry_variant(n),
                [(_turn, "make_wait", Wait), (_turn, "make_call_model", CallModel)],
                repeats,
            )
        ),
        f"{replied}: the canonical JSON itself as the fingerprint (no blake2b)": lambda: _compare(
            _step_variant("tool crash", replied, n),
            [(_session, "call_fingerprint", fingerprint_unhashed)],
            repeats,
        ),
        f"{replied}: no fingerprint at all (the floor, not a proposal)": lambda: _compare(
            _step_variant("tool crash", replied, n),
            [(_session, "call_fingerprint", lambda call: call.name)],
            repeats,
        ),
        f"{tools_done}: one-call fast path in _check_tools_done": lambda: _compare(
            _step_variant("tool crash", tools_done, n),
            [(_turn._PAYLOAD_CHECKS, "ToolsDone", check_tools_done_fast())],
            repeats,
        ),
        f"{tools_done}: that + ToolResult built via slot descriptors": lambda: _compare(
            _step_variant("tool crash", tools_done, n),
            [
                (_turn._PAYLOAD_CHECKS, "ToolsDone", check_tools_done_fast()),
                (_turn, "ToolResult", fast_tool_result_factory()),
            ],
            repeats,
        ),
        f"{tools_done}: Finish built by attrs' __init__ (as before issue 29)": lambda: _compare(
            _step_variant("tool crash", tools_done, n),
            [(_turn, "make_finish", _finish_by_init)],
            repeats,
        ),
    }
    out: dict[str, dict[str, float]] = {}
    for label, plan in plans.items():
        try:
            out[label] = plan()
        except Exception:  # the engine's internals moved: report the rest
            out[label] = {"before_us": math.nan, "after_us": math.nan}
    return out


# -- trace memory -------------------------------------------------------------------


def _bytes(build: Callable[[], Any]) -> tuple[int, Any]:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return after - before, kept


def _trace_memory(count: int = 2000, transitions: int = 12) -> dict[str, float]:
    """Bytes per transition of a trace (synthetic, same shapes as ``Turn._trace``)."""
    action = object()
    row = ("calling", "ModelFailed", "g", "backing_off")

    def tuples() -> list[list[Any]]:
        return [
            [
                (i, "calling", "ModelFailed", "g", "backing_off", action, 1, 2, 0)
                for i in range(transitions)
            ]
            for _ in range(count)
        ]

    def flat(width: int) -> Callable[[], list[list[Any]]]:
        def build() -> list[list[Any]]:
            out = []
            for _ in range(count):
                entries: list[Any] = []
                for _ in range(transitions):
                    entry = (row, action, 1, 2, 0)[:width]
                    entries += entry
                out.append(entries)
            return out

        return build

    results = {}
    for label, build in (
        ("9-tuple per transition (the layout before de4cdc2)", tuples),
        ("shared row info + action, two appends (the layout now)", flat(2)),
        ("flat list: row, action, attempt, retries, reductions", flat(5)),
    ):
        size, kept = _bytes(build)
        del kept
        results[f"{label}, bytes/transition"] = size / count / transitions
    return results


def run(quick: bool = False) -> dict[str, Any]:
    """Profiles, part timings, what-if gains and trace bytes; ``text`` is the report."""
    n, repeats, number, top = (50, 2, 2000, 8) if quick else (2000, 7, 100_000, 14)
    profiles = {
        "retry decision loop (5 x ModelFailed + WaitDone per turn)": _profile(_retry_loop(n), top),
        "tool round with a crash (ModelReplied + ToolsDone)": _profile(_tool_round(n), top),
    }
    try:
        parts = _parts(number)
    except Exception as exc:  # the engine's internals moved
        parts = {f"(parts unavailable: {type(exc).__name__}: {exc})": math.nan}
    what_if = _what_if(n, repeats)
    memory = _trace_memory(count=100 if quick else 2000)
    lines = ["== hot path profile"]
    for title, text in profiles.items():
        lines += [f"-- cProfile: {title}", text, ""]
    lines.append("-- parts of a transition (µs, best of 5 timeit runs)")
    width = max(len(k) for k in parts)
    lines += [f"  {k:<{width}}  {v:.3f}" for k, v in parts.items()]
    lines.append("-- what-if (µs per event, best of interleaved patched/unpatched rounds)")
    for k, v in what_if.items():
        lines.append(
            f"  {k}: {v['before_us']:.2f} -> {v['after_us']:.2f} "
            f"({v['before_us'] - v['after_us']:+.2f})"
        )
    lines.append("-- trace memory (tracemalloc, synthetic traces of 12 transitions)")
    lines += [f"  {k}: {v:.0f} B" for k, v in memory.items()]
    return {
        "parts_us": parts,
        "what_if_us": what_if,
        "trace_memory": memory,
        "profiles": profiles,
        "text": "\n".join(lines),
    }


if __name__ == "__main__":
    print(run()["text"])
