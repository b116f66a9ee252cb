"""Replay is the live session again (issue 37): a session made without a seed draws its
own and every replay takes the recorded one; a step that had no wall time and a turn
made before it started replay as they were taken."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

import statemachine as sm
from statemachine.io._trace_file import TraceFileError, load_trace, read_trace
from statemachine.store import InMemoryStore, Worker

from .helpers import ManualClock

WALL = 1_700_000_000.0
DATE = "Tue, 14 Nov 2023 22:13:23 GMT"
"""3 s after :data:`WALL`."""


def _first_wait(session: sm.Session) -> float:
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"messages": []}, 10))
    wait = turn.send(sm.ModelFailed(sm.ModelError("rate_limited", status=429)))
    assert isinstance(wait, sm.Wait)
    return wait.seconds


def _waits(turn: sm.Turn, n: int) -> list[float]:
    """The waits of ``n`` rate limits in a row, each slept out."""
    waits = []
    for _ in range(n):
        wait = turn.send(sm.ModelFailed(sm.ModelError("rate_limited", status=429)))
        assert isinstance(wait, sm.Wait)
        waits.append(wait.seconds)
        turn.send(sm.WaitDone())
    return waits


def _replay(
    records: list[sm.TraceRecord], session: sm.Session
) -> list[sm.Action]:  # the documented recipe (docs/migration.md)
    actions: list[sm.Action] = []
    turn: Any = None
    for record in records:
        if record.caused_by is None:
            made = record.at if record.made_at is None else record.made_at
            turn = session.new_turn(at=made)
            actions.append(turn.start(at=record.at))
        else:
            actions.append(turn.send(record.caused_by, at=record.at, wall=record.wall))
    return actions


# -- every session its own seed -------------------------------------------------------


@pytest.mark.requirement("ER-146")
def test_fifty_sessions_made_alike_wait_apart_at_one_429() -> None:
    """Fifty sessions made alike (no seed) that meet one 429 wait at least 45 different
    times (before, all fifty waited the same); fifty given one seed still wait alike."""
    drawn = [_first_wait(sm.Session(sm.Settings(), clock=ManualClock())) for _ in range(50)]
    assert len(set(drawn)) >= 45
    pinned = [
        _first_wait(sm.Session(sm.Settings(), seed=0, clock=ManualClock())) for _ in range(50)
    ]
    assert len(set(pinned)) == 1


@pytest.mark.requirement("ER-146", "ER-26")
def test_an_unseeded_session_restores_and_replays_from_a_store_with_its_own_seed() -> None:
    """An unseeded session's seed is in its snapshot: restored mid-backoff it waits what
    it would have waited, and a store's readers (a worker that never saw it, the store
    API) replay its journal to the same waits and snapshot; none draws a new seed."""
    clock = ManualClock()
    live = sm.Session(sm.Settings(max_retries=8), clock=clock)
    twin = sm.Session(sm.Settings(max_retries=8), seed=live.seed, clock=ManualClock())
    turns = [session.new_turn() for session in (live, twin)]
    for turn in turns:
        turn.start()
        turn.send(sm.Assembled({"messages": []}, 10))
    before = _waits(turns[0], 3)
    assert before == _waits(turns[1], 3)
    snapshot = json.loads(json.dumps(live.snapshot()))
    assert snapshot["seed"] == live.seed
    restored = sm.Session.restore(snapshot, clock=ManualClock(5.0))
    assert restored.seed == live.seed
    assert _waits(restored.current_turn, 3) == _waits(turns[1], 3)  # type: ignore[arg-type]

    store = InMemoryStore()
    worker = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    session = sm.Session(sm.Settings(max_retries=8), clock=lambda: 0.0)
    result = worker.create("s", session)
    result = worker.advance("s", None, expected_version=result.version)
    result = worker.advance("s", sm.Assembled({"m": 1}, 5), expected_version=result.version)
    stored_waits = []
    for _ in range(3):
        failure = sm.ModelFailed(sm.ModelError("rate_limited", status=429))
        result = worker.advance("s", failure, expected_version=result.version)
        assert isinstance(result.action, sm.Wait)
        stored_waits.append(result.action.seconds)
        result = worker.advance("s", sm.WaitDone(), expected_version=result.version)
    pinned = sm.Session(sm.Settings(max_retries=8), seed=session.seed, clock=ManualClock())
    turn = pinned.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    assert stored_waits == _waits(turn, 3)
    reader = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    assert reader.load("s").session.snapshot() == result.session.snapshot()
    assert store.load("s").record["snapshot"]["seed"] == session.seed


@pytest.mark.requirement("ER-146", "ER-142")
def test_a_trace_file_records_its_sessions_seed_and_replays_with_it() -> None:
    """A writer bound to an unseeded session writes its seed in the header; the file's
    records, replayed on a session of that seed, give the same actions (a simulate
    file's summaries name theirs)."""
    stream = io.StringIO()
    writer = sm.TraceWriter(stream, wall_clock=lambda: WALL)
    clock = ManualClock(0.0)
    live = sm.Session(sm.Settings(), clock=clock, observers=[writer])
    writer.bind(live)
    turn = live.new_turn()
    turn.start()
    turn.send(sm.Assembled({"messages": []}, 10))
    waits = _waits(turn, 2)
    trace = read_trace(stream.getvalue().splitlines())
    assert json.loads(stream.getvalue().splitlines()[0])["seed"] == live.seed
    assert trace.seeds == {None: live.seed}
    again = sm.Session(trace.settings[None], seed=trace.seeds[None], clock=None)
    records = [step.record for step in trace.steps]
    assert _replay(records, again) == [record.action for record in records]
    pinned = _replay(records, sm.Session(clock=None, seed=0))
    assert [a.seconds for a in pinned if isinstance(a, sm.Wait)] != waits  # another seed

    summary = {"type": "summary", "scenario": "x", "seed": -1, "settings": {}}
    lines = [*stream.getvalue().splitlines(), json.dumps(summary)]
    assert read_trace(lines).seeds == {None: live.seed, "x": 2**64 - 1}  # as a session takes it
    with pytest.raises(TraceFileError, match=r"<trace>:1: seed: must be an int"):
        read_trace([json.dumps({**json.loads(stream.getvalue().splitlines()[0]), "seed": "7"})])


# -- a step with no wall time ------------------------------------------------------------


@pytest.mark.requirement("ER-147", "ER-141")
def test_a_step_with_no_wall_time_replays_so_on_a_session_with_a_wall_clock(
    tmp_path: Any,
) -> None:
    """A session with no wall clock meets a 429 whose retry-after is an HTTP-date with no
    date header: unusable, so it backs off by itself. Its records, sent again on a
    session whose wall clock would make the date a 3 s wait (from the observer and
    from a trace file), wait as live did; the wall clock is never read."""
    path = tmp_path / "trace.jsonl"
    writer = sm.TraceWriter(path, wall_clock=lambda: WALL)
    records: list[sm.TraceRecord] = []
    live = sm.Session(
        sm.Settings(), seed=5, clock=None, wall_clock=None, observers=[records.append, writer]
    )
    writer.bind(live)
    turn = live.new_turn(at=0.0)
    turn.start(at=0.0)
    turn.send(sm.Assembled({"messages": []}, 10), at=0.1)
    dated = sm.ModelFailed(sm.ModelError("rate_limited", headers={"retry-after": DATE}))
    wait = turn.send(dated, at=0.2)
    assert isinstance(wait, sm.Wait) and wait.retry_after is None
    writer.close()
    assert records[-1].wall is None

    def unread() -> float:
        raise AssertionError("a step that had no wall time reads no wall clock")

    for source in (records, [step.record for step in load_trace(path).steps]):
        again = sm.Session(sm.Settings(), seed=5, clock=None, wall_clock=unread)
        assert _replay(source, again) == [record.action for record in records]
        assert again.snapshot(at=0.2) == live.snapshot(at=0.2)

    walled = sm.Session(sm.Settings(), seed=5, clock=None, wall_clock=lambda: WALL)
    turn = walled.new_turn(at=0.0)
    turn.start(at=0.0)
    turn.send(sm.Assembled({"messages": []}, 10), at=0.1)
    honoured = turn.send(dated, at=0.2)  # wall left out: the session's wall clock is read
    assert isinstance(honoured, sm.Wait) and honoured.retry_after == 3.0


# -- a turn made before it starts --------------------------------------------------------


@pytest.mark.requirement("ER-147")
def test_a_turn_made_before_its_start_replays_as_made(tmp_path: Any) -> None:
    """With max_wall_clock_s = 10, a turn made at 9 s and started at 15 s is an ordinary
    turn (its bounds were checked at 9 s). Its start record says when it was made, a
    trace file keeps it (``made_t``), and the replay makes it then: an ordinary turn
    again, the same state (before, the replay made it at 15 s: a final-answer turn)."""
    settings = sm.Settings(max_wall_clock_s=10.0)
    path = tmp_path / "trace.jsonl"
    writer = sm.TraceWriter(path, wall_clock=lambda: WALL)
    records: list[sm.TraceRecord] = []
    live = sm.Session(settings, seed=1, clock=None, observers=[records.append, writer])
    writer.bind(live)
    turn = live.new_turn(at=9.0)
    assert turn.start(at=15.0) == sm.Assemble(reduce=False)
    turn.send(sm.Assembled({"messages": []}, 10), at=15.5)
    assert isinstance(turn.send(sm.ModelReplied(), at=16.0), sm.Finish)
    writer.close()
    assert not turn.final_answer and live.limit_reached is sm.SessionStatus.ERROR_MAX_WALL_CLOCK
    assert (records[0].at, records[0].made_at) == (15.0, 9.0)
    assert [r.made_at for r in records[1:]] == [None, None]
    assert turn.trace[0].made_at == 9.0

    lines = path.read_text().splitlines()
    assert json.loads(lines[1])["made_t"] == 9.0
    assert all("made_t" not in json.loads(line) for line in lines[2:])
    for source in (records, [step.record for step in load_trace(path).steps]):
        again = sm.Session(settings, seed=1, clock=None)
        assert _replay(source, again) == [record.action for record in records]
        assert again.snapshot(at=16.0) == live.snapshot(at=16.0)
    at_start = sm.Session(settings, seed=1, clock=None).new_turn(at=15.0)
    assert at_start.final_answer  # what the replay made before the start said when

    # a file written before made_t was recorded reads as before: the turn made at its start
    old = [
        json.dumps({k: v for k, v in json.loads(line).items() if k != "made_t"}) for line in lines
    ]
    assert read_trace(old).steps[0].record.made_at is None
    step = json.loads(lines[2])
    with pytest.raises(TraceFileError, match=r"made_t: only a start says when its turn was made"):
        read_trace([lines[0], lines[1], json.dumps({**step, "made_t": 9.0})])


@pytest.mark.requirement("ER-147")
def test_a_turn_made_in_this_process_says_so_and_a_restored_one_does_not() -> None:
    """``made_at`` is a moment of the session's clock, moved with its start (a copy on
    another clock); a snapshot keeps the turn, not that moment: a restored idle turn's
    start says ``None``."""
    session = sm.Session(sm.Settings(), seed=1, clock=None, started=100.0)
    session.new_turn(at=103.0)
    moved = session.copy(started=0.0)
    assert moved.current_turn.start(at=4.0) is not None  # type: ignore[union-attr]
    assert moved.current_turn.trace[0].made_at == 3.0  # type: ignore[union-attr]
    restored = sm.Session.restore(session.snapshot(at=104.0), None, at=4.0)
    turn = restored.current_turn
    assert turn is not None and turn.state == "idle"
    turn.start(at=5.0)
    assert turn.trace[0].made_at is None
