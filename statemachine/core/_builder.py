"""The one place generated code is compiled, and the generators of the engine's own.

The hottest paths run as straight-line code generated at import from the
declarations that define them, never from input. The ``build_*`` functions here write
the engine's: encoding a value and its compact form (``_codec.py``'s classes),
making an action through its slots, a table group's trial of its rows, copying a state
for the model checker and a trace step's counters (``_state.py``), a store's snapshot
text (``_state_text.py``) and a trace record (``_engine.py``). The readers live beside
the formats they read and compile through :func:`_compiled` too: a value's decoder and
its fast reader (``_codec.py``), a snapshot's generated reader and writer of each
state class (``_snapshot.py``).

This module imports nothing of the package: every plan and every helper the generated
code calls comes in as an argument.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable, Sequence
from typing import Any

_FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
"""A build without the GIL: there an object's ``__class__`` is assigned with every other
thread stopped, so :func:`build_maker` sets slots through their descriptors instead."""


def _compiled(
    source: str, name: str, filename: str, namespace: dict[str, Any]
) -> Callable[..., Any]:
    """The function ``source`` defines as ``name``, compiled as ``filename`` (what a
    traceback names) with ``namespace`` as its globals."""
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - source written here from the package's declarations, never from input
    function: Callable[..., Any] = namespace[name]
    return function


# -- the actions (_actions.py) ---------------------------------------------------------


def build_maker(cls: type, fields: Sequence[str]) -> Callable[..., Any]:
    """``make(*values)``: an instance of the frozen slotted attrs class ``cls`` whose
    ``fields`` (every field, in order) hold ``values``: what ``cls(*values)`` makes,
    without the frozen ``__init__``'s detour through ``object.__setattr__`` (for a class
    whose fields have no converter, validator or ``__attrs_post_init__``: the caller's
    to check).

    When ``cls`` has no slot but its fields' (no ``__weakref__``: the actions), the
    values go into an unfrozen twin with the same slots, which is then given ``cls`` as
    its class (about half the cost); otherwise, and on a free-threaded build (where
    assigning ``__class__`` stops every thread), through ``cls``'s slot descriptors."""
    lines = [f"def make({', '.join(fields)}):"]
    namespace: dict[str, Any] = {"new_instance": object.__new__, "cls": cls}
    twin = type(f"_{cls.__name__}Twin", (), {"__slots__": tuple(fields)})
    if _FREE_THREADED or not _takes_class(object.__new__(twin), cls):
        # another slot (a twin's layout differs), or no GIL
        lines.append("    new = new_instance(cls)")
        for name in fields:
            namespace[f"set_{name}"] = getattr(cls, name).__set__
            lines.append(f"    set_{name}(new, {name})")
    else:
        namespace["twin"] = twin
        lines.append("    new = new_instance(twin)")
        lines += [f"    new.{name} = {name}" for name in fields]
        lines.append("    new.__class__ = cls")
    lines.append("    return new")
    return _compiled("\n".join(lines) + "\n", "make", f"<make {cls.__name__}>", namespace)


def _takes_class(instance: Any, cls: type) -> bool:
    """Whether ``instance`` can be given ``cls`` as its class (the same layout)."""
    try:
        instance.__class__ = cls
    except TypeError:
        return False
    return True


# -- the dispatch (_engine.py) ---------------------------------------------------------


def build_choose(rows: Sequence[tuple[Sequence[Callable[..., bool]], Any]]) -> Any:
    """``choose(core, turn, event, facts)``: the first of ``rows`` ((guards, row), in
    trial order) whose guards all hold, each guard called as ``guard(core, turn, event,
    facts)`` in order until one fails; ``None`` when none holds.

    What the loop ``for guards, row in rows: if all(...): return row`` does, unrolled:
    every call of the loop is made from one place, which CPython cannot specialize for
    the many guards it meets (measured: a rate limit's trial costs four times the
    unrolled one's), while each guard here is called from a place of its own. The
    source is compiled once per shape (how many guards each row has), the guards and
    the rows bound to it."""
    shape: list[int] = []
    for guards, _ in rows:
        shape.append(len(guards))
        if not guards:
            break  # an unguarded row: the rows after it never fire
    key = tuple(shape)
    factory = _CHOOSERS.get(key)
    if factory is None:
        factory = _CHOOSERS[key] = _choose_factory(key)
    return factory(*(value for guards, row in rows[: len(key)] for value in (*guards, row)))


_CHOOSERS: dict[tuple[int, ...], Callable[..., Any]] = {}


def _choose_factory(shape: tuple[int, ...]) -> Callable[..., Any]:
    params = []
    body = ["    def choose(core, turn, event, facts):"]
    for i, count in enumerate(shape):
        terms = [f"guard{i}_{j}(core, turn, event, facts)" for j in range(count)]
        params += [*(f"guard{i}_{j}" for j in range(count)), f"row{i}"]
        if not terms:
            body.append(f"        return row{i}")
            break
        body += [f"        if {' and '.join(terms)}:", f"            return row{i}"]
    else:
        body.append("        return None")
    lines = [f"def factory({', '.join(params)}):", *body, "    return choose"]
    return _compiled("\n".join(lines) + "\n", "factory", f"<choose, rows of {shape} guards>", {})


# -- the state (_state.py) -------------------------------------------------------------

_FROM_STATE = "<{}, derived from the state declaration>"


def build_copy(
    cls: type, fields: Sequence[tuple[str, Callable[[Any], Any] | None]]
) -> Callable[[Any], Any]:
    """An independent copy of a ``cls`` instance, as straight-line field copies (the
    model checker's hottest path): each of ``fields`` (name, copy) copied by its
    ``copy``, or shared where that is ``None`` (an immutable value)."""
    lines = ["def copy(old):", "    new = new_instance(cls)"]
    namespace: dict[str, Any] = {"new_instance": cls.__new__, "cls": cls}
    for name, copy in fields:
        if copy is None:
            lines.append(f"    new.{name} = old.{name}")
        else:
            namespace[f"copy_{name}"] = copy
            lines.append(f"    new.{name} = copy_{name}(old.{name})")
    lines.append("    return new")
    return _compiled("\n".join(lines) + "\n", "copy", _FROM_STATE.format("copy"), namespace)
