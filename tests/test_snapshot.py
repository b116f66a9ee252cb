"""Snapshot and restore: plain JSON, exact continuation, clear errors on bad data."""

from __future__ import annotations

import copy
import json
from typing import Any

import attrs
import pytest

import statemachine as sm

from .helpers import ManualClock, fail, new_session


def _events() -> list[object]:
    return [
        sm.Assembled({"messages": ["hi"]}, 1000),
        fail("rate_limited", headers={"Retry-After": "2"}),
        sm.WaitDone(),
        fail("overloaded"),
        sm.WaitDone(),
        fail("context_length_exceeded"),
        sm.Assembled({"messages": []}, 400),
        sm.ModelReplied(
            tool_calls=[sm.ToolCall("c1", "fs", "read", {"path": "/a"})], cost=0.25, reply={"id": 1}
        ),
        sm.ToolsDone([sm.ToolOutcome("c1", ok=False, content="x", category="process_crashed")]),
    ]


def _settings() -> dict[str, Any]:
    return {"fallback_models": ("b",), "max_retries": 3, "max_turns": 5}


@pytest.mark.requirement("ER-26")
@pytest.mark.parametrize("cut", range(len(_events()) + 1))
def test_restore_at_any_step_continues_exactly(cut: int) -> None:
    """Snapshot after ``cut`` events, push it through JSON text, restore on a new clock:
    the rest of the turn gives the same actions as an uninterrupted run, and the
    sessions end equal."""
    straight_clock = ManualClock()
    straight = new_session(seed=3, clock=straight_clock, **_settings())
    turn = straight.new_turn()
    expected = [turn.start()] + [turn.send(e) for e in _events()]

    clock = ManualClock()
    session = new_session(seed=3, clock=clock, **_settings())
    part = session.new_turn()
    got = [part.start()] + [part.send(e) for e in _events()[:cut]]
    text = json.dumps(session.snapshot())
    restored = sm.Session.restore(json.loads(text), clock=ManualClock(start=99.0))
    rest = restored.current_turn
    assert rest is not None
    assert rest.action == got[-1]
    got += [rest.send(e) for e in _events()[cut:]]
    assert got == expected

    # the times are the restored session's clock, which started 901 s earlier; the
    # steps before the snapshot keep no event, the steps after it carry theirs; a
    # snapshot keeps the turn, not the moment it was made
    def plain(record: sm.TraceRecord) -> sm.TraceRecord:
        return attrs.evolve(record, caused_by=None, wall=None, made_at=None)

    assert turn.trace[0].made_at == turn.trace[0].at
    assert rest.trace[0].made_at is None

    assert [plain(attrs.evolve(r, at=r.at + 901.0)) for r in rest.trace] == [
        plain(r) for r in turn.trace
    ]
    assert [r.caused_by for r in rest.trace[: cut + 1]] == [None] * (cut + 1)
    assert [r.caused_by for r in rest.trace[cut + 1 :]] == _events()[cut:]
    assert restored.snapshot()["elapsed_s"] == straight.snapshot()["elapsed_s"]
    assert {k: v for k, v in restored.snapshot().items() if k != "elapsed_s"} == {
        k: v for k, v in straight.snapshot().items() if k != "elapsed_s"
    }


@pytest.mark.requirement("ER-26")
def test_restore_continues_the_jitter_stream_and_session_counters() -> None:
    """After restore the next waits, counters, breakers and limits are the same."""
    clock = ManualClock()
    session = new_session(seed=9, clock=clock, breaker_threshold=2, max_turns=3)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("r", 1))
    turn.send(sm.ModelReplied(tool_calls=[sm.ToolCall("c", "p", "t")]))
    turn.send(sm.ToolsDone([sm.ToolOutcome("c", ok=False, category="process_crashed")]))
    clock.advance(12.5)
    restored = sm.Session.restore(session.snapshot(), clock=ManualClock(start=0.0))
    assert restored.crash_counts == {"p": 1}
    assert restored.elapsed_s == pytest.approx(12.5)
    assert restored.turns == 1
    waits = []
    for s in (session, restored):
        t = s.new_turn()
        t.start()
        t.send(sm.Assembled("r", 1))
        wait = t.send(fail("overloaded"))
        assert isinstance(wait, sm.Wait)
        waits.append(wait.seconds)
    assert waits[0] == waits[1]


@pytest.mark.requirement("ER-26")
def test_snapshot_of_an_ended_session_stays_ended() -> None:
    """A restored ended session refuses new turns like the original."""
    session = new_session(max_turns=0)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("r", 1))
    turn.send(sm.ModelReplied())
    restored = sm.Session.restore(session.snapshot(), clock=ManualClock())
    assert restored.status is sm.SessionStatus.ERROR_MAX_TURNS
    with pytest.raises(sm.SessionEnded):
        restored.new_turn()


def _snapshot() -> dict[str, Any]:
    session = new_session(**_settings())
    turn = session.new_turn()
    turn.start()
    for event in _events()[:4]:
        turn.send(event)
    return session.snapshot()


def _set(data: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, last = path.split(".")
    target = data
    for key in parents:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return data


_DELETE = object()


@pytest.mark.requirement("ER-26")
@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        ("format", "something.else", "^format:"),
        ("version", 6, "^version: 6 is not supported"),
        ("version", "1", "^version: '1' is not supported"),
        ("seed", _DELETE, "^seed: missing"),
        ("draws", -1, "^draws: must be >= 0"),
        ("retries", 1.5, "^retries: must be int"),
        ("retries", 2**70, r"^retries: must be < 2\*\*63"),
        ("cost_usd", float("nan"), "^cost_usd: must be a finite number"),
        ("cost_usd", 10**400, "^cost_usd: must be a finite number"),
        ("settings", {"max_retries": -1}, "^settings: max_retries"),
        ("settings", {"bogus": 1}, "^settings: bogus"),
        ("breakers", {"p": "x"}, "^breakers.p:"),
        ("limit", "error_everything", "^limit:"),
        ("turn.state", "dancing", "^turn.state:"),
        ("turn.attempt", None, "^turn.attempt: must be int"),
        ("turn.model_index", 7, "^turn.model_index: 7 is out of range"),
        (
            "turn.actions",
            [{"$type": "Explode"}],
            r"^turn.actions\[0\]: unknown value type",
        ),
        (
            "turn.actions",
            [{"$type": "Wait", "seconds": 1.0}],
            r"^turn.actions\[0\]: Wait has missing",
        ),
        (
            "turn.path",
            [["idle", "start", "", "completed", 0, 0, 0]],
            r"^turn.path\[0\]: .* is not a transition of this engine's table",
        ),
        ("turn.path", [[0, "idle"]], r"^turn.path\[0\]: must be \[source"),
        (
            "turn.path",
            [["idle", "start", "", "assembling", 0, -3, 0]],
            r"^turn.path\[0\]\[5\]: must be >= 0",
        ),
        ("turn.calls", "nope", "^turn.calls: must be list"),
        ("doom_run", [], "^doom_run: must be int"),
        ("unknown_key", 1, "^unknown_key: not a field"),
    ],
)
def test_corrupt_snapshots_are_refused_naming_the_key(path: str, value: object, match: str) -> None:
    """Each kind of corruption is a SnapshotError whose message starts with the key."""
    with pytest.raises(sm.SnapshotError, match=match):
        sm.Session.restore(_set(_snapshot(), path, value), clock=ManualClock())


@pytest.mark.requirement("ER-26")
def test_non_mapping_and_truncated_snapshots_are_refused() -> None:
    """Not an object at all, or an object cut short, is a clear SnapshotError."""
    with pytest.raises(sm.SnapshotError, match="must be a JSON object"):
        sm.Session.restore([1, 2], clock=ManualClock())  # type: ignore[arg-type]
    data = _snapshot()
    truncated = dict(list(data.items())[:5])
    with pytest.raises(sm.SnapshotError, match="missing"):
        sm.Session.restore(truncated, clock=ManualClock())
    assert isinstance(sm.SnapshotError("x"), ValueError)


@pytest.mark.requirement("ER-26")
def test_a_snapshot_given_as_its_text_is_refused_saying_to_parse_it() -> None:
    """The snapshot's JSON text (as a host stored it) is not restored by guessing: the
    error says it is text and how to parse it; a list gets no such hint."""
    text = json.dumps(_snapshot())
    for given in (text, text.encode()):
        with pytest.raises(sm.SnapshotError, match=r"got (str|bytes) \(.*json\.loads\(text\)"):
            sm.Session.restore(given, clock=ManualClock())  # type: ignore[arg-type]
    with pytest.raises(sm.SnapshotError, match=r"^snapshot: must be a JSON object, got list$"):
        sm.Session.restore([text], clock=ManualClock())  # type: ignore[arg-type]


@pytest.mark.requirement("ER-26")
@pytest.mark.parametrize("renamed", ["fallback_models", "max_retries", "max_cost_usd"])
def test_a_renamed_settings_key_is_refused_after_a_warm_restore(renamed: str) -> None:
    """A snapshot whose settings have one key renamed (order and value types kept) is a
    ``SnapshotError`` naming the key even after a snapshot of the same shape was restored
    (the settings cache once read the known list-valued keys before comparing names, and
    a ``KeyError`` escaped); the store's load says ``CorruptSession``."""
    from statemachine.store import CorruptSession, InMemoryStore, Worker

    settings = sm.Settings(fallback_models=("b", "c"), max_cost_usd=5.0)
    session = sm.Session(settings, seed=1, clock=lambda: 0.0, session_id="s")
    snapshot = session.snapshot()
    sm.Session.restore(snapshot)  # warm the cache with this shape
    text = json.dumps(snapshot).replace(f'"{renamed}"', f'"{renamed}X"', 1)
    with pytest.raises(sm.SnapshotError, match=f"{renamed}X"):
        sm.Session.restore(json.loads(text))
    store = InMemoryStore()
    worker = Worker(store, owner="w", clock=lambda: 0.0, now=lambda: 1.0)
    worker.create("s", session)
    version, payload = store.load_payload("s")
    forged = payload.replace(f'"{renamed}"'.encode(), f'"{renamed}X"'.encode(), 1)
    store.compare_and_set_payload("s", version, forged, None)
    with pytest.raises(CorruptSession):
        Worker(store, owner="v", clock=lambda: 0.0, now=lambda: 1.0).load("s")


@pytest.mark.requirement("ER-26")
def test_non_json_host_data_is_refused_when_it_arrives() -> None:
    """A request that JSON cannot hold is refused when the event is built, naming the
    field, so the session that never took it can still be snapshotted."""
    session = new_session()
    turn = session.new_turn()
    turn.start()
    with pytest.raises(ValueError, match=r"^request: must be JSON data"):
        turn.send(sm.Assembled(object(), 1))
    assert turn.state == "assembling"
    json.dumps(session.snapshot(), allow_nan=False)


@pytest.mark.requirement("ER-26")
def test_host_data_with_a_type_key_survives_unchanged() -> None:
    """Opaque host data is stored as-is, even when it looks like an encoded value."""
    request = {"$type": "Wait", "payload": [1, 2]}
    session = new_session()
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request, 1))
    restored = sm.Session.restore(json.loads(json.dumps(session.snapshot())), clock=ManualClock())
    assert restored.current_turn is not None
    call = restored.current_turn.action
    assert isinstance(call, sm.CallModel) and call.request == request


def test_snapshot_is_versioned_plain_data() -> None:
    """The snapshot is a dict of JSON types with a format and a version."""
    data = _snapshot()
    assert data["format"] == "statemachine.session"
    assert data["version"] == 5
    assert json.loads(json.dumps(data)) == data


@pytest.mark.requirement("ER-26")
@pytest.mark.requirement("ER-21")
@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_retry_after_on_a_kept_error_survives_the_snapshot(garbage: float) -> None:
    """A garbage retry_after_seconds kept on the Finish's ModelError does not make the
    session un-snapshottable; it comes back as the same float."""
    session = new_session()
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("r", 10))
    turn.send(sm.ModelFailed(sm.ModelError("auth_error", retry_after_seconds=garbage)))
    data = json.loads(json.dumps(session.snapshot(), allow_nan=False))
    restored = sm.Session.restore(data, clock=ManualClock())
    assert restored.current_turn is not None
    finish = restored.current_turn.finish
    assert finish is not None and finish.error is not None
    got = finish.error.retry_after_seconds
    assert repr(got) == repr(garbage)
    assert restored.snapshot() == data


@pytest.mark.requirement("ER-26")
@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"status": "error_max_turns"}, "^status: error_max_turns is set but the limit"),
        ({"turn.index": 99}, "^turn.index: 99 is not the session's latest turn"),
        (
            {"turn.state": "assembling"},
            "^turn.state: 'assembling' is not where the turn's path ends",
        ),
    ],
)
def test_inconsistent_turn_data_is_refused(changes: dict[str, object], match: str) -> None:
    """A running turn with a status, or a turn beyond the session's count, is refused."""
    data = _snapshot()
    for path, value in changes.items():
        data = _set(data, path, value)
    with pytest.raises(sm.SnapshotError, match=match):
        sm.Session.restore(data, clock=ManualClock())


@pytest.mark.requirement("ER-97")
def test_trace_records_carry_the_clock_of_each_transition_across_restore() -> None:
    """``at`` is the injected clock when the transition was taken: observers and
    ``Turn.trace`` agree, and a restored session keeps the durations between steps."""
    clock = ManualClock(start=50.0)
    seen: list[sm.TraceRecord] = []
    session = sm.Session(sm.Settings(), seed=1, clock=clock, observers=[seen.append])
    turn = session.new_turn()
    turn.start()
    clock.advance(0.25)
    turn.send(sm.Assembled(request={"m": 1}, size=10))
    clock.advance(1.5)
    turn.send(fail("rate_limited", retry_after_seconds=2.0))
    assert [r.at for r in turn.trace] == [50.0, 50.25, 51.75]
    assert list(turn.trace) == seen
    clock.advance(2.0)
    restored = sm.Session.restore(
        json.loads(json.dumps(session.snapshot())), clock=ManualClock(start=500.0)
    )
    rest = restored.current_turn
    assert rest is not None
    rest.send(sm.WaitDone())
    # restored at 500.0, 3.75 s into the session: the session started at 496.25
    assert [r.at for r in rest.trace] == [496.25, 496.5, 498.0, 500.0]


@pytest.mark.requirement("ER-97")
def test_a_format_3_snapshot_reads_its_step_times_as_unknown() -> None:
    clock = ManualClock()
    session = new_session(clock=clock)
    turn = session.new_turn()
    turn.start()
    data = session.snapshot()
    data["version"] = 3
    del data["turn"]["times"]
    restored = sm.Session.restore(data, clock=clock)
    rest = restored.current_turn
    assert rest is not None
    clock.advance(1.0)
    rest.send(sm.Assembled(request={}, size=1))
    assert [r.at for r in rest.trace] == [None, 1001.0]


@pytest.mark.requirement("ER-97")
@pytest.mark.parametrize(
    ("times", "match"),
    [
        ([], "turn.times: not one time per transition"),
        ([0.0, 0.0], "turn.times: not one time per transition"),
        (["0"], r"turn.times\[0\]: must be a finite number >= 0"),
        ([-1.0], r"turn.times\[0\]: must be a finite number >= 0"),
    ],
)
def test_forged_step_times_are_refused(times: list[Any], match: str) -> None:
    session = new_session()
    session.new_turn().start()
    data = session.snapshot()
    data["turn"]["times"] = times
    with pytest.raises(sm.SnapshotError, match=match):
        sm.Session.restore(data, clock=ManualClock())


@pytest.mark.requirement("ER-97")
def test_step_times_that_run_backwards_are_refused() -> None:
    clock = ManualClock()
    session = new_session(clock=clock)
    turn = session.new_turn()
    turn.start()
    clock.advance(1.0)
    turn.send(sm.Assembled(request={}, size=1))
    data = session.snapshot()
    data["turn"]["times"] = [1.0, 0.5]
    with pytest.raises(sm.SnapshotError, match=r"turn\.times: a transition was taken before"):
        sm.Session.restore(data, clock=ManualClock())


@pytest.mark.requirement("ER-3", "ER-97")
def test_a_wait_names_the_retry_after_it_honours_and_keeps_it_across_restore() -> None:
    """``Wait.retry_after`` is the server's requested wait the engine honoured (``None``
    without one); it survives a snapshot, and a forged one longer than its wait, or on a
    tool round's wait, is refused."""
    clock = ManualClock()
    session = new_session(clock=clock)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={}, size=1))
    wait = turn.send(fail("rate_limited", retry_after_seconds=4.0))
    assert isinstance(wait, sm.Wait)
    assert wait.retry_after == 4.0
    assert wait.seconds >= 4.0
    turn.send(sm.WaitDone())
    plain = turn.send(fail("rate_limited"))
    assert isinstance(plain, sm.Wait)
    assert plain.retry_after is None
    data = json.loads(json.dumps(session.snapshot()))
    restored = sm.Session.restore(data, clock=clock).current_turn
    assert restored is not None
    assert [getattr(r.action, "retry_after", "-") for r in restored.trace][2:5] == [4.0, "-", None]
    data["turn"]["actions"][2]["retry_after"] = wait.seconds + 1
    with pytest.raises(sm.SnapshotError, match="shorter than the retry-after"):
        sm.Session.restore(data, clock=clock)
    data["turn"]["actions"][2]["retry_after"] = "4"
    with pytest.raises(sm.SnapshotError, match=r"Wait\.retry_after"):
        sm.Session.restore(data, clock=clock)


# -- the generated reader and writer against their specification -------------------------


def _outcome(read: Any, data: Any, now: float) -> tuple[Any, ...]:
    """What ``read`` makes of ``data``: the refusal's message, or the settings and the
    snapshot the state writes (its repr: a float read as an int, a tuple read as a list
    would show)."""
    from statemachine.core._snapshot import write_snapshot

    try:
        settings, state = read(data, now)
    except sm.SnapshotError as exc:
        return ("refused", str(exc))
    return ("read", settings, repr(write_snapshot(settings, state, now)))


def _reading_difference(data: Any, now: float) -> str | None:
    from statemachine.core._snapshot import read_snapshot, read_snapshot_by_fields

    fast, specified = (
        _outcome(read_snapshot, data, now),
        _outcome(read_snapshot_by_fields, data, now),
    )
    if fast == specified:
        return None
    return f"generated reader: {fast!r:.300}\nby fields: {specified!r:.300}"


def _same_reading(data: Any, now: float) -> None:
    difference = _reading_difference(data, now)
    assert difference is None, difference


FORGERIES = 30
"""Forged copies (1-3 of the fuzzer's mutations each) read both ways per snapshot read."""


@pytest.mark.requirement("ER-26", "ER-38")
@pytest.mark.parametrize(("seed", "mix"), [(11, True), (12, False)])
def test_the_generated_reader_reads_every_snapshot_as_the_kinds_do(
    seed: int, mix: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every snapshot a fuzz run restores, genuine, through JSON text or forged (1-3
    random mutations), and :data:`FORGERIES` more forged from each one read, is read by
    the generated reader exactly as by the kinds' own decoders
    (``read_snapshot_by_fields``): the same settings and state, or the same refusal,
    word for word. The state is written by the generated writer and by
    ``encode_state`` alike."""
    from statemachine.core import _session, _snapshot, _state

    from . import fuzz

    read = _snapshot.read_snapshot
    seen = {"read": 0, "refused": 0, "forged": 0}
    differences: list[str] = []  # the fuzzer would take an assertion for a finding

    def both(data: Any, now: float) -> Any:
        difference = _reading_difference(data, now)
        if difference is not None:
            differences.append(difference)
        try:
            settings, state = read(data, now)
        except sm.SnapshotError:
            seen["refused"] += 1
            raise
        seen["read"] += 1
        written = _snapshot.write_snapshot(settings, state, now)
        specified = {
            "format": "statemachine.session",
            "version": 5,
            "settings": settings.to_dict(),
            **_state.encode_state(state, now),
        }
        if repr(written) != repr(specified):
            differences.append(f"written: {written!r:.300}\nencode_state: {specified!r:.300}")
        text = json.dumps(written)
        for _ in range(FORGERIES):
            forged = json.loads(text)
            for _ in range(rng.between(1, 3)):
                fuzz.mutate(forged, rng)
            difference = _reading_difference(forged, now)
            if difference is not None:
                differences.append(difference)
            seen["forged"] += 1
        return settings, state

    rng = fuzz.FastRandom(seed)
    monkeypatch.setattr(_session, "read_snapshot", both)
    fuzz.run(10_000, seed, settings_mix=mix, keep_going=True)
    assert differences == []
    assert seen["read"] >= 40
    assert seen["forged"] >= 40 * FORGERIES


@pytest.mark.requirement("ER-26")
def test_the_generated_reader_reads_the_first_release_snapshots_as_the_kinds_do() -> None:
    path = __import__("pathlib").Path(__file__).parent / "data" / "snapshots-v1.json"
    for entry in json.loads(path.read_text("utf-8")):
        _same_reading(entry["snapshot"], 0.0)


@pytest.mark.requirement("ER-26", "ER-38")
@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("turn.times", [0, 1, 2, 3]),  # ints: the kind reads them as floats
        ("turn.times", [0.0, -0.0, 1e308, 1e308]),  # a sum beyond a float
        ("turn.times", [0.0, None, 1.0, 2.0]),
        ("turn.times", [-1.0, 0.0, 1.0, 2.0]),
        ("turn.times", [0.0, 1.0, -0.5, 2.0]),
        ("turn.times", [0.0, float("nan"), 1.0, 2.0]),
        ("turn.instruction", "é"),
        ("turn.request", {"é": ["ü", 1, {"k": None}]}),
        ("turn.request", {1: "int key"}),
        ("turn.size", True),
        ("turn.index", 1.0),
        ("turn.path", [["idle", "start", "", "assembling", 0, 0, True]]),
        ("turn.path", [("idle", "start", "", "assembling", 0, 0, 0)]),
        ("turn.actions", [{"$type": "Assemble", "reduce": 0, "withhold_tools": False}]),
        ("elapsed_s", 3),
        ("elapsed_s", -0.0),
        ("cost_usd", 1),
        ("waited_s", float("inf")),
        ("seed", 2**64),
        ("seed", 2**64 - 1),
        ("status", "error_max_turns"),
        ("limit", 1),
        ("denial_log", "0110"),
        ("denial_log", "012"),
        ("tripped", ()),
        ("breakers", []),
        ("crash_logs", {}),
        ("ancestor_budget_usd", -1.5),
        ("settings.base_delay_ms", 500.0),
        ("settings.base_delay_ms", -0.0),
        ("settings.fallback_models", ["b", "c"]),
    ],
)
def test_the_generated_reader_agrees_at_the_edges_of_its_fast_tests(
    path: str, value: object
) -> None:
    """Where a fast test of the generated reader stops (a value its kind reads but
    converts, or refuses), the kind's decoder decides: the same reading."""
    data = _set(_snapshot(), path, value)
    _same_reading(data, 0.0)
    _same_reading(json.loads(json.dumps(data)) if "nan" not in repr(value) else data, 0.0)


class _Text(str):
    __slots__ = ()


def test_settings_are_read_once_per_configuration_and_never_by_equality_alone() -> None:
    """The settings of a dict read lately are not checked and built again, but only a
    dict of the same keys, the same exact types and equal values is one: 500 and 500.0
    (written back as they came), 0.0 and -0.0, or a str subclass, are read anew."""
    from statemachine.core._snapshot import read_snapshot

    data = _snapshot()
    first, _ = read_snapshot(copy.deepcopy(data), 0.0)
    again, _ = read_snapshot(json.loads(json.dumps(data)), 0.0)
    assert again is first
    as_int = _set(data, "settings.base_delay_ms", 500)
    as_float = _set(data, "settings.base_delay_ms", 500.0)
    read_int, _ = read_snapshot(as_int, 0.0)
    read_float, _ = read_snapshot(as_float, 0.0)
    assert read_int == read_float
    assert read_int is not read_float
    assert type(read_snapshot(as_int, 0.0)[0].to_dict()["base_delay_ms"]) is int
    assert type(read_snapshot(as_float, 0.0)[0].to_dict()["base_delay_ms"]) is float
    zero, _ = read_snapshot(_set(data, "settings.max_context_reductions", 0), 0.0)
    assert zero.max_context_reductions == 0
    signed = [
        read_snapshot(_set(data, "settings.max_server_wait_s", z), 0.0)[0] for z in (0.0, -0.0)
    ]
    assert [str(s.max_server_wait_s) for s in signed] == ["0.0", "-0.0"]
    for sub in (
        _set(data, "settings.model", _Text("m")),
        _set(data, "settings.fallback_models", [_Text("b")]),
    ):
        with pytest.raises(sm.SnapshotError, match=r"^settings: must be JSON data"):
            read_snapshot(sub, 0.0)
    keyed = copy.deepcopy(data)
    keyed["settings"] = {_Text(k): v for k, v in data["settings"].items()}
    with pytest.raises(sm.SnapshotError, match=r"^settings: must be JSON data"):
        read_snapshot(keyed, 0.0)


@pytest.mark.requirement("ER-26")
@pytest.mark.parametrize("value", [0.0, 1.5, "0", True])
def test_a_model_index_that_is_no_int_is_refused_naming_its_type(value: object) -> None:
    """The reader of ``turn.model_index`` refuses what is not an int itself (the
    reachable rules would refuse 1.5 too, as out of range: the message says what is
    wrong first)."""
    with pytest.raises(sm.SnapshotError, match=r"^turn\.model_index: must be int"):
        sm.Session.restore(_set(_snapshot(), "turn.model_index", value), clock=ManualClock())
