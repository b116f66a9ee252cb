"""Transition-table rows the mutation runner found untested (``specs/mutation.md``).

Dropping the row ``assembling, CannotShrink -> failed (context_exhausted)`` (or
renaming its event) left the fast suites green: no test sent ``CannotShrink`` to the
turn's *first* assembly. These tests do, through the public API.
"""

from __future__ import annotations

import pytest

import statemachine as sm

from .helpers import new_session


@pytest.mark.requirement("ER-8")
def test_the_first_assembly_that_cannot_shrink_fails_context_exhausted() -> None:
    """``CannotShrink`` in answer to the turn's first ``Assemble`` ends the turn
    ``context_exhausted`` at once: no model call, no error attached, turn over."""
    session = new_session()
    turn = session.new_turn()
    assert turn.start() == sm.Assemble(reduce=False)
    action = turn.send(sm.CannotShrink())
    assert action == sm.Finish(sm.TurnStatus.CONTEXT_EXHAUSTED)
    assert turn.state == "failed"
    with pytest.raises(sm.IllegalEvent):
        turn.send(sm.Assembled("req", 10))


@pytest.mark.requirement("ER-8")
def test_cannot_shrink_is_legal_only_in_answer_to_an_assemble() -> None:
    """``CannotShrink`` is an answer to ``Assemble`` (first or reduced); while the
    model is being called it is illegal and changes nothing."""
    session = new_session()
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("req", 10))
    with pytest.raises(sm.IllegalEvent):
        turn.send(sm.CannotShrink())
    assert turn.state == "calling"
