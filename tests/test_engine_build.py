"""The generated parts of the engine's step (issue 29, item 3): actions made through
their slots, and each group's trial of its rows unrolled. Each must be what the plain
code it replaces gives."""

from __future__ import annotations

import itertools
import random
from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine.core import _actions
from statemachine.core._builder import build_choose
from statemachine.core._engine import DISPATCH
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
