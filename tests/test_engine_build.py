"""The generated parts of the engine's step (issue 29, item 3): actions made through
their slots, and each group's trial of its rows unrolled. Each must be what the plain
code it replaces gives."""

from __future__ import annotations

import copy
import itertools
import pickle
import random
import weakref
from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine.core import _actions
from statemachine.core._builder import build_choose, build_maker
from statemachine.core._engine import DISPATCH, TRIGGERS
from statemachine.core._taxonomy import ErrorCategory, ToolErrorCategory, TurnStatus


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


def test_a_class_that_runs_code_when_made_gets_no_maker() -> None:
    """A validator, converter or post-init would be skipped: refused by name."""

    @attrs.frozen
    class Checked:
        n: int = attrs.field(validator=attrs.validators.instance_of(int))

    with pytest.raises(TypeError, match="Checked runs code when it is made"):
        _actions._maker(Checked)


def _loop(rows: list[tuple[list[bool], str]]) -> str | None:
    """The trial as ``Core.fire`` ran it before: a row whose guards all hold."""
    for guards, row in rows:
        if all(guards):
            return row
    return None


@pytest.mark.parametrize("shape", [(1,), (0,), (2, 1), (1, 0, 2), (3, 2, 0, 1), (1, 1, 1)])
def test_the_unrolled_trial_picks_the_row_the_loop_picks(shape: tuple[int, ...]) -> None:
    """For every truth table of guards of the given counts per row, the generated
    ``choose`` returns the row the plain loop returns, and calls the guards the loop
    would call, in the same order, stopping where it stops."""
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
            rows.append(([guard(i + j) for j in range(n)], f"row{r}"))
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
        choose = build_choose(rows)
        assert choose(None, None, None, None) == _loop(numbered)
        assert calls == expected_calls


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


def test_each_groups_trial_with_its_guards_written_out_chooses_as_calling_them_does() -> None:
    """The trial a group runs (its one-expression guards written out in place) picks the
    row the trial calling every guard function picks, for every group of the table on
    drawn values of everything the guards read."""
    rng = random.Random(29)
    groups = list(DISPATCH.groups.values())
    inlined = 0
    for _ in range(400):
        inputs = _random_inputs(rng)
        for group in groups:
            calling = build_choose([(row.guards, row) for row in group.rows])
            assert group.choose(*inputs) is calling(*inputs), group.rows
            inlined += group.choose.__code__.co_freevars != calling.__code__.co_freevars
    assert inlined > 0  # the groups' trials do write guards out


def test_the_groups_by_state_are_the_groups_by_key() -> None:
    """``Core.fire`` finds a group by its state, then by its trigger (a failure's by its
    category): the same group the ``(state, trigger, category)`` key names, and no key
    of the second level stands for two things (a category is never named as a trigger)."""
    assert not set(TRIGGERS.values()) & {category.value for category in ErrorCategory}
    found = 0
    for (state, trigger, category), group in DISPATCH.groups.items():
        assert DISPATCH.by_state[state][trigger if category is None else category] is group
        found += 1
    assert found == sum(len(groups) for groups in DISPATCH.by_state.values())
