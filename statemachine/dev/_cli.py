"""The command line: ``python -m statemachine`` (or ``statemachine``).

One subcommand per tool of ``statemachine.dev``: ``simulate``, ``diagram``, ``check``,
``trace`` and ``vendor`` (``--help`` says what each does). Exit codes: 0 success; 1 a
scenario's expectations failed, or diagrams drifted (``diagram --check``), or the SVGs
could not be drawn under ``--require-svg`` (or ``trace`` needs ``dot`` for the
machine's SVG); 2 bad usage, a bad scenario or script file, a trace file this engine
cannot draw, or an output ``trace`` cannot write.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from .. import ConfigError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_SIMULATE_EPILOG = """\
A SCENARIO is a built-in name (see --list) or a path to a .toml file; with none,
every built-in runs. Each transition prints as a row: step (from 1 in its turn; the
--json field counts from 0, as the engine does), virtual time from the session's
start, state -> next state, the event (with "(auto)" for the WaitDone the simulator sends after a
Wait), the engine's action, the counters (att: attempt of the current call, ret:
session retries used, red: context reductions) and the row: the number of the
transition-table row that fired, as the table under the diagram numbers it
(diagrams/turn.svg, docs/machine.md), then that row's guards, the conditions that
chose it; a cell too long for its column is cut and ends in "..." (--json has it
whole). Under each turn: its status, its own cost and retries, and the session's
totals. The scenario file format and the built-ins: docs/simulate.md.
Exit status: 0 when every expectation held, 1 when one did not, 2 for a bad file.
"""


def _port(text: str) -> int:
    """A TCP port to listen on: 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="statemachine",
        description=(
            "A deterministic, sans-IO state machine for the error-recovery part of an "
            "LLM agent's turn loop. Try: statemachine simulate"
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    simulate = commands.add_parser(
        "simulate",
        help="run failure-storm scenarios through the engine and print their traces",
        description=(
            "Run scripted scenarios (rate-limit storms, overloads, context overflows, "
            "auth errors, crashing plugins, runaway sessions...) through the real "
            "engine on a virtual clock, and print each transition and the final "
            "turn and session statuses."
        ),
        epilog=_SIMULATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    simulate.add_argument("scenarios", nargs="*", metavar="SCENARIO")
    simulate.add_argument("--list", action="store_true", help="list the built-in scenarios")
    simulate.add_argument(
        "--json", action="store_true", help="print JSON lines: one per step, a summary per scenario"
    )
    simulate.add_argument(
        "--real-time", action="store_true", help="really sleep through the waits (for demos)"
    )
    simulate.add_argument(
        "--seed", type=int, metavar="N", help="jitter seed for every scenario (default: theirs)"
    )
    simulate.add_argument(
        "--spans",
        action="store_true",
        help=(
            "print instead the OpenTelemetry span tree a statemachine.otel.Telemetry "
            "observer makes of each run (needs opentelemetry-sdk)"
        ),
    )

    diagram = commands.add_parser(
        "diagram",
        help="draw the turn machine (dot, svg, mermaid) into diagrams/",
        description=(
            "Draw the turn machine from its transition table with transitions' "
            "GraphMachine: turn.dot, turn.svg, turn.mmd and one category-<name> view "
            "per model error category. Needs graphviz's `dot` for the SVGs only."
        ),
    )
    diagram.add_argument(
        "--out", type=Path, default=Path("diagrams"), metavar="DIR", help="default: diagrams"
    )
    diagram.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the files in DIR differ from what would be written",
    )
    diagram.add_argument(
        "--require-svg",
        action="store_true",
        help="exit 1 if `dot` is missing (by default the .dot and .mmd are still written)",
    )
    diagram.add_argument("--no-svg", action="store_true", help="write the .dot and .mmd only")
    diagram.add_argument(
        "--readme",
        type=Path,
        metavar="FILE",
        help="also put turn.mmd into the first ```mermaid block of FILE (e.g. README.md)",
    )

    traced = commands.add_parser(
        "trace",
        help="draw a recorded turn as a timeline and on the machine (svg, mermaid, html)",
        description=(
            "Draw a recorded trace (the JSON lines of `simulate --json`, or a file a "
            "TraceWriter observer wrote) as a timeline (model calls coloured by outcome, "
            "the waits with their seconds and source, tool calls, limits, the final "
            "status) and on the turn machine (the edges taken in bold, numbered, the steps "
            "in a table). Writes DIR/NAME-timeline.svg, NAME.svg (needs graphviz's `dot`), "
            "NAME.dot and NAME.mmd. A file cut off mid-line is drawn up to its last "
            "complete line, with a warning naming the line. A trace of another format "
            "version or engine table, with a step that is not a row of this engine's "
            "table, a malformed field or a Wait its settings do not allow, or an output "
            "that cannot be written, is refused (exit 2) naming the line or the path, and "
            "nothing is written."
        ),
    )
    traced.add_argument("file", type=Path, metavar="FILE")
    traced.add_argument(
        "--out", type=Path, default=Path(), metavar="DIR", help="default: the current directory"
    )
    traced.add_argument("--name", metavar="NAME", help="file stem (default: FILE's stem)")
    traced.add_argument("--scenario", metavar="NAME", help="the scenario to draw, if several")
    traced.add_argument("--turn", type=int, metavar="N", help="draw only turn N")
    traced.add_argument(
        "--html",
        type=Path,
        metavar="PAGE",
        help="also write one self-contained page: the timeline beside a clickable step list",
    )
    traced.add_argument("--no-svg", action="store_true", help="write the .dot and .mmd only")

    vendor = commands.add_parser(
        "vendor",
        help="serve a loopback model vendor (Anthropic and OpenAI wire formats) from a script",
        description=(
            "Answer the Anthropic Messages API (POST /v1/messages) and the OpenAI Chat "
            "Completions API (POST /v1/chat/completions) on 127.0.0.1 from a script, one "
            "scripted response per request, starting over when the script is used up; "
            "each answer is logged. Point the official SDKs at it with ANTHROPIC_BASE_URL "
            "and OPENAI_BASE_URL (the command prints both) to run an example offline."
        ),
        epilog=(
            "The default script answers each vendor with a 429 (retry-after: 1), an "
            "overload (529 / 503), a tool call (get_weather) and a final text. The "
            "script file format: docs/drivers.md (section 'Offline: the loopback "
            "vendor'). Exit status: 0 when interrupted, 2 for a bad script or a port "
            "that cannot be bound."
        ),
    )
    vendor.add_argument(
        "--script", type=Path, metavar="FILE", help="a TOML script (default: the built-in one)"
    )
    vendor.add_argument(
        "--port",
        type=_port,
        default=8765,
        metavar="N",
        help="the port on 127.0.0.1 (default: 8765; 0 picks a free one)",
    )

    commands.add_parser(
        "check",
        help="exhaustive model check of the machine (see `statemachine check --help`)",
        add_help=False,
    )
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); the exit code."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "check":
        return _check(args[1:], err)
    parser = _parser()
    try:
        options = parser.parse_args(args)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    command = _COMMANDS.get(options.command)
    if command is None:
        parser.print_help(out)
        return EXIT_USAGE
    return command(options, out, err)


def _check(argv: list[str], err: IO[str]) -> int:
    try:
        module = importlib.import_module("statemachine.dev.check")
    except ModuleNotFoundError as exc:
        if exc.name != "statemachine.dev.check":
            raise
        print(
            "statemachine check: the model checker (statemachine/dev/check/) is not "
            "part of this installation",
            file=err,
        )
        return EXIT_USAGE
    code: int = module.main(argv)
    return code


# -- vendor --------------------------------------------------------------------------


def _vendor(options: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from . import _vendor as vendor  # noqa: PLC0415 - http.server only for this command

    try:
        script = (
            vendor.parse_script(vendor.DEFAULT_SCRIPT, "the built-in script")
            if options.script is None
            else vendor.load_script(options.script)
        )
    except ConfigError as exc:
        print(f"statemachine vendor: {exc}", file=err)
        return EXIT_USAGE

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    try:
        vendor.serve(script, port=options.port, out=say)
    except OSError as exc:
        print(f"statemachine vendor: cannot listen on 127.0.0.1:{options.port}: {exc}", file=err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("stopped")
    return EXIT_OK


# -- diagram -------------------------------------------------------------------------


def _diagram(options: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from ._diagrams import (  # noqa: PLC0415 - graphviz is slow to import
        INSTALL_HINT,
        readme_with_diagram,
        write_diagrams,
    )

    done = write_diagrams(options.out, svg=not options.no_svg, check=options.check)
    readme_stale = False
    if options.readme is not None:
        try:
            text = options.readme.read_text(encoding="utf-8")
            updated = readme_with_diagram(text)
        except (OSError, ValueError) as exc:
            print(f"statemachine diagram: {options.readme}: {exc}", file=err)
            return EXIT_USAGE
        readme_stale = updated != text
        if readme_stale and not options.check:
            options.readme.write_text(updated, encoding="utf-8")
            print(f"wrote the mermaid block of {options.readme}", file=out)
    if options.check:
        if readme_stale:
            print(f"the mermaid block of {options.readme} differs from turn.mmd", file=err)
        if done.written or readme_stale:
            print("diagrams differ from the machine; regenerate them with:", file=err)
            readme = f" --readme {options.readme}" if options.readme else ""
            print(f"  python -m statemachine diagram --out {options.out}{readme}", file=err)
            for path in done.written:
                print(f"  differs: {path}", file=err)
            return EXIT_FAILED
        print(f"diagrams in {options.out} match the machine", file=out)
        return EXIT_OK
    for path in done.written:
        print(f"wrote {path}", file=out)
    if done.svg_missing:
        print(f"statemachine diagram: {INSTALL_HINT}", file=err)
        print("the .dot and .mmd files were written; the .svg files were not", file=err)
        return EXIT_FAILED if options.require_svg else EXIT_OK
    return EXIT_OK


# -- trace ---------------------------------------------------------------------------


def _trace(options: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from ..io._trace_file import TraceFileError, load_trace  # noqa: PLC0415
    from ._diagrams import INSTALL_HINT, DotMissing, render_svg  # noqa: PLC0415
    from ._trace_draw import draw, html_page  # noqa: PLC0415

    try:
        trace = load_trace(options.file)
        drawing = draw(trace, scenario=options.scenario, turn=options.turn)
    except TraceFileError as exc:
        print(f"statemachine trace: {exc}", file=err)
        return EXIT_USAGE
    if trace.cut is not None:
        print(
            f"statemachine trace: warning: {options.file}:{trace.cut}: the file ends inside "
            f"this line (cut off mid-write?); drawn up to line {trace.cut - 1}",
            file=err,
        )
    name = options.name or options.file.stem
    problem = _output_problem(options, name)
    if problem is not None:
        print(f"statemachine trace: {problem}", file=err)
        return EXIT_USAGE
    files: dict[Path, str] = {
        options.out / f"{name}.dot": drawing.dot,
        options.out / f"{name}.mmd": drawing.mermaid,
    }
    if not options.no_svg:
        try:
            files[options.out / f"{name}.svg"] = render_svg(drawing.dot, name)
        except DotMissing:
            print(f"statemachine trace: {INSTALL_HINT}", file=err)
            return EXIT_FAILED
        files[options.out / f"{name}-timeline.svg"] = drawing.timeline
    if options.html is not None:
        files[options.html] = html_page(drawing)
    try:
        _write_all(files, options.out)
    except OSError as exc:
        where = exc.filename or options.out
        print(f"statemachine trace: cannot write {where}: {exc.strerror or exc}", file=err)
        return EXIT_USAGE
    for path in files:
        print(f"wrote {path}", file=out)
    print(drawing.title, file=out)
    return EXIT_OK


def _output_problem(options: argparse.Namespace, name: str) -> str | None:
    """Why the outputs cannot be written where asked, checked before anything is."""
    if not name or Path(name).name != name or name in (".", ".."):
        return f"--name {name!r}: must be a file stem, not a path"
    for parent in (options.out, *options.out.parents):
        if parent.exists():
            if not parent.is_dir():
                return f"--out {options.out}: {parent} is not a directory"
            break
    if options.html is not None:
        page: Path = options.html
        if page.is_dir():
            return f"--html {page}: is a directory"
        if not page.parent.is_dir():
            return f"--html {page}: its directory {page.parent} does not exist"
    return None


def _write_all(files: dict[Path, str], out_dir: Path) -> None:
    """Write every file under a temporary name beside it, then rename them all: on an
    error nothing is left behind (temporary files removed, a directory made for them
    removed again)."""
    made = [d for d in (out_dir, *out_dir.parents) if not d.exists()]
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        for path, text in files.items():
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            written.append(temporary)
            with open(temporary, "x", encoding="utf-8", newline="") as handle:
                handle.write(text)
        for temporary, path in zip(written, files, strict=True):
            temporary.replace(path)
    except OSError:
        for temporary in written:
            temporary.unlink(missing_ok=True)
        for directory in made:  # the innermost first
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise


# -- simulate ------------------------------------------------------------------------


class _Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, stream: IO[str], total: int) -> None:
        self.stream = stream
        self.total = total
        self.shown = False
        self.enabled = total > 1 and stream.isatty()

    def draw(self, done: int, name: str) -> None:
        if not self.enabled:
            return
        width = 24
        filled = width * done // self.total
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total} {name}\x1b[K")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def _simulate(options: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from . import _simulate as sim  # noqa: PLC0415
    from ._scenarios import Scenario, builtin, builtin_names, load  # noqa: PLC0415

    if options.list:
        for name in builtin_names():
            print(f"{name:<32} {builtin(name).description}", file=out)
        return EXIT_OK
    scenarios: list[Scenario] = []
    try:
        for item in options.scenarios or builtin_names():
            if item.endswith(".toml") or "/" in item or Path(item).is_file():
                scenarios.append(load(item))
            else:
                scenarios.append(builtin(item))
    except ConfigError as exc:
        print(f"statemachine simulate: {exc}", file=err)
        return EXIT_USAGE

    if options.spans:
        return _spans(scenarios, out, err)
    progress = _Progress(err, len(scenarios))

    def write(line: str) -> None:
        progress.clear()
        print(line, file=out, flush=options.real_time)

    failed = 0
    for done, scenario in enumerate(scenarios):
        progress.draw(done, scenario.name)
        seed = scenario.seed if options.seed is None else options.seed
        on_step = _json_printer(write) if options.json else _text_printer(write, scenario)
        if not options.json:
            write(sim.format_scenario_header(scenario, seed))
        result = sim.run(
            scenario,
            seed=options.seed,
            on_step=on_step,
            sleep=time.sleep if options.real_time else None,
        )
        if options.json:
            write(json.dumps(sim.result_json(result), sort_keys=True))
        else:
            write(sim.format_result(result))
            write("")
        if not result.ok:
            failed += 1
    progress.clear()
    if not options.json:
        verdict = "all expectations held" if not failed else f"{failed} FAILED"
        write(f"{len(scenarios)} scenario(s): {verdict}")
    return EXIT_FAILED if failed else EXIT_OK


def _spans(scenarios: Sequence[Any], out: IO[str], err: IO[str]) -> int:
    try:
        from ._telemetry_docs import run_span_tree  # noqa: PLC0415 - needs OpenTelemetry

        for scenario in scenarios:
            print(f"== {scenario.name}", file=out)
            print(run_span_tree(scenario), end="", file=out)
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("opentelemetry"):
            raise
        print(
            f"statemachine simulate --spans: needs the OpenTelemetry API and SDK ({exc.name} "
            "is missing): pip install -e '.[otel]' opentelemetry-sdk",
            file=err,
        )
        return EXIT_USAGE
    return EXIT_OK


def _text_printer(write: Callable[[str], None], scenario: Any) -> Callable[[Any], None]:
    from .. import Finish  # noqa: PLC0415
    from . import _simulate as sim  # noqa: PLC0415

    columns = sim.layout_for(scenario)
    current: list[int] = []

    def on_step(record: sim.StepRecord) -> None:
        if current != [record.turn]:
            current[:] = [record.turn]
            write(sim.format_turn_header(record, columns))
        write(sim.format_step(record, columns))
        if isinstance(record.action, Finish):
            write(sim.format_turn_end(record))

    return on_step


def _json_printer(write: Callable[[str], None]) -> Callable[[Any], None]:
    from . import _simulate as sim  # noqa: PLC0415

    def on_step(record: sim.StepRecord) -> None:
        write(json.dumps(sim.step_json(record), sort_keys=True))

    return on_step


_COMMANDS: dict[str, Callable[[argparse.Namespace, IO[str], IO[str]], int]] = {
    "simulate": _simulate,
    "diagram": _diagram,
    "trace": _trace,
    "vendor": _vendor,
}
"""Each subcommand but ``check`` (which parses its own arguments), by name."""
