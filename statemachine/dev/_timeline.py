"""A recorded turn as a timeline: what an on-call engineer reads first.

Time runs left to right on the session's clock, t = 0 at its first recorded step (the
subtitle gives its wall-clock time when known): linear, except that no step is drawn
closer than a few pixels to the one before, with ticks at their true times. Lanes: the
*model* calls (a bar per attempt, coloured by outcome, named with the model when it
changes), the *waits* (their seconds and where they came from:
:data:`RETRY_AFTER_SOURCES`, or the engine's backoff) and the *tools* rounds (crashes
marked). Vertical lines mark turn starts, limits, breaker trips and final statuses; under
the axis runs the path on the machine. The SVG is :data:`WIDTH` px wide at scale 1, no
text smaller than :data:`SMALLEST_FONT_PX`. Steps are named by :func:`step_name`; every
item carries ``data-step`` (the step a click selects) and a class ``sN`` per step it
belongs to, so a page can link items and the step list.
"""

from __future__ import annotations

import datetime
import itertools
import math
import textwrap
from collections.abc import Sequence
from html import escape

import attrs

from .. import (
    CallModel,
    Cancelled,
    ErrorCategory,
    Finish,
    InvokeTools,
    ModelError,
    ModelFailed,
    ModelReplied,
    Settings,
    ToolErrorCategory,
    ToolsDone,
    TraceRecord,
    Wait,
)
from ..core._retry_after import _seconds, header_retry_after
from ._diagrams import KIND_COLOURS, state_kind

WIDTH = 1200
"""The SVG's width in px: a page's width, drawn at scale 1."""
SMALLEST_FONT_PX = 11
"""No text of the timeline is smaller (the tick labels); labels are 12 px."""

_FONT = 12
_SMALL = 11
_NARROW = frozenset("ijlI.,:;'!|() -[]ft/r")
_WIDE = frozenset("mwMW@%")
_LEFT = 104
_RIGHT = WIDTH - 28
_ROW = 16
_BAR = 16

CATEGORY_COLOURS: dict[str, str] = {
    ErrorCategory.RATE_LIMITED.value: "#ef6c00",
    ErrorCategory.OVERLOADED.value: "#8e24aa",
    ErrorCategory.CONTEXT_LENGTH_EXCEEDED.value: "#00838f",
    ErrorCategory.AUTH_ERROR.value: "#c62828",
    ErrorCategory.INVALID_REQUEST.value: "#ad1457",
    ErrorCategory.CONTENT_FILTERED.value: "#f9a825",
    ErrorCategory.UNKNOWN.value: "#6d4c41",
    "reply": "#2e7d32",
    "cancelled": "#757575",
    "no outcome": "#ffffff",
}
"""The fill of a model call bar, by its outcome (an error category, or a reply)."""

_WAIT_FILL = {"backoff": "#bbdefb", "server": "#64b5f6", "conflict": "#cfd8dc"}
_TOOL_OK = "#a5d6a7"
_TOOL_FAILED = "#ffcc80"
_MARK = {"turn": "#78909c", "limit": "#c62828", "breaker": "#c62828", "end": "#37474f"}

RETRY_AFTER_SOURCES = (
    "retry_after_seconds",
    "retry-after-ms header",
    "retry-after header",
    "retry-after HTTP date",
)
"""Where a wait the server asked for came from, in the engine's order of precedence
(``specs/retry-after.md``); a wait it did not ask for is the engine's ``backoff``."""


def retry_after_source(error: ModelError, wall: float | None) -> str | None:
    """Which of :data:`RETRY_AFTER_SOURCES` the engine read ``error``'s retry-after
    from (the first usable one, as :func:`statemachine.core._retry_after.retry_after`
    reads them), or ``None`` when none is usable."""
    if _seconds(error.retry_after_seconds) is not None:
        return RETRY_AFTER_SOURCES[0]
    headers = error.headers
    if not headers:
        return None
    if "retry-after-ms" in headers and _seconds(headers["retry-after-ms"]) is not None:
        return RETRY_AFTER_SOURCES[1]
    if "retry-after" not in headers:
        return None
    if _seconds(headers["retry-after"]) is not None:
        return RETRY_AFTER_SOURCES[2]
    if header_retry_after(headers, wall) is not None:
        return RETRY_AFTER_SOURCES[3]
    return None


@attrs.frozen
class Item:
    """One bar of a lane: from step index ``start`` to ``end`` (``None``: still open
    when the trace ends)."""

    lane: str
    """``model``, ``waits`` or ``tools``."""
    start: int
    end: int | None
    step: int
    """The place in the drawing (from 1) of the step a click on it selects."""
    label: str
    fill: str
    detail: str
    """Its tooltip: what the step list says of it."""
    crashed: tuple[str, ...] = ()
    """The providers whose process died under this tool round."""


@attrs.frozen
class Mark:
    """A vertical line at step index ``at``: a turn's start, a limit, a breaker trip,
    a turn's end."""

    kind: str
    at: int
    step: int
    label: str


@attrs.frozen
class Timeline:
    """A drawn timeline: what it shows, and the SVG."""

    items: tuple[Item, ...]
    marks: tuple[Mark, ...]
    origin: str
    """What t = 0 is: the session's first recorded step, with its wall-clock time if known."""
    names: tuple[str, ...]
    """Each step's name (:func:`step_name`), in order."""
    xs: tuple[float, ...]
    """The x (px) of each step, in order."""
    svg: str


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if value < 1 else f"{value:.2f}"


def _width(text: str, size: float = _FONT) -> float:
    """A text's width in px, a little more than Helvetica's or Arial's (whose glyphs
    are 0.22 to 0.83 em wide), plus a margin."""
    ems = sum(0.33 if c in _NARROW else 0.86 if c in _WIDE else 0.6 for c in text)
    return ems * size + 6


def _model_outcome(event: object, detail: str, guard: str) -> tuple[str, str]:
    """(colour key, label) of a model call's outcome."""
    if isinstance(event, ModelFailed):
        error = event.error
        status = f"{error.status} " if error.status is not None else ""
        partial = " (partial)" if event.partial else ""
        return error.category.value, f"{status}{error.category.value}{partial}"
    if isinstance(event, ModelReplied):
        calls = len(event.tool_calls)
        said = f"reply, {calls} tool call{'s' * (calls != 1)}" if calls else "reply"
        return "reply", said
    if isinstance(event, Cancelled):
        return "cancelled", "cancelled"
    # no event recorded (an older trace): the simulator's detail or the row's guards
    for key in CATEGORY_COLOURS:
        if detail.startswith(key) or key in guard.split(" & "):
            return key, key
    return "unknown", "failed"


def _wait_label(action: Wait, event: object, wall: float | None) -> tuple[str, str]:
    """(kind, label) of a wait: its seconds and where they came from."""
    seconds = f"{_num(action.seconds)} s"
    if action.category is ToolErrorCategory.CONCURRENCY_CONFLICT:
        return "conflict", f"{seconds} conflict backoff"
    if action.retry_after is None or action.seconds > action.retry_after:
        asked = "" if action.retry_after is None else f", server asked {_num(action.retry_after)} s"
        return "backoff", f"{seconds} backoff{asked}"
    source = None
    if isinstance(event, ModelFailed):
        source = retry_after_source(event.error, wall)
    return "server", f"{seconds} {source or 'retry-after'}"


_LIMITS = {
    "error_max_turns": "max_turns",
    "error_max_budget_usd": "max_cost_usd",
    "error_max_wall_clock": "max_wall_clock_s",
}


_BREAKERS = {
    "error_circuit_breaker": "crash breaker",
    "error_doom_loop": "doom-loop guard",
    "error_denial_breaker": "denial breaker",
}


def _limit_label(limit: str, settings: Settings | None) -> str:
    """The limit that fired, with the bound's value when the settings are known."""
    bound = _LIMITS.get(limit)
    if bound is None:
        return f"limit: {_BREAKERS.get(limit, limit)}"
    value = None if settings is None else getattr(settings, bound)
    return f"limit: {bound} = {value:g}" if value is not None else f"limit: {bound}"


def step_name(record: TraceRecord, several_turns: bool) -> str:
    """A step as people count it: its place in its turn from 1 (``3``: the turn's third
    step, its start the first), after its turn in a drawing of several (``2.3``)."""
    return f"{record.turn}.{record.step + 1}" if several_turns else str(record.step + 1)


def build(
    records: Sequence[TraceRecord],
    *,
    details: Sequence[str] = (),
    limits: Sequence[str | None] = (),
    settings: Settings | None = None,
    start: float | None = None,
    anchor: float | None = None,
    title: str = "",
) -> Timeline:
    """The timeline of ``records`` (in order), with, per record, the simulator's
    ``details`` and the ``limits`` that had fired (both optional), the trace's
    ``settings`` (for the bounds' values), ``start``, the session clock's reading at
    the session's first recorded step (t = 0; default: the first record's), and
    ``anchor``, the Unix time of that moment, if known."""
    several = len({r.turn for r in records}) > 1
    collect = _Collector(several, settings)
    for index, record in enumerate(records):
        collect.step(
            index,
            record,
            details[index] if index < len(details) else "",
            limits[index] if index < len(limits) else None,
        )
    items = collect.close()
    times = _times(records, start)
    xs = _positions(times)
    names = tuple(step_name(r, several) for r in records)
    timeline = Timeline(tuple(items), tuple(collect.marks), _origin(anchor), names, tuple(xs), "")
    return attrs.evolve(timeline, svg=_svg(timeline, records, times, title))


class _Collector:
    """Turns the steps, in order, into bars and marks."""

    def __init__(self, several_turns: bool, settings: Settings | None) -> None:
        self.several_turns = several_turns
        self.settings = settings
        self.items: list[Item] = []
        self.marks: list[Mark] = []
        self.model: tuple[int, str | None] | None = None
        self.wait: tuple[int, str, str, str] | None = None
        self.tools: tuple[int, InvokeTools] | None = None
        self.last_model: str | None = None
        self.limit: str | None = None

    def step(self, index: int, record: TraceRecord, detail: str, limit: str | None) -> None:
        number = index + 1
        event, action, trigger = record.caused_by, record.action, record.event
        if record.step == 0 and self.several_turns:
            self.marks.append(Mark("turn", index, number, f"turn {record.turn}"))
        if self.model is not None and trigger in ("ModelFailed", "ModelReplied", "Cancelled"):
            self._end_call(index, event, detail, record.guard)
        if self.wait is not None and trigger in ("WaitDone", "Cancelled"):
            self._end_wait(index)
        if self.tools is not None and trigger in ("ToolsDone", "Cancelled"):
            self.items.append(_tool_item(self.tools, index, event, detail))
            self.tools = None
        if isinstance(action, CallModel):
            self.model = (index, action.model)
        elif isinstance(action, Wait):
            kind, label = _wait_label(action, event, record.wall)
            self.wait = (index, kind, label, detail or label)
        elif isinstance(action, InvokeTools):
            self.tools = (index, action)
        if limit and limit != self.limit:
            self.marks.append(Mark("limit", index, number, _limit_label(limit, self.settings)))
        self.limit = limit or self.limit
        if "breaker" in record.guard:
            which = "denial breaker" if "denial" in record.guard else "crash breaker"
            self.marks.append(Mark("breaker", index, number, f"{which} open"))
        if isinstance(action, Finish):
            self.marks.append(Mark("end", index, number, action.status.value))

    def _end_call(self, index: int, event: object, detail: str, guard: str) -> None:
        assert self.model is not None  # noqa: S101 - the caller checked
        start, model = self.model
        key, said = _model_outcome(event, detail, guard)
        if isinstance(event, ModelReplied) and event.usage and event.usage.model:
            model = event.usage.model  # the model that answered, as the provider said
        named = f"{model}: " if model and model != self.last_model else ""
        self.last_model = model or self.last_model
        fill = CATEGORY_COLOURS[key]
        self.items.append(Item("model", start, index, index + 1, named + said, fill, detail))
        self.model = None

    def close(self) -> list[Item]:
        """The items, those still open when the trace ends drawn open-ended."""
        for opened, lane in ((self.model, "model"), (self.tools, "tools")):
            if opened is not None:
                start = opened[0]
                self.items.append(
                    Item(lane, start, None, start + 1, "no outcome", "#ffffff", "still running")
                )
        if self.wait is not None:
            self._end_wait(None)
        return self.items

    def _end_wait(self, index: int | None) -> None:
        assert self.wait is not None  # noqa: S101 - the caller checked
        start, kind, label, said = self.wait
        self.items.append(Item("waits", start, index, start + 1, label, _WAIT_FILL[kind], said))
        self.wait = None


def _tool_item(opened: tuple[int, InvokeTools], index: int, event: object, detail: str) -> Item:
    start, action = opened
    names = [call.name for call in action.calls]
    shown = ", ".join(dict.fromkeys(names)) + (f" ({len(names)} calls)" if len(names) > 1 else "")
    if not isinstance(event, ToolsDone):
        return Item("tools", start, index, index + 1, shown, _TOOL_FAILED, detail or "cancelled")
    failed = [o.category.value for o in event.outcomes if not o.ok and o.category is not None]
    providers = {call.id: call.provider for call in action.calls}
    crashed = tuple(
        dict.fromkeys(providers.get(o.call_id, o.call_id) for o in event.outcomes if o.crashed)
    )
    said = f"{shown}: " + (", ".join(dict.fromkeys(failed)) if failed else "ok")
    if crashed:
        said += f" ({', '.join(crashed)} crashed)"
    fill = _TOOL_FAILED if failed else _TOOL_OK
    return Item("tools", start, index, index + 1, said, fill, detail or said, crashed)


def _times(records: Sequence[TraceRecord], start: float | None) -> list[float]:
    """Each record's clock reading, relative to ``start`` (default: the first known
    one); an unknown time takes the one before it."""
    raw = [r.at for r in records]
    known = [t for t in raw if t is not None]
    if not known:
        return [0.0] * len(raw)
    origin = known[0] if start is None else start
    out: list[float] = []
    current = known[0]
    for t in raw:
        current = t if t is not None else current
        out.append(current - origin)
    return out


def _positions(times: Sequence[float]) -> list[float]:
    """The x of each step: linear in time, each step at least a few px after the one
    before (the scale found by bisection so that the last step lands at the right)."""
    n = len(times)
    span = _RIGHT - _LEFT
    if n == 1:
        return [_LEFT + span / 2]
    gaps = [max(0.0, b - a) for a, b in itertools.pairwise(times)]
    least = min(12.0, 0.5 * span / (n - 1))
    total = sum(gaps)
    if total <= 0 or not math.isfinite(total):
        increments = [span / (n - 1)] * (n - 1)
    else:
        low, high = 0.0, span / total
        for _ in range(80):
            middle = (low + high) / 2
            if sum(max(g * middle, least) for g in gaps) > span:
                high = middle
            else:
                low = middle
        increments = [max(g * low, least) for g in gaps]
    xs = [float(_LEFT)]
    for step in increments:
        xs.append(xs[-1] + step)
    return xs


def _origin(anchor: float | None) -> str:
    origin = "t = 0 at the session's first recorded step"
    if anchor is None:
        return f"{origin} (the trace records no wall-clock time)"
    try:
        moment = datetime.datetime.fromtimestamp(anchor, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return f"{origin} (its wall-clock time is out of range)"
    return f"{origin}: {moment:%Y-%m-%d %H:%M:%S} UTC"


def _x_at(time: float, times: Sequence[float], xs: Sequence[float]) -> float | None:
    """The x of a moment on the axis (the first step at that time, or between two)."""
    for k, t in enumerate(times):
        if t >= time:
            if t == time or k == 0:
                return xs[k]
            before = times[k - 1]
            return xs[k - 1] + (time - before) / (t - before) * (xs[k] - xs[k - 1])
    return None


_NICE = (1, 2, 5)


def _tick_step(total: float, room: float) -> float:
    wanted = total / max(1.0, room / 90)
    power = 10.0 ** math.floor(math.log10(wanted)) if wanted > 0 else 1.0
    for factor in (*_NICE, 10):
        if factor * power >= wanted:
            return factor * power
    return 10 * power  # pragma: no cover - the loop ends at 10


class _Rows:
    """Label rows: each label goes into the first row where it does not overlap."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def place(self, left: float, width: float) -> int:
        for row, end in enumerate(self.ends):
            if end + 6 <= left:
                self.ends[row] = left + width
                return row
        self.ends.append(left + width)
        return len(self.ends) - 1


def _text(x: float, y: float, text: str, *, size: int = _FONT, **extra: str) -> str:
    more = "".join(f' {k.rstrip("_").replace("_", "-")}="{v}"' for k, v in extra.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}"{more}>{escape(text)}</text>'


def _label(x: float, y: float, text: str, classes: str, step: int, colour: str = "") -> str:
    """A label on a white ground that selects ``step`` when clicked (a mark's: bold, in
    its ``colour``)."""
    ground = (
        f'<rect class="label-bg" x="{x - 2:.1f}" y="{y - _FONT + 1:.1f}" '
        f'width="{_width(text) - 2:.1f}" height="{_ROW - 3}" fill="#ffffff"/>'
    )
    bold = {"fill": colour, "font_weight": "bold"} if colour else {}
    label = _text(x, y, text, size=_FONT, **bold, class_=f"label {classes}", data_step=str(step))
    return f"{ground}\n{label}"


def _classes(item: Item) -> str:
    steps = {item.start + 1, item.step}
    if item.end is not None:
        steps.add(item.end + 1)
    return " ".join(f"s{n}" for n in sorted(steps))


def _lane(
    out: list[str], top: float, name: str, items: Sequence[Item], timeline: Timeline
) -> float:
    """Draw one lane from ``top``: its labels in rows above the bars; the lane's
    bottom."""
    xs = timeline.xs
    rows = _Rows()
    placed: list[tuple[Item, float, float, float, int]] = []
    for item in sorted(items, key=lambda i: xs[i.start]):
        x0 = xs[item.start]
        x1 = xs[item.end] if item.end is not None else _RIGHT + 20
        width = _width(item.label)
        left = min(x0, WIDTH - 8 - width)
        placed.append((item, x0, x1, left, rows.place(left, width)))
    count = max(1, len(rows.ends))
    bar_top = top + count * _ROW + 6
    out.append(
        _text(12, bar_top + _BAR - 3, name, font_weight="bold", fill="#37474f")
        + f'<line x1="{_LEFT}" y1="{bar_top + _BAR / 2:.1f}" x2="{_RIGHT + 20}" '
        f'y2="{bar_top + _BAR / 2:.1f}" stroke="#eceff1" stroke-width="1"/>'
    )
    if not items:
        out.append(_text(_LEFT, bar_top + _BAR - 3, "none", fill="#757575"))
    for _item, x0, _x1, left, row in placed:  # guides under the labels
        y = top + (count - row) * _ROW + 4
        if row or left != x0:
            out.append(
                f'<line x1="{x0 + 1:.1f}" y1="{y - _ROW + 4:.1f}" x2="{x0 + 1:.1f}" '
                f'y2="{bar_top:.1f}" stroke="#b0bec5" stroke-dasharray="2,2"/>'
            )
    for item, x0, x1, left, row in placed:
        y = top + (count - row) * _ROW + 2
        classes = _classes(item)
        open_end = item.end is None
        stroke = "#455a64" if not open_end else '#455a64" stroke-dasharray="4,3'
        bar = (
            f'<rect class="bar {classes}" data-step="{item.step}" x="{x0:.1f}" '
            f'y="{bar_top:.1f}" width="{max(4.0, x1 - x0 - 1):.1f}" height="{_BAR}" '
            f'fill="{item.fill}" stroke="{stroke}" stroke-width="1" rx="2">'
            f"<title>{escape(f'step {timeline.names[item.step - 1]}: {item.detail}')}</title>"
            "</rect>"
        )
        out.append(bar)
        out.append(_label(left, y, item.label, classes, item.step))
        for n, provider in enumerate(item.crashed):
            cx = x0 + 6 + n * 12
            cy = bar_top + _BAR / 2
            out.append(
                f'<path class="crash {classes}" d="M{cx - 4:.1f},{cy - 4:.1f} l8,8 '
                f'm0,-8 l-8,8" stroke="#c62828" stroke-width="2.5">'
                f"<title>{escape(f'{provider}: process crashed')}</title></path>"
            )
    return bar_top + _BAR + 8


def _svg(
    timeline: Timeline, records: Sequence[TraceRecord], times: Sequence[float], title: str
) -> str:
    xs = timeline.xs
    out: list[str] = []
    y = 24.0
    for line in textwrap.wrap(title, int((WIDTH - 24) / (16 * 0.62))) or [""]:
        out.append(_text(12, y, line, size=16, font_weight="bold"))
        y += 20
    span = times[-1] - times[0] if times else 0.0
    out.append(_text(12, y, f"{timeline.origin}; {_num(span)} s drawn", fill="#455a64"))
    y += 22
    y = _legend(out, y, timeline)
    # marks' labels, in rows above the lanes
    rows = _Rows()
    mark_rows: list[tuple[Mark, float, int]] = []
    for mark in timeline.marks:
        x = xs[mark.at]
        width = _width(mark.label)
        left = min(x + 3, WIDTH - 8 - width)
        mark_rows.append((mark, left, rows.place(left, width)))
    marks_top = y
    y += max(1, len(rows.ends)) * _ROW + 4
    lanes_top = y
    lanes_out: list[str] = []
    lanes = {"model": "model calls", "waits": "waits", "tools": "tool calls"}
    for lane, name in lanes.items():
        chosen = [i for i in timeline.items if i.lane == lane]
        if lane == "tools" and not chosen:
            continue
        y = _lane(lanes_out, y, name, chosen, timeline)
    axis = y + 4
    labels: list[str] = []
    for mark, left, row in mark_rows:  # the lines under the lanes, the labels over them
        x = xs[mark.at]
        colour = _MARK[mark.kind]
        label_y = marks_top + (row + 1) * _ROW - 2
        dash = ' stroke-dasharray="5,3"' if mark.kind in ("turn", "limit") else ""
        out.append(
            f'<line class="mark s{mark.step}" x1="{x:.1f}" y1="{label_y - _FONT + 2:.1f}" '
            f'x2="{x:.1f}" y2="{axis:.1f}" stroke="{colour}" stroke-width="1.5"{dash}/>'
        )
        labels.append(_label(left, label_y, mark.label, f"s{mark.step}", mark.step, colour))
    out.extend(lanes_out)
    out.extend(labels)
    out.append(
        f'<line id="cursor" x1="0" y1="{lanes_top:.1f}" x2="0" y2="{axis:.1f}" '
        'stroke="#d32f2f" stroke-width="2" visibility="hidden"/>'
    )
    y = _axis(out, axis, times, xs)
    y = _strip(out, y + 10, records, timeline)
    height = math.ceil(y + 10)
    body = "\n".join(out)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" '
        'font-family="Helvetica, Arial, sans-serif" fill="#212121">\n'
        f"<title>{escape(title)}</title>\n"
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>\n'
        f"{body}\n</svg>\n"
    )


def _legend(out: list[str], y: float, timeline: Timeline) -> float:
    keys = [
        (label, fill)
        for label, fill in (
            *((k, v) for k, v in CATEGORY_COLOURS.items() if k not in ("no outcome",)),
            ("wait: backoff", _WAIT_FILL["backoff"]),
            ("wait: server's retry-after", _WAIT_FILL["server"]),
            ("wait: conflict", _WAIT_FILL["conflict"]),
            ("tools ok", _TOOL_OK),
            ("tools failed", _TOOL_FAILED),
        )
        if fill in {i.fill for i in timeline.items}
    ]
    x = 12.0
    for label, fill in keys:
        width = 18 + _width(label, _SMALL)
        if x + width > WIDTH - 8:
            x = 12.0
            y += _ROW + 2
        out.append(
            f'<rect x="{x:.1f}" y="{y - 10:.1f}" width="12" height="12" fill="{fill}" '
            'stroke="#455a64"/>'
        )
        out.append(_text(x + 16, y, label, size=_SMALL))
        x += width + 8
    return y + _ROW + 6


def _axis(out: list[str], y: float, times: Sequence[float], xs: Sequence[float]) -> float:
    out.append(
        f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_RIGHT + 20}" y2="{y:.1f}" stroke="#37474f"/>'
    )
    first, last = (times[0], times[-1]) if times else (0.0, 0.0)
    shown: list[float] = []
    if last > first:
        step = _tick_step(last - first, _RIGHT - _LEFT)
        k = math.ceil(first / step - 1e-9)
        while k * step <= last + (last - first) * 1e-9:
            moment = k * step
            x = _x_at(moment, times, xs)
            k += 1
            if x is None or (shown and x - shown[-1] < 56):
                continue
            shown.append(x)
            out.append(
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{y + 5:.1f}" stroke="#37474f"/>'
            )
            tick = f"{round(moment, 6):g} s"
            out.append(_text(x, y + 18, tick, size=_SMALL, text_anchor="middle"))
    else:
        out.append(_text(_LEFT, y + 18, "no time passed between the steps", size=_SMALL))
    out.append(_text(12, y + 18, "session time", size=_SMALL, fill="#455a64"))
    return y + 26


def _strip(out: list[str], y: float, records: Sequence[TraceRecord], timeline: Timeline) -> float:
    """The path on the machine: each step's name and the state it entered, in order,
    wrapped at the page's width."""
    out.append(_text(12, y + 12, "path on the machine: step, state entered", font_weight="bold"))
    y += 20
    x = 12.0
    for index, record in enumerate(records):
        number = index + 1
        dest = record.dest
        label = f"{timeline.names[index]} {dest}"
        width = _width(label, _SMALL) + 4
        if x + width > WIDTH - 8:
            x = 12.0
            y += _ROW + 6
        fill, line = KIND_COLOURS[state_kind(dest)]
        out.append(
            f'<g class="chip s{number}" data-step="{number}" data-x="{timeline.xs[index]:.1f}">'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{_ROW + 2}" '
            f'rx="3" fill="{fill}" stroke="{line}"/>'
            + _text(x + 5, y + _ROW - 2, label, size=_SMALL)
            + "</g>"
        )
        x += width + 4
    return y + _ROW + 4
