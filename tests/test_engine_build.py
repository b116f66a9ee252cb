"""The generated parts of the engine's step (issue 29, item 3; issue 38, item 3):
actions made through their slots, and each group's trial of its rows written out in
``core/_trials.py``. Each must be what the plain code it replaces gives."""

from __future__ import annotations

import copy
import itertools
import pickle
import random
import weakref
from pathlib import Path
from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine.core import _actions, _builder, _trials
from statemachine.core._builder import build_maker, trials_source
from statemachine.core._engine import CATEGORY_GUARDS, DISPATCH, GUARDS, TRIGGERS, Dispatch, Group
from statemachine.core._table import ROWS, STATES, Row
from statemachine.core._taxonomy import ErrorCategory, ToolErrorCategory, TurnStatus
from statemachine.dev.check import check


def _values(rng: random.Random) -> dict[str, list[Any]]:
    error = sm.ModelError("rate_limited")
    return {
        "CallModel": [rng.choice([{"m": [1]}, "req", None]), rng.randrange(9), "gpt", True],
        "Wait": [
            rng.random() * 30,
            rng.choice([ErrorCategory.OVERLOADED, ToolErrorCategory.CONCURRENCY_CONFLICT]),
            rng.randrange(5),
            rng.choice([None, 2.5]),
        ],
        "Finish": [
            rng.choice(list(TurnStatus)),
            (sm.ToolResult("c1", "r"),),
            rng.choice([None, error]),
            "m",
            (sm.Fallback(None, "b", error),),
            rng.choice([None, 12.5]),
            {"text": "hi"},
            rng.choice([True, False]),
            {"text": "hi"},
        ],
    }


@pytest.mark.requirement("ER-25")
@pytest.mark.parametrize("seed", range(20))
def test_an_action_made_through_its_slots_is_the_one_its_init_makes(seed: int) -> None:
    """Equal, the same repr (and hash, where the values hash), every field the same
    object, and still frozen."""
    makers = {
        "CallModel": (_actions.make_call_model, sm.CallModel),
        "Wait": (_actions.make_wait, sm.Wait),
        "Finish": (_actions.make_finish, sm.Finish),
    }
    for name, values in _values(random.Random(seed)).items():
        make, cls = makers[name]
        made, built = make(*values), cls(*values[:-1], **{attrs.fields(cls)[-1].name: values[-1]})
        assert type(made) is cls
        assert made == built
        if name == "Wait":  # the others may hold unhashable host data
            assert hash(made) == hash(built)
        assert repr(made) == repr(built)
        for field in attrs.fields(cls):
            assert getattr(made, field.name) is getattr(built, field.name)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            made.__setattr__(attrs.fields(cls)[0].name, None)
        pickled = pickle.loads(pickle.dumps(made))  # noqa: S301 - our own bytes
        for twin in (pickled, copy.deepcopy(made), attrs.evolve(made)):
            assert type(twin) is cls
            assert twin == built
        assert attrs.asdict(made) == attrs.asdict(built)


def test_a_class_with_a_weakref_slot_is_made_through_its_slot_descriptors() -> None:
    """A twin cannot take the class of an instance whose layout has a ``__weakref__``
    slot after its fields: such a class is filled through its descriptors instead,
    and both ways make what ``__init__`` makes."""

    @attrs.frozen
    class Weak:
        a: int
        b: Any

    @attrs.frozen(weakref_slot=False)
    class Plain:
        a: int
        b: Any

    for cls in (Weak, Plain):
        make = build_maker(cls, ("a", "b"))
        made = make(1, [2])
        assert type(made) is cls
        assert made == cls(1, [2])
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            made.a = 3
    assert weakref.ref(build_maker(Weak, ("a", "b"))(1, 2))() is not None
    assert "twin" in build_maker(Plain, ("a", "b")).__code__.co_names
    assert "twin" not in build_maker(Weak, ("a", "b")).__code__.co_names


def test_a_free_threaded_build_makes_through_the_slot_descriptors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the GIL an object's class is assigned with every thread stopped: there
    even a class with its fields' slots alone is made through its descriptors."""
    monkeypatch.setattr(_builder, "_FREE_THREADED", True)

    @attrs.frozen(weakref_slot=False)
    class Plain:
        a: int

    make = build_maker(Plain, ("a",))
    assert "twin" not in make.__code__.co_names
    assert make(4) == Plain(4)


def test_a_class_that_runs_code_when_made_gets_no_maker() -> None:
    """A validator, converter or post-init would be skipped: refused by name."""

    @attrs.frozen
    class Checked:
        n: int = attrs.field(validator=attrs.validators.instance_of(int))

    with pytest.raises(TypeError, match="Checked runs code when it is made"):
        _actions._maker(Checked)


def _loop(rows: list[tuple[list[bool], str]]) -> str | None:
    """The trial as the table reads: a row whose guards all hold."""
    for guards, row in rows:
        if all(guards):
            return row
    return None


@pytest.mark.parametrize("shape", [(1,), (0,), (2, 1), (1, 0, 2), (3, 2, 0, 1), (1, 1, 1)])
def test_trying_the_rows_picks_the_row_the_loop_picks(shape: tuple[int, ...]) -> None:
    """For every truth table of guards of the given counts per row, ``Group.try_rows``
    (what a mutated table runs, and what each written-out trial must do) returns the
    row the plain loop returns, and calls the guards the loop would call, in the same
    order, stopping where it stops."""
    count = sum(shape)
    for truth in itertools.product((False, True), repeat=count):
        calls: list[int] = []

        def guard(i: int, truth: tuple[bool, ...] = truth, calls: list[int] = calls) -> Any:
            def check(_core: Any, _turn: Any, _event: Any, _facts: Any) -> bool:
                calls.append(i)
                return truth[i]

            return check

        rows, numbered, i = [], [], 0
        for r, n in enumerate(shape):
            rows.append(_ns(guards=tuple(guard(i + j) for j in range(n))))
            numbered.append(([truth[i + j] for j in range(n)], f"row{r}"))
            i += n
        expected_calls: list[int] = []
        i = 0
        for n in shape:
            for j in range(n):
                expected_calls.append(i + j)
                if not truth[i + j]:
                    break
            else:
                break
            i += n
        chosen = Group(tuple(rows), None).try_rows(None, None, None, None)  # type: ignore[arg-type]
        assert (None if chosen is None else f"row{rows.index(chosen)}") == _loop(numbered)
        assert calls == expected_calls


def test_the_written_out_trials_are_what_the_command_writes() -> None:
    """``core/_trials.py`` is what ``python -m statemachine.dev._write_trials`` writes from the
    table and the guards as they are now (a changed guard or row is written again)."""
    written = Path(_trials.__file__).read_text()
    assert written.split(_builder.TRIALS_MARK)[1] == trials_source(DISPATCH.groups, GUARDS)


def test_the_table_runs_its_written_out_trials_and_a_mutated_one_tries_its_rows() -> None:
    """Every group of the table whose first row is guarded runs its trial of
    ``_trials.py``; the groups of a table the model check mutated try their rows."""
    for key, group in DISPATCH.groups.items():
        guarded = bool(group.rows and group.rows[0].guards)
        assert (group.trial is not None) == guarded, key
        assert (group.choose == group.try_rows) != guarded, key
    mutated = Dispatch(dict(_mutated_tables())["Cancelled guarded by a category"])
    assert all(group.choose == group.try_rows for group in mutated.groups.values())


def test_every_group_of_the_table_has_its_trial() -> None:
    """Each group's ``choose`` is built over its own rows (a group with one unguarded row
    and nothing to read also keeps it as ``only``)."""
    for key, group in DISPATCH.groups.items():
        assert callable(group.choose), key
        if group.only is not None:
            assert group.rows == (group.only,)
            assert not group.only.guards and group.facts is None and group.check is None
            assert not group.charges


class _Facts(tuple):  # type: ignore[type-arg]
    """Facts read both ways: a wait's by index, a tool round's by attribute."""

    tripped: frozenset[str]
    denied: bool
    seconds: float | None
    terminal: bool


def _random_inputs(rng: random.Random) -> tuple[Any, Any, Any, Any]:
    """A ``(core, turn, event, facts)`` whose every field a guard reads is drawn near
    the caps it is compared with (so each comparison goes both ways)."""
    cap = rng.randrange(3)
    settings = _ns(
        max_context_reductions=cap,
        session_retry_ceiling=rng.randrange(3),
        max_retries=rng.randrange(3),
        fallback_models=("b",) * rng.randrange(3),
    )
    core = _ns(settings=settings, state=_ns(retries=rng.randrange(4)))
    turn = _ns(
        final_answer=rng.random() < 0.5,
        reductions=rng.randrange(4),
        attempt=rng.randrange(4),
        model_index=rng.randrange(-1, 2),
        overflowed_size=rng.choice([None, 5, 10]),
        overflowed_request=rng.choice(["a", "b"]),
    )
    event = _ns(
        tool_calls=rng.choice([(), ("call",)]),
        partial=rng.random() < 0.5,
        size=rng.choice([4, 5, 11]),
        request=rng.choice(["a", "b"]),
    )
    facts = _Facts(rng.random() < 0.5 for _ in range(4))
    facts.tripped = frozenset(rng.choice([(), ("p",)]))
    facts.denied = rng.random() < 0.5
    facts.seconds = rng.choice([None, 0.0, 1.5])
    facts.terminal = rng.random() < 0.5
    return core, turn, event, facts


def _ns(**fields: Any) -> Any:
    return type("Ns", (), fields)()


def _tried(rows: tuple[Any, ...], inputs: tuple[Any, Any, Any, Any]) -> Any:
    """The first of ``rows`` whose guards all hold on ``inputs``: the trial as the table
    reads, one guard after another."""
    for row in rows:
        if all(guard(*inputs) for guard in row.guards):
            return row
    return None


def test_each_groups_trial_chooses_as_trying_its_rows_in_order_does() -> None:
    """The trial a group runs picks the row that trying its rows in order picks, for
    every group of the table on drawn values of everything the guards read."""
    rng = random.Random(29)
    groups = list(DISPATCH.groups.values())
    for _ in range(400):
        inputs = _random_inputs(rng)
        for group in groups:
            assert group.choose(*inputs) is _tried(group.rows, inputs), group.rows


def _mutated_tables() -> list[tuple[str, list[Row]]]:
    """Tables the model checker may be handed: a row of another trigger given a category
    guard (its groups are then by category, none of them a failure's), failures with no
    category guard at all (one group, which no failure is looked up by)."""
    rows = list(ROWS)
    cancel = next(i for i, r in enumerate(rows) if r.source == "calling" and r.event == "Cancelled")
    guarded = rows.copy()
    guarded[cancel] = attrs.evolve(rows[cancel], guards=("transient",))
    unguarded = [
        attrs.evolve(r, guards=tuple(g for g in r.guards if g not in CATEGORY_GUARDS))
        if r.event == "ModelFailed"
        else r
        for r in rows
    ]
    return [
        ("shipped", rows),
        ("Cancelled guarded by a category", guarded),
        ("ModelFailed unguarded", unguarded),
    ]


@pytest.mark.parametrize(
    "name", ["shipped", "Cancelled guarded by a category", "ModelFailed unguarded"]
)
def test_the_groups_core_fire_finds_are_those_the_full_key_names(name: str) -> None:
    """``Core.fire`` finds a group by its state, then by its trigger (a failure's by its
    category, in a map of its own): for every state, trigger and category, on the table
    and on mutated ones, the group the ``(state, trigger, category)`` key names (the
    category only a failure's), or none where that key names none."""
    dispatch = Dispatch(dict(_mutated_tables())[name])
    triggers = sorted({*TRIGGERS.values(), "start"})
    checked = 0
    for state in STATES:
        for trigger in triggers:
            failure = trigger == "ModelFailed"  # a failure's error always has a category
            for category in ErrorCategory if failure else (None,):
                expected = dispatch.groups.get((state, trigger, category))
                found = (dispatch.failures if failure else dispatch.by_state).get(state, {})
                assert found.get(category if failure else trigger) is expected, (state, trigger)
                checked += expected is not None
    assert checked > 0


def test_a_mutated_table_is_checked_as_it_reads() -> None:
    """A ``Cancelled`` row of ``calling`` guarded by a category is never taken (its groups
    are by category, and a cancellation has none): the model check finds that one fault,
    and the failures of ``calling`` still go to their own rows."""
    small = sm.Settings(max_retries=2, session_retry_ceiling=3, max_context_reductions=1)
    report = check(small, rows=dict(_mutated_tables())["Cancelled guarded by a category"])
    assert [v.requirement for v in report.violations] == ["ER-27"]
    assert "Cancelled is not legal in state 'calling'" in report.violations[0].message


def test_a_failure_whose_category_is_named_as_a_trigger_is_refused() -> None:
    """A forged error whose category is a trigger's name is no category: refused, the
    turn unchanged (not taken as that trigger)."""
    session = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("r", 10))
    error = sm.ModelError("rate_limited")
    object.__setattr__(error, "category", "Cancelled")
    with pytest.raises(sm.IllegalEvent):
        turn.send(sm.ModelFailed(error))
    assert turn.state == "calling"


def test_the_values_made_on_every_step_are_made_through_a_twin() -> None:
    """The actions and a worker's result have no slot but their fields' (no
    ``__weakref__``): their makers fill a twin, the cheaper way, and a weak reference
    to one is refused as the migration notes say."""
    from statemachine.store._worker import _make_advanced

    makers = (_actions.make_call_model, _actions.make_wait, _actions.make_finish, _make_advanced)
    for make in makers:
        assert "twin" in make.__code__.co_names, make
    with pytest.raises(TypeError):
        weakref.ref(sm.Wait(1.0, ErrorCategory.RATE_LIMITED, 0))
