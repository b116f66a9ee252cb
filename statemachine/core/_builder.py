"""Every piece of code the package generates, from its own declarations (never from input).

Code is generated where a plain loop over a class's fields measured well beyond the
benchmarks' 10 % (in CPython 3.11 a field read by name costs many times a specialized
attribute read, and a call site that calls many functions is not specialized). Each
``build_*`` function writes one piece and says what it replaces: an action's maker
(``_actions.py``), the model checker's state copy (``_state.py``), a value's decoder and
checked reader (``_codec.py``), a state class's snapshot reader and writer
(``_snapshot.py``). :func:`trials_source` writes the trials of the table's row groups
into ``_trials.py`` (a command, drift-checked by a test): no guard's text is compiled at
run time.

This module imports nothing of the package: what the generated code calls comes in as
an argument.
"""

from __future__ import annotations

import ast
import enum
import inspect
import sysconfig
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

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


TRIALS_MARK = "# -- written by python -m statemachine.dev._write_trials: do not edit below --\n"
"""The line of ``_trials.py`` after which :func:`write_trials` writes the trials."""


def write_trials(path: Path, groups: Mapping[Any, Any], guards: Mapping[str, Any]) -> None:
    """Write the trials of ``groups`` into the file ``path`` after its
    :data:`TRIALS_MARK` (what is above it stays as it is)."""
    head = path.read_text().split(TRIALS_MARK)[0]
    path.write_text(head + TRIALS_MARK + trials_source(groups, guards))


_ARGUMENTS = ("core", "turn", "event", "facts")


def trials_source(groups: Mapping[Any, Any], guards: Mapping[str, Any]) -> str:
    """The trials of ``_trials.py`` (what follows :data:`TRIALS_MARK`): for each group
    of ``groups`` (``(state, trigger, category) -> Group``) whose first row is guarded,
    a trial that tests each row's guards (``row.names``), their expressions read from
    ``guards`` (each a ``lambda`` of ``core, turn, event, facts`` on a line of its own,
    or starting one) and written out in place; groups with the same rows share one."""
    trials: dict[tuple[tuple[str, ...], ...], str] = {}
    entries, bodies = [], []
    for (state, trigger, category), group in groups.items():
        names = tuple(row.names for row in group.rows)
        if not names or not names[0]:
            continue  # an unguarded first row: the trial takes it at once
        if names not in trials:
            trials[names] = f"_trial_{len(trials) + 1}"
            bodies.append(_trial_source(trials[names], names, guards))
        category_text = "None" if category is None else f"ErrorCategory.{category.name}"
        entries.append(f'    ("{state}", "{trigger}", {category_text}): {trials[names]},')
    table = [
        "TRIALS: dict[tuple[str, str, ErrorCategory | None], Callable[..., Trial[Any]]] = {",
        *entries,
        "}",
        '"""The trial of each group the table\'s rows make, by (state, trigger, category)."""',
    ]
    return "\n\n" + "\n\n".join([*bodies, "\n".join(table) + "\n"])


def _trial_source(name: str, rows: Sequence[Sequence[str]], guards: Mapping[str, Any]) -> str:
    lines = []
    used: set[str] = set()
    for i, row in enumerate(rows):
        if not row:
            lines.append(f"        return r[{i}]")
            break
        terms = [term for guard in row for term in _terms(guards[guard], used)]
        test = " and ".join(terms)
        if len(test) > 100 - len("        if :"):
            lines += ["        if (", *(f"            {t}" for t in terms[:1])]
            lines += [*(f"            and {t}" for t in terms[1:]), "        ):"]
        else:
            lines.append(f"        if {test}:")
        lines.append(f"            return r[{i}]  # {' & '.join(row)}")
    else:
        lines.append("        return None")
    core, turn, event, facts = (a if a in used else f"_{a}" for a in _ARGUMENTS)
    head = [
        f"def {name}(r: tuple[BoundRow, ...]) -> Trial[BoundRow]:",
        f"    def choose({core}: Core, {turn}: TurnState, {event}: Any, {facts}: Any)"
        " -> BoundRow | None:",
    ]
    return "\n".join([*head, *lines, "", "    return choose", ""])


def _terms(guard: Callable[..., bool], used: set[str]) -> list[str]:
    """The expression of ``guard``, a ``lambda`` of four parameters, over ``core, turn,
    event, facts``: the terms of its ``and``, each as source (the parameters it reads
    added to ``used``)."""
    source = textwrap.dedent(inspect.getsource(guard)).strip()
    found = next(n for n in ast.walk(_parsed(source)) if isinstance(n, ast.Lambda))
    renamed = {arg.arg: new for arg, new in zip(found.args.args, _ARGUMENTS, strict=True)}
    body = _Renamer(renamed).visit(found.body)
    used.update(n.id for n in ast.walk(body) if isinstance(n, ast.Name) and n.id in _ARGUMENTS)
    terms = body.values if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) else [body]
    return [_operand(term) for term in terms]


def _parsed(source: str) -> ast.AST:
    """``source``, a dict entry or a statement, parsed."""
    for text in (source, "{" + source.rstrip(",") + "}"):
        try:
            return ast.parse(text)
        except SyntaxError:
            continue
    raise ValueError(f"not a guard's source: {source[:60]!r}")


def _operand(term: ast.expr) -> str:
    text = ast.unparse(term)
    if isinstance(term, ast.BoolOp | ast.IfExp | ast.Lambda | ast.NamedExpr):
        return f"({text})"
    return text


class _Renamer(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.names.get(node.id, node.id), node.ctx)


# -- the state (_state.py) -------------------------------------------------------------

_FROM_STATE = "<{}, derived from the state declaration>"


def build_copy(
    cls: type, fields: Sequence[tuple[str, Callable[[Any], Any] | None]]
) -> Callable[[Any], Any]:
    """An independent copy of a ``cls`` instance, as straight-line field copies (the
    model checker's hottest path; the same through ``attrgetter`` and the class's
    ``__init__`` costs 2.5 times as much): each of ``fields`` (name, copy) copied by its
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


# -- the value codec's readers (_codec.py) ----------------------------------------------
#
# Reading a value is a store's replay, mostly: a field loop made decoding an event a
# quarter dearer than these straight lines.

FieldPlan = Sequence[tuple[str, bool, tuple[type[enum.Enum], ...]]]
"""(field, opaque, enum classes) of each encoded field of a value class, in order: an
opaque field (the host's data) is read as it is, an enum's field as a member."""


def build_decoder(cls: type, name: str, plan: FieldPlan, helpers: dict[str, Any]) -> Any:
    """``decode_one(data, depth)``: the ``cls`` (registered as ``name``) that ``data``
    encodes with every field of ``plan``, each decoded at ``depth + 1``; data with
    another number of keys, or without a field, is handed to ``decode_fields(name,
    data, depth)``. ``helpers`` holds what the code calls: ``decode_fields``, ``decode``
    (a nested value), ``enum_value`` (an enum's value that no member has), ``Bad`` (the
    refusal, with a ``path``), ``short_message``, ``plain`` (the types read as they are),
    ``MAX_DEPTH`` and ``too_deep``."""
    fallback = f"return decode_fields({name!r}, data, depth)"
    lines = [
        "def decode_one(data, depth):",
        f"    if len(data) != {len(plan) + 1}:",
        f"        {fallback}",
        *_lookups(plan, fallback),
        "    if depth >= MAX_DEPTH:",
        "        raise Bad(too_deep)",
    ]
    namespace = {**helpers, "cls": cls}
    for i, (field, opaque, enum_classes) in enumerate(plan):
        if opaque:
            continue
        if enum_classes:
            namespace[f"members{i}"] = _members_by_value(enum_classes)
            namespace[f"enums{i}"] = enum_classes
            where = f"{name}.{field}"
            lines += [
                f"    if v{i} is not None:",
                f"        m = members{i}.get(v{i}) if type(v{i}) is str else None",
                f"        v{i} = enum_value(enums{i}, v{i}, {where!r}) if m is None else m",
            ]
            continue
        lines += [
            f"    if type(v{i}) not in plain:",
            "        try:",
            f"            v{i} = decode(v{i}, depth + 1)",
            "        except Bad as bad:",
            f"            bad.path.append({'.' + field!r})",
            "            raise",
        ]
    lines += _built(cls, plan, "raise Bad(short_message(exc)) from None")
    return _compiled("\n".join(lines) + "\n", "decode_one", f"<decode {name}>", namespace)


def build_checked_reader(
    cls: type,
    plan: FieldPlan,
    tests: Sequence[tuple[int, Callable[[Any], bool], bool]],
    scalar: frozenset[type],
    plain: Callable[[Any, set[int]], bool] | None,
    make: Callable[..., Any] | None,
) -> Callable[[dict[Any, Any], set[int]], Any]:
    """``read(data, seen)``: the ``cls`` that ``data`` encodes with every field of
    ``plan``, each of a type of ``scalar``, the host's data or an enum's value, and
    each of ``tests`` (field index, check, data) passing (a data check passes at once
    where ``plain(value, seen)`` does); ``None`` for any other data. ``make`` (every
    field's value, in order) builds the value instead of ``cls``, when given."""
    lines = [
        "def read(data, seen):",
        f"    if len(data) != {len(plan) + 1}:",
        "        return None",
        *_lookups(plan, "return None"),
    ]
    namespace: dict[str, Any] = {"scalar": scalar, "plain": plain, "cls": cls, "make": make}
    for i, (_, opaque, enum_classes) in enumerate(plan):
        if opaque:
            continue
        if enum_classes:
            namespace[f"members{i}"] = _members_by_value(enum_classes)
            lines += [
                f"    v{i} = members{i}.get(v{i}) if type(v{i}) is str else None",
                f"    if v{i} is None:",
                "        return None",
            ]
            continue
        lines += [f"    if type(v{i}) not in scalar:", "        return None"]
    for j, (i, check, data) in enumerate(tests):
        namespace[f"check{j}"] = check
        passes = f"plain(v{i}, seen) or check{j}(v{i})" if data else f"check{j}(v{i})"
        lines += [f"    if not ({passes}):", "        return None"]
    if make is not None:
        lines.append(f"    return make({', '.join(f'v{i}' for i in range(len(plan)))})")
    else:
        lines += _built(cls, plan, "return None")
    return _compiled("\n".join(lines) + "\n", "read", f"<read {cls.__name__}>", namespace)


def _members_by_value(classes: tuple[type[enum.Enum], ...]) -> dict[Any, enum.Enum]:
    """Each value of ``classes``' members to its member, the first class's first."""
    members: dict[Any, enum.Enum] = {}
    for enum_class in classes:
        for member in enum_class:
            members.setdefault(member.value, member)
    return members


def _lookups(plan: FieldPlan, otherwise: str) -> list[str]:
    """Source lines reading every field of ``plan`` into ``v0``, ``v1``...: with the
    length checked before, the data then holds exactly ``$type`` and these keys (one
    missing: ``otherwise``)."""
    if not plan:
        return []
    return [
        "    try:",
        *(f"        v{i} = data[{field!r}]" for i, (field, _, _) in enumerate(plan)),
        "    except KeyError:",
        f"        {otherwise}",
    ]


def _built(cls: type, plan: FieldPlan, refused: str) -> list[str]:
    """Source lines returning the ``cls`` of ``v0``, ``v1``...; where its ``__init__``
    raises ``TypeError`` or ``ValueError`` (``exc``), ``refused`` runs instead."""
    return [
        "    try:",
        f"        return cls({_arguments(cls, plan)})",
        "    except (TypeError, ValueError) as exc:",
        f"        {refused}",
    ]


def _arguments(cls: type, plan: FieldPlan) -> str:
    """The arguments that build a ``cls`` of ``v0``, ``v1``...: by position where the
    plan's fields are those ``__init__`` takes by position, in order (a call is cheaper
    so), by name otherwise."""
    fields = [field for field, _, _ in plan]
    if fields == [f.name for f in attrs.fields(cls) if f.init and not f.kw_only]:
        return ", ".join(f"v{i}" for i in range(len(fields)))
    return ", ".join(f"{field}=v{i}" for i, field in enumerate(fields))


# -- the snapshot's reader and writer of each state class (_snapshot.py) ------------------

StateReadPlan = Sequence[tuple[str, str, Callable[[Any, str], Any], bool, str, Any]]
"""(field, key, decode, relative, how, argument) of each stored field of a state class,
in order: ``decode(raw, key)`` reads or refuses a value, a relative one is a reading
of the clock written as the seconds before ``now``; ``how`` the way the value is read
first: ``"turn"`` (a nested turn), ``"fast"`` (``argument(raw)``, ``None`` where
``decode`` must), ``"actions"``, ``"status"`` (``argument``: the members by value),
``"test"`` (``argument``: an expression over ``{v}`` whose passing means ``decode``
gives the value back as it is), ``"empty"`` (``argument``: (``"list"`` or ``"dict"``,
what an empty one reads as)), ``"decode"``."""


def build_state_reader(
    cls: type, prefix: str, fields: StateReadPlan, helpers: dict[str, Any]
) -> Callable[..., Any]:
    """``read(raw, now, seen)``: the ``cls`` whose stored fields ``raw`` holds, read as
    ``fields`` say (keys named with ``prefix``); the others at their defaults. Data
    without exactly these keys goes to ``by_fields(raw, now)``. ``helpers`` holds what
    the code calls: ``by_fields``, ``read_turn``, ``fast_actions``, ``action_at``,
    ``plain`` and the names the tests use."""
    namespace = {**helpers, "cls": cls}
    lines = [
        "def read(raw, now, seen):",
        f"    if type(raw) is not dict or len(raw) != {len(fields)}:",
        "        return by_fields(raw, now)",
        "    try:",
        *(f"        v{i} = raw[{field[1]!r}]" for i, field in enumerate(fields)),
        "    except KeyError:",
        "        return by_fields(raw, now)",
    ]
    for i, (_, key, decode, relative, how, argument) in enumerate(fields):
        v, at = f"v{i}", prefix + key
        namespace[f"decode{i}"] = decode
        slow = f"decode{i}({v}, {at!r})"
        if how == "turn":
            lines.append(f"    {v} = None if {v} is None else read_turn({v}, now, seen)")
        elif how == "fast":
            namespace[f"fast{i}"] = argument
            lines += [f"    fast = fast{i}({v})", f"    {v} = {slow} if fast is None else fast"]
        elif how == "actions":
            lines += [
                f"    fast = fast_actions({v}, seen)",
                f"    {v} = [action_at(a, now, {at!r}) for a in {slow}] if fast is None else fast",
            ]
        elif how == "status":
            namespace[f"members{i}"] = argument
            lines += [
                f"    if {v} is not None:",
                f"        fast = members{i}.get({v}) if type({v}) is str else None",
                f"        {v} = {slow} if fast is None else fast",
            ]
        elif how == "test":
            lines += [f"    if not ({argument.format(v=v)}):", f"        {v} = {slow}"]
        elif how == "empty":
            shape, namespace[f"empty{i}"] = argument
            lines.append(f"    {v} = empty{i} if type({v}) is {shape} and not {v} else {slow}")
        else:
            lines.append(f"    {v} = {slow}")
        if relative:
            lines.append(f"    {v} = None if {v} is None else now - {v}")
    read = {field[0]: i for i, field in enumerate(fields)}
    lines.append(f"    return cls({_state_arguments(cls, read, namespace)})")
    filename = f"<read {cls.__name__}, from the state declaration>"
    return _compiled("\n".join(lines) + "\n", "read", filename, namespace)


def _state_arguments(cls: type, read: dict[str, int], namespace: dict[str, Any]) -> str:
    """The arguments that build a ``cls`` of the fields ``read`` into ``v0``, ``v1``...
    and the others at their defaults: by position (a call of some thirty keyword
    arguments costs several times one of as many positional ones)."""
    arguments = []
    for f in attrs.fields(cls):
        if f.name in read:
            arguments.append(f"v{read[f.name]}")
        elif isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
            namespace[f"make_{f.name}"] = f.default.factory
            arguments.append(f"make_{f.name}()")
        else:
            namespace[f"default_{f.name}"] = f.default
            arguments.append(f"default_{f.name}")
    return ", ".join(arguments)


StateWritePlan = Sequence[tuple[str, str, str, Any]]
"""(field, key, how, argument) of each stored field of a state class, in order:
``how`` is ``"relative"`` (a reading of the clock, written as the seconds before
``now``), ``"turn"``, ``"actions"``, ``"same"`` (the value as it is) or ``"encode"``
(``argument``: (the kind's encoder, the default's type when it is empty and encodes
as an empty list or dict, else ``None``, the type of that encoding))."""


def build_state_writer(
    cls: type,
    fields: StateWritePlan,
    head: tuple[str, int] | None,
    helpers: dict[str, Any],
) -> Callable[..., Any]:
    """``write(state, now)``: a ``cls`` as its snapshot's data, one dict display, each
    field written as ``fields`` say; with ``head`` (format, version),
    ``write(settings, state, now)``, those and ``settings_data(settings)`` first.
    ``helpers`` holds what the code calls: ``write_turn``, ``settings_data``,
    ``encode`` (an action), ``encode_action`` (a Finish, at ``now``), ``Finish``."""
    namespace = dict(helpers)
    items = []
    if head is not None:
        items += [f"'format': {head[0]!r}", f"'version': {head[1]!r}"]
        items.append("'settings': settings_data(settings)")
    for i, (name, key, how, argument) in enumerate(fields):
        read = f"state.{name}"
        if how == "relative":
            value = f"None if {read} is None else now - {read}"
        elif how == "turn":
            value = f"None if {read} is None else write_turn({read}, now)"
        elif how == "actions":
            value = (
                f"[encode(a) if type(a) is not Finish else encode_action(a, now) for a in {read}]"
            )
        elif how == "same":
            value = read
        else:
            namespace[f"encode{i}"], shape, literal = argument
            value = f"encode{i}({read})"
            if shape is not None:
                namespace[f"empty_type{i}"] = shape
                empty = "[]" if literal is list else "{}"
                value = f"{empty} if type({read}) is empty_type{i} and not {read} else {value}"
        items.append(f"{key!r}: {value}")
    arguments = "settings, state, now" if head is not None else "state, now"
    source = f"def write({arguments}):\n    return {{" + ", ".join(items) + "}\n"
    filename = f"<write {cls.__name__}, from the state declaration>"
    return _compiled(source, "write", filename, namespace)
