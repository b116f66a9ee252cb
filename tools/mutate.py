"""A small mutation runner: are the tests strong enough to notice a wrong line?

``python -m tools.mutate [--module PATH ...] [--sample N --seed S] [--tests "A B"]
[--timeout SECONDS] [--jobs J] [--mutant I,J] [--list] [--min-score P]``

For each target module it parses the source with :mod:`ast` and generates mutants:

* comparison operators flipped (``<`` -> ``>=``) or made strict/non-strict
  (``<`` -> ``<=``), ``==``/``!=``, ``in``/``not in``, ``is``/``is not`` swapped;
* arithmetic and bitwise operators swapped (``+``/``-``, ``*``/``/``, ``<<``/``>>``...),
  in expressions and in augmented assignments;
* boolean ``and``/``or`` swapped, ``not`` removed;
* integer and float constants replaced by ``c + 1``, ``c - 1`` and ``0``;
* in module-level tables (a dict, tuple, list, set or ``frozenset(...)`` assigned at
  module level): every string constant changed, every entry dropped;
* ``return <boolean expression>`` negated;
* whole ``if`` (and ``x if c else y``) conditions forced ``True`` and ``False``;
* inside a function, a simple statement (an expression, an assignment, ``return``,
  ``raise``, ``del``, ``assert``) deleted (replaced by ``pass``);
* two neighbouring positional arguments of a call swapped (when they differ).

Annotations, docstrings and ``__all__`` are never mutated. Each mutant is one textual
splice of the original source (the rest of the file is byte-for-byte the same). The
mutants of a module are numbered in a fixed order, so ``--sample N --seed S`` always
picks the same ones and ``--mutant I`` re-runs one by its number.

A mutant is run in a *workspace*: a copy of the repository (the package, the tests,
the specs) in a temporary directory, with the mutated file written over the copy's.
The chosen tests run there in a subprocess (``python -m pytest -p no:cacheprovider -x
-q``, the workspace as the working directory and first on ``PYTHONPATH``, bytecode
writing off so no stale ``.pyc`` can hide a mutant); before any mutant the runner
checks that the workspace's package is the one imported and that the unmutated tests
pass. A mutant is *killed* when the tests fail or time out, and *survives* when they
pass.

The report gives, per module, the mutants generated, run, killed and survived, the
score (killed / run) and each survivor as ``file:line``, the mutation and the source
line. The exit status is 0 unless ``--min-score P`` is given and a module scored
below ``P`` percent (or a module's baseline failed).
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

DEFAULT_MODULES = (
    "statemachine/core/_backoff.py",
    "statemachine/core/_retry_after.py",
    "statemachine/core/_table.py",
)

_VALUES = (
    "tests/test_engine.py",
    "tests/test_state.py",
    "tests/test_snapshot.py",
    "tests/test_boundary.py",
)
"""The tests of the value types (events, actions, errors, usage): built, checked, sent
and restored."""
_STORE = (
    "tests/test_store.py",
    "tests/test_journal.py",
    "tests/test_boundary.py",
)
"""The store's tests (the worker, its journal and records), the Redis one aside."""
_DRIVERS = (
    "tests/test_drivers.py",
    "tests/test_spec_family.py",
    "tests/test_boundary.py",
)
"""The drivers' tests (the turn loop, the providers, the tool router)."""

DEFAULT_TESTS: dict[str, tuple[str, ...]] = {
    "statemachine/core/_backoff.py": ("tests/test_backoff.py",),
    "statemachine/core/_retry_after.py": ("tests/test_backoff.py", "tests/test_classify.py"),
    "statemachine/core/_table.py": (
        "tests/test_table.py",
        "tests/test_engine.py",
        "tests/test_state.py",
        "tests/test_diagrams.py",
        # the guards' and effects' texts are rendered into specs/table.md
        "tests/test_check.py::test_table_md_is_generated_from_the_compiled_table",
    ),
    "statemachine/core/_engine.py": (
        "tests/test_engine.py",
        "tests/test_state.py",
        "tests/test_backoff.py",
        "tests/test_table.py",
        # the spec family's reactions (breaker windows, denials, conflicts, bounds)
        "tests/test_spec_family.py",
        "tests/test_family.py",
        # the session's owner (spend, bounds, children, end) lives here too
        "tests/test_snapshot.py",
        "tests/test_mutation_session.py",
        # a guard runs as written out in _trials.py (mutated there, against the tests
        # above): changed here, it must be written out again
        "tests/test_engine_build.py::test_the_written_out_trials_are_what_the_command_writes",
        # the real table runs those trials, a mutated one tries its rows
        "tests/test_engine_build.py::test_the_table_runs_its_written_out_trials_and_a_mutated_one_tries_its_rows",
    ),
    "statemachine/core/_trials.py": (
        "tests/test_engine.py",
        # not the check that the file is current: it would kill every mutant unread
        "tests/test_engine_build.py::test_each_groups_trial_chooses_as_trying_its_rows_in_order_does",
        "tests/test_table.py",
        "tests/test_spec_family.py",
        "tests/test_family.py",
    ),
    "statemachine/core/_state.py": (
        "tests/test_state.py",
        "tests/test_engine.py",
        "tests/test_snapshot.py",
        "tests/test_store.py",
    ),
    "statemachine/core/_state_text.py": (
        "tests/test_snapshot.py",
        "tests/test_store.py",
        "tests/test_journal.py",
        "tests/test_mutation_state.py",
    ),
    "statemachine/core/_session.py": (
        "tests/test_engine.py",
        "tests/test_snapshot.py",
        "tests/test_spec_family.py",
        "tests/test_state.py",
    ),
    "statemachine/core/_snapshot.py": ("tests/test_snapshot.py", "tests/test_boundary.py"),
    "statemachine/core/_settings.py": ("tests/test_settings.py",),
    "statemachine/core/_reachable.py": (
        "tests/test_snapshot.py",
        "tests/test_state.py",
        "tests/test_mutation_state.py",
        "tests/test_boundary.py",
    ),
    "statemachine/core/_actions.py": _VALUES,
    "statemachine/core/_events.py": _VALUES,
    "statemachine/core/_tool_calls.py": _VALUES,
    "statemachine/core/_model_error.py": (*_VALUES, "tests/test_classify.py"),
    "statemachine/core/_usage.py": (*_VALUES, "tests/test_provider_usage.py"),
    "statemachine/core/_json_data.py": (*_VALUES, "tests/test_classify.py"),
    "statemachine/core/_exceptions.py": _VALUES,
    "statemachine/core/_taxonomy.py": (*_VALUES, "tests/test_table.py"),
    "statemachine/core/_trace.py": (
        "tests/test_engine.py",
        "tests/test_boundary.py",
        "tests/test_otel.py",
        "tests/test_trace_draw.py",
    ),
    "statemachine/core/_codec.py": (
        "tests/test_snapshot.py",
        "tests/test_journal.py",
        "tests/test_store.py",
        "tests/test_boundary.py",
    ),
    "statemachine/core/_builder.py": (
        "tests/test_engine_build.py",
        "tests/test_state.py",
        "tests/test_snapshot.py",
        "tests/test_store.py",
        "tests/test_journal.py",
        "tests/test_engine.py",
    ),
    "statemachine/core/_machine.py": ("tests/test_table.py", "tests/test_diagrams.py"),
    "statemachine/store/_worker.py": (*_STORE, "tests/test_store_ending.py"),
    "statemachine/store/_held.py": (*_STORE, "tests/test_journal_fast.py"),
    "statemachine/store/_spend.py": _STORE,
    "statemachine/store/_memory.py": _STORE,
    "statemachine/store/_journal.py": _STORE,
    "statemachine/store/_record.py": (*_STORE, "tests/test_journal_fast.py"),
    "statemachine/store/_bytes.py": _STORE,
    "statemachine/store/_core.py": _STORE,
    "statemachine/store/_errors.py": _STORE,
    "statemachine/store/_ending.py": ("tests/test_store_ending.py",),
    "statemachine/store/_redis.py": ("tests/test_store_redis.py",),
    "statemachine/store/_redis_cluster.py": ("tests/test_store_redis_cluster.py",),
    "statemachine/io/_drivers.py": _DRIVERS,
    # the drive shows its provider to the telemetry (provider_model)
    "statemachine/io/_loop.py": (*_DRIVERS, "tests/test_mutation_engine.py", "tests/test_otel_provider.py"),
    "statemachine/io/_providers.py": (
        *_DRIVERS,
        "tests/test_provider_usage.py",
        "tests/test_stream_usage.py",
    ),
    "statemachine/io/_stream_usage.py": ("tests/test_stream_usage.py",),
    "statemachine/io/_router.py": _DRIVERS,
    "statemachine/io/_mcp.py": ("tests/test_mcp_crash.py",),
    "statemachine/io/_procwatch.py": ("tests/test_mcp_crash.py",),
    "statemachine/io/_otel.py": (
        "tests/test_otel.py",
        "tests/test_otel_docs.py",
        "tests/test_otel_genai.py",
        "tests/test_otel_provider.py",
    ),
    "statemachine/io/_trace_file.py": (
        "tests/test_trace_draw.py",
        "tests/test_simulate.py",
        "tests/test_boundary.py",
    ),
    "statemachine/io/_temporal.py": ("tests/test_temporal.py", "tests/test_temporal_check.py"),
    "statemachine/io/_temporal_replay.py": (
        "tests/test_temporal.py",
        "tests/test_temporal_check.py",
    ),
    "statemachine/io/_classify.py": (
        "tests/test_classify.py",
        "tests/test_corpus.py",
        "tests/test_classification_rows.py",
        # the wording families of issue 28: held-out vendors, AWS errors, stream headers
        "tests/test_classify_families.py",
    ),
    "statemachine/integrations/_bridge.py": (
        "tests/test_integration_bridge.py",
        "tests/test_integration_pydantic_ai.py",
        "tests/test_integration_openai_agents.py",
    ),
    "statemachine/integrations/pydantic_ai.py": (
        "tests/test_integration_pydantic_ai.py",
        "tests/test_stream_usage.py",
    ),
    "statemachine/integrations/openai_agents.py": (
        "tests/test_integration_openai_agents.py",
        "tests/test_stream_usage.py",
    ),
}
"""The fast tests (files or node IDs) that exercise each module of the engine, the
store and the I/O layer; the slow suites (stateful, SDK end-to-end, the whole model
check) are never defaults, and a module that talks to a service (Redis, Temporal, an
MCP server) gets the tests that start one."""

FALLBACK_TESTS: tuple[str, ...] = (
    "tests/test_backoff.py",
    "tests/test_engine.py",
    "tests/test_table.py",
    "tests/test_state.py",
    "tests/test_snapshot.py",
    "tests/test_settings.py",
    "tests/test_classify.py",
)
"""The tests for a module with no entry in ``DEFAULT_TESTS``."""

_COPIED_EXCLUDE = shutil.ignore_patterns(
    ".*", "__pycache__", "*.egg-info", "*.pyc", "build", "dist", "htmlcov"
)

_COMPARE_SWAPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], ...]] = {
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.BitXor: ast.BitOr,
}
_SYMBOLS: dict[type[ast.AST], str] = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.And: "and",
    ast.Or: "or",
}
_BOOLEAN_CALLS = frozenset({"isinstance", "issubclass", "any", "all", "callable", "hasattr"})
_TABLE_TYPES = (ast.Dict, ast.Tuple, ast.List, ast.Set)


@dataclass(frozen=True)
class Mutant:
    """One mutation: the bytes ``start:end`` of the module's source become ``replacement``."""

    module: str
    number: int
    line: int
    description: str
    start: int
    end: int
    replacement: str

    def apply(self, source: bytes) -> bytes:
        """The mutated source."""
        return source[: self.start] + self.replacement.encode() + source[self.end :]

    def source_line(self, source: bytes) -> str:
        """The original source line the mutation is on."""
        lines = source.decode().splitlines()
        return lines[self.line - 1].strip() if 0 < self.line <= len(lines) else ""


@dataclass
class Outcome:
    """What running the tests against one mutant gave."""

    mutant: Mutant
    killed: bool
    reason: str
    seconds: float


@dataclass
class ModuleReport:
    """The result of mutating one module."""

    module: str
    generated: int
    outcomes: list[Outcome] = field(default_factory=list)
    tests: tuple[str, ...] = ()
    seconds: float = 0.0
    error: str | None = None

    @property
    def run(self) -> int:
        """Mutants run."""
        return len(self.outcomes)

    @property
    def killed(self) -> int:
        """Mutants the tests caught."""
        return sum(1 for o in self.outcomes if o.killed)

    @property
    def survivors(self) -> list[Outcome]:
        """Mutants the tests passed on."""
        return [o for o in self.outcomes if not o.killed]

    @property
    def score(self) -> float:
        """Killed / run, in percent (100 when nothing ran)."""
        return 100.0 * self.killed / self.run if self.run else 100.0


# -- generation ------------------------------------------------------------------------


class _Offsets:
    """Byte offsets of (line, column) positions, as ``ast`` reports them."""

    def __init__(self, source: bytes) -> None:
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self.starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
        end = self.starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        return start, end


def _excluded_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes never mutated: annotations, docstrings, f-strings, ``__all__``."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            roots.append(node.returns)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            roots.append(node)  # docstrings, attribute docstrings
        elif isinstance(node, ast.JoinedStr) or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        ):
            roots.append(node)
    return {id(sub) for root in roots for sub in ast.walk(root)}


def _tables(tree: ast.Module) -> list[ast.expr]:
    """The module-level table literals (dict, tuple, list, set, ``frozenset(...)``)."""
    found: list[ast.expr] = []
    for statement in tree.body:
        value = statement.value if isinstance(statement, ast.Assign | ast.AnnAssign) else None
        if value is None:
            continue
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in {"frozenset", "tuple", "dict", "set"}
            and len(value.args) == 1
            and isinstance(value.args[0], _TABLE_TYPES)
        ):
            value = value.args[0]
        if isinstance(value, _TABLE_TYPES):
            found.append(value)
    return found


_DELETABLE = (
    ast.Expr,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Return,
    ast.Raise,
    ast.Delete,
    ast.Assert,
)


def _function_statements(tree: ast.Module) -> set[int]:
    """ids of the simple statements inside function bodies (at any depth of their
    blocks): the ones a deletion mutant may remove. Module- and class-level statements
    are left alone (deleting one mostly breaks the import: a mutant no test needs)."""
    found: set[int] = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        blocks: list[list[ast.stmt]] = [function.body]
        while blocks:
            for statement in blocks.pop():
                if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue  # its own body is walked as a function of its own
                if isinstance(statement, _DELETABLE) and not (
                    isinstance(statement, ast.AnnAssign) and statement.value is None
                ):
                    found.add(id(statement))
                for name in ("body", "orelse", "finalbody"):
                    block = getattr(statement, name, None)
                    if isinstance(block, list):
                        blocks.append(block)
                blocks.extend(handler.body for handler in getattr(statement, "handlers", ()))
                blocks.extend(case.body for case in getattr(statement, "cases", ()))
    return found


def _is_boolean(node: ast.expr) -> bool:
    if isinstance(node, ast.Compare | ast.BoolOp):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return True
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _BOOLEAN_CALLS
    )


def _number_variants(value: float) -> list[float]:
    variants: list[float] = []
    for candidate in (value + 1, value - 1, type(value)(0)):
        if candidate != value and candidate not in variants:
            variants.append(candidate)
    return variants


def _drop_entry(table: ast.expr, index: int) -> ast.expr:
    clone = copy.deepcopy(table)
    if isinstance(clone, ast.Dict):
        del clone.keys[index]
        del clone.values[index]
    elif isinstance(clone, ast.Tuple | ast.List | ast.Set):
        del clone.elts[index]
        if isinstance(clone, ast.Set) and not clone.elts:
            return ast.Call(ast.Name("set", ast.Load()), [], [])
    return clone


def _entries(table: ast.expr) -> list[ast.AST]:
    if isinstance(table, ast.Dict):
        return [k if k is not None else v for k, v in zip(table.keys, table.values, strict=True)]
    if isinstance(table, ast.Tuple | ast.List | ast.Set):
        return list(table.elts)
    return []


def _short(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mutations_of(
    node: ast.AST, table_strings: set[int], tables: set[int], statements: set[int]
) -> Iterator[tuple[ast.AST, ast.AST, str, bool]]:
    """(target, replacement, description, is-an-expression) for each mutant of ``node``."""
    if id(node) in statements:
        yield node, ast.Pass(), f"statement deleted: `{_short(node)}`", False
    if isinstance(node, ast.Call):
        args = node.args
        for i in range(len(args) - 1):
            first, second = args[i], args[i + 1]
            if isinstance(first, ast.Starred) or isinstance(second, ast.Starred):
                continue
            if ast.dump(first) == ast.dump(second):
                continue
            swapped = copy.deepcopy(node)
            swapped.args[i], swapped.args[i + 1] = swapped.args[i + 1], swapped.args[i]
            description = f"arguments {i + 1} and {i + 2} swapped: `{_short(node, 50)}`"
            yield node, swapped, description, True
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            for swap in _COMPARE_SWAPS.get(type(op), ()):
                new = copy.deepcopy(node)
                new.ops[i] = swap()
                yield node, new, f"`{_SYMBOLS[type(op)]}` -> `{_SYMBOLS[swap]}`", True
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BINOP_SWAPS:
        swap_op = _BINOP_SWAPS[type(node.op)]
        new_op = copy.deepcopy(node)
        new_op.op = swap_op()
        suffix = "=" if isinstance(node, ast.AugAssign) else ""
        description = f"`{_SYMBOLS[type(node.op)]}{suffix}` -> `{_SYMBOLS[swap_op]}{suffix}`"
        yield node, new_op, description, isinstance(node, ast.BinOp)
    elif isinstance(node, ast.BoolOp):
        new_bool = copy.deepcopy(node)
        new_bool.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield (
            node,
            new_bool,
            f"`{_SYMBOLS[type(node.op)]}` -> `{_SYMBOLS[type(new_bool.op)]}`",
            True,
        )
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield node, node.operand, f"`not` removed from `{_short(node)}`", True
    elif (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        for value in _number_variants(node.value):
            yield node, ast.Constant(value), f"constant {node.value!r} -> {value!r}", True
    elif (
        isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) in table_strings
    ):
        changed = f"{node.value}_mutant" if node.value else "mutant"
        yield node, ast.Constant(changed), f"table string {node.value!r} -> {changed!r}", True
    elif isinstance(node, ast.Return) and node.value is not None and _is_boolean(node.value):
        negated = ast.UnaryOp(ast.Not(), node.value)
        yield node.value, negated, f"return negated: `not ({_short(node.value)})`", True
    elif isinstance(node, ast.If | ast.IfExp):
        for forced in (True, False):
            description = f"condition `{_short(node.test)}` forced {forced}"
            yield node.test, ast.Constant(forced), description, True
    if id(node) in tables and isinstance(node, ast.expr):
        for i, entry in enumerate(_entries(node)):
            yield entry, _drop_entry(node, i), f"table entry dropped: `{_short(entry)}`", True


def generate(module: str, source: bytes) -> list[Mutant]:
    """Every mutant of ``source`` (the file ``module``), in source order."""
    tree = ast.parse(source)
    offsets = _Offsets(source)
    excluded = _excluded_nodes(tree)
    table_strings: set[int] = set()
    tables: dict[int, ast.expr] = {}
    for table in _tables(tree):
        tables[id(table)] = table
        for sub in ast.walk(table):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                table_strings.add(id(sub))

    statements = _function_statements(tree)
    found: list[tuple[int, int, int, str, str]] = []  # (line, start, end, text, description)
    for node in ast.walk(tree):
        if id(node) in excluded:
            continue
        mutations = _mutations_of(node, table_strings, set(tables), statements)
        for target, new, description, expression in mutations:
            line = target.lineno  # type: ignore[attr-defined]
            # a dropped entry rewrites the whole table without it
            start, end = offsets.span(node if description.startswith("table entry") else target)
            text = f"({ast.unparse(new)})" if expression else ast.unparse(new)
            found.append((line, start, end, text, description))
    found.sort(key=lambda f: (f[0], f[1]))

    mutants: list[Mutant] = []
    for line, start, end, text, description in found:
        mutated = source[:start] + text.encode() + source[end:]
        try:
            compile(mutated, module, "exec")
        except SyntaxError:
            continue
        mutants.append(Mutant(module, len(mutants), line, description, start, end, text))
    return mutants


def select(
    mutants: Sequence[Mutant],
    sample: int | None = None,
    seed: int = 0,
    numbers: Sequence[int] | None = None,
) -> list[Mutant]:
    """The mutants to run: the listed ``numbers``, else a seeded sample, else all."""
    if numbers is not None:
        by_number = {m.number: m for m in mutants}
        return [by_number[n] for n in numbers if n in by_number]
    if sample is None or sample >= len(mutants):
        return list(mutants)
    chosen = random.Random(seed).sample(range(len(mutants)), sample)
    return [mutants[i] for i in sorted(chosen)]


# -- running ---------------------------------------------------------------------------


def default_tests(module: str) -> tuple[str, ...]:
    """The fast tests for ``module``, after its ``tests/test_mutation_<name>.py`` if any
    (first: its tests are aimed at the module's mutants, so a kill comes sooner under
    ``-x``)."""
    tests = DEFAULT_TESTS.get(module, FALLBACK_TESTS)
    extra = REPO / "tests" / f"test_mutation_{Path(module).stem.lstrip('_')}.py"
    if extra.exists():
        tests = (f"tests/{extra.name}", *(t for t in tests if t != f"tests/{extra.name}"))
    return tests


def make_workspace(root: Path) -> Path:
    """A copy of the repository's working files under ``root`` (no git, no caches)."""
    workspace = Path(tempfile.mkdtemp(prefix="mutate-", dir=root))
    for entry in sorted(REPO.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, workspace / entry.name, ignore=_COPIED_EXCLUDE)
        else:
            shutil.copy2(entry, workspace / entry.name)
    return workspace


def _environment(workspace: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(workspace), env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    for name in [name for name in env if name.startswith("PYTEST_XDIST_")]:
        del env[name]  # run from an xdist worker, the inner pytest is not one
    return env


def _run(command: Sequence[str], workspace: Path, timeout: float) -> tuple[int | None, str]:
    """The exit status (``None`` on a timeout) and the output's tail."""
    with subprocess.Popen(  # noqa: S603 - our own interpreter and pytest, no shell
        command,
        cwd=workspace,
        env=_environment(workspace),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    ) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return None, "timeout"
    text = output.decode(errors="replace").strip().splitlines()
    return process.returncode, text[-1] if text else ""


def check_workspace(workspace: Path) -> None:
    """Raise unless the workspace's own ``statemachine`` is what its subprocesses import."""
    code = "import statemachine, sys; sys.stdout.write(statemachine.__file__)"
    status, imported = _run([sys.executable, "-c", code], workspace, 60)
    expected = workspace / "statemachine" / "__init__.py"
    if status != 0 or Path(imported).resolve() != expected.resolve():
        raise RuntimeError(f"the workspace's package is not the one imported: {imported}")


def pytest_command(tests: Sequence[str]) -> list[str]:
    """The test command run against each mutant."""
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-x", "-q", *tests]


def run_module(
    module: str,
    *,
    tests: Sequence[str] | None = None,
    sample: int | None = None,
    seed: int = 0,
    numbers: Sequence[int] | None = None,
    timeout: float | None = None,
    jobs: int = 1,
    progress: Callable[[Outcome], None] | None = None,
) -> ModuleReport:
    """Mutate ``module`` (a path relative to the repository) and run the tests on each."""
    started = time.monotonic()
    source = (REPO / module).read_bytes()
    mutants = generate(module, source)
    chosen = select(mutants, sample, seed, numbers)
    test_files = tuple(tests) if tests else default_tests(module)
    report = ModuleReport(module, len(mutants), tests=test_files)
    command = pytest_command(test_files)
    with tempfile.TemporaryDirectory(prefix="mutate-") as scratch:
        workspaces: queue.Queue[Path] = queue.Queue()
        for _ in range(max(1, min(jobs, len(chosen)))):
            workspaces.put(make_workspace(Path(scratch)))
        first = workspaces.queue[0]
        check_workspace(first)
        baseline_started = time.monotonic()
        status, tail = _run(command, first, timeout or 600)
        baseline = time.monotonic() - baseline_started
        if status != 0:
            report.error = f"the unmutated tests fail in the workspace: {tail}"
            report.seconds = time.monotonic() - started
            return report
        limit = timeout or max(30.0, 5 * baseline)

        def one(mutant: Mutant) -> Outcome:
            workspace = workspaces.get()
            target = workspace / module
            try:
                target.write_bytes(mutant.apply(source))
                began = time.monotonic()
                code, last = _run(command, workspace, limit)
                seconds = time.monotonic() - began
            finally:
                target.write_bytes(source)
                workspaces.put(workspace)
            if code is None:
                outcome = Outcome(mutant, True, "timeout", seconds)
            else:
                outcome = Outcome(mutant, code != 0, last, seconds)
            if progress is not None:
                progress(outcome)
            return outcome

        with ThreadPoolExecutor(max_workers=workspaces.qsize()) as pool:
            report.outcomes = list(pool.map(one, chosen))
    report.seconds = time.monotonic() - started
    return report


# -- reporting -------------------------------------------------------------------------


def format_report(report: ModuleReport, source: bytes) -> Iterator[str]:
    """The report's lines."""
    if report.error:
        yield f"{report.module}: ERROR {report.error}"
        return
    yield (
        f"{report.module}: generated {report.generated}, run {report.run}, "
        f"killed {report.killed}, survived {len(report.survivors)}, "
        f"score {report.score:.1f}% ({report.seconds:.1f} s; tests: {' '.join(report.tests)})"
    )
    for outcome in report.survivors:
        mutant = outcome.mutant
        yield (
            f"  SURVIVED #{mutant.number} {mutant.module}:{mutant.line}  {mutant.description}"
            f"  | {mutant.source_line(source)}"
        )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.mutate", description=__doc__)
    parser.add_argument(
        "--module",
        action="append",
        help="a module to mutate, relative to the repository (repeatable); "
        f"default: {' '.join(DEFAULT_MODULES)}",
    )
    parser.add_argument("--sample", type=int, help="run a seeded sample of N mutants per module")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--mutant", help="comma-separated mutant numbers to run (one module only)")
    parser.add_argument("--tests", help="space-separated test files (default: per module)")
    parser.add_argument(
        "--timeout", type=float, help="seconds per mutant (default: 5x the baseline, >= 30)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="mutants run in parallel")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--verbose", action="store_true", help="print every mutant's outcome")
    parser.add_argument("--min-score", type=float, help="exit 1 if a module scores below P percent")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    args = _parse(argv)
    modules = args.module or list(DEFAULT_MODULES)
    numbers = [int(n) for n in args.mutant.split(",")] if args.mutant else None
    tests = args.tests.split() if args.tests else None
    failed = False
    for module in modules:
        source = (REPO / module).read_bytes()
        if args.list:
            for mutant in select(generate(module, source), args.sample, args.seed, numbers):
                print(
                    f"#{mutant.number} {module}:{mutant.line}  {mutant.description}"
                    f"  | {mutant.source_line(source)}"
                )
            continue

        def progress(outcome: Outcome) -> None:
            if args.verbose:
                verdict = "killed" if outcome.killed else "SURVIVED"
                mutant = outcome.mutant
                print(
                    f"  #{mutant.number} {verdict} ({outcome.seconds:.1f} s) line "
                    f"{mutant.line}: {mutant.description}",
                    flush=True,
                )

        report = run_module(
            module,
            tests=tests,
            sample=args.sample,
            seed=args.seed,
            numbers=numbers,
            timeout=args.timeout,
            jobs=args.jobs,
            progress=progress,
        )
        for line in format_report(report, source):
            print(line, flush=True)
        if report.error or (args.min_score is not None and report.score < args.min_score):
            failed = True
    return 1 if failed and args.min_score is not None else 0


if __name__ == "__main__":
    sys.exit(main())
