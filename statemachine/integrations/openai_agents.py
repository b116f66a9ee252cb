"""The engine inside an OpenAI Agents SDK run: :class:`EngineModel` and
:class:`EngineModelProvider`.

``pip install 'turnstate[openai-agents]'``. Wrap the model an agent uses (a list: the
first is the default, the others the fallback chain, which the SDK itself does not
have)::

    model = EngineModel([primary, fallback], settings=sm.Settings(max_cost_usd=2.0))
    agent = Agent(name="assistant", model=model, tools=[...])

or give a run a provider that wraps every model it names::

    provider = EngineModelProvider(OpenAIProvider(), fallbacks=["gpt-5-mini"])
    await Runner.run(agent, "...", run_config=RunConfig(model_provider=provider))

Every ``get_response`` and ``stream_response`` is one engine turn (see
:mod:`statemachine.integrations._bridge`):

* **one retry owner.** Each call to a wrapped model runs with the SDK's own switch
  for provider-managed retries off (``provider_managed_retries_disabled``: its OpenAI
  models then call the client through ``with_options(max_retries=0)``), whatever the
  client's ``max_retries``. The runner's opt-in retries (``ModelSettings.retry`` with
  ``max_retries`` > 0) would retry around the engine: a call with them is refused
  with ``ConfigError`` naming the setting, before anything is sent.
* **fallbacks, context reductions, waits** are the engine's, as in the pydantic-ai
  integration. A reduction drops the oldest input items after the first, half of what
  is left each time, cutting only before a message (never between a tool call and its
  output); it is kept for the rest of the run.
* **the session's bounds across the run**: one session per ``Runner`` run (the SDK's
  per-run owner of model calls), or the ``session`` given. ``max_turns`` counts model
  calls; the doom-loop guard sees every function call of a reply (handoffs are not
  tool calls to it), with the output the next call's input brings. A limit makes the
  next call the final-answer turn: tools and handoffs withheld, the instruction
  appended as a user message; a call after it raises.
* **a turn the engine ends** raises :class:`TurnFailed`, an ``AgentsException``
  whose ``status`` names it. A content-filtered reply (the SDK turns
  ``finish_reason="content_filter"`` into a refusal) ends ``content_filtered``.
* **streaming.** Retried, waited and fallen back until the first event, then passed
  through; a stream that breaks after that is never resent (``stream_interrupted``).

A tool that raises: the SDK hands the model an error *text* as the tool's output. The
SDK's default text (a tool keeping the default ``failure_error_function``) is read as
a failed invocation, which the crash breaker counts (the function tools are one
provider to it, ``tools``); a tool's own ``failure_error_function``, or a run's
``tool_error_formatter``, makes a text the wrapper cannot tell from a result.

What a model wrapper cannot reach here: the
usage of a broken stream (the SDK reports a stream's usage only in its final
``response.completed`` event, so a stream cut before it is counted as 0 tokens).

A stream's usage is that event's, as the SDK read it, and so counted once per call:
the Responses API reports it once, and the SDK's Chat Completions stream handler keeps
the last usage a chunk carried, which is the whole call's when the vendor reports it
once at the end (OpenAI's ``include_usage``) or the totals so far on every chunk (vLLM's
continuous usage stats). A vendor that reports on each chunk what that chunk added is
undercounted, to its last chunk's share, by the SDK's own run usage and by the engine
alike: the chunks never leave the SDK's model, so the wrapper cannot add them up.
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

try:
    from agents.exceptions import AgentsException
    from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
    from agents.model_settings import ModelSettings
    from agents.models._retry_runtime import provider_managed_retries_disabled
    from agents.models._run_context import get_model_run_owner
    from agents.models.interface import Model, ModelProvider, ModelTracing
    from agents.tool import Tool, default_tool_error_function
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError(
        "statemachine.integrations.openai_agents needs an OpenAI Agents SDK this release "
        f"supports: pip install 'turnstate[openai-agents]' ({exc})"
    ) from exc

from ..core._actions import Assemble, CallModel
from ..core._events import Assembled, CannotShrink, ModelFailed, ModelReplied
from ..core._exceptions import ConfigError
from ..core._model_error import ModelError
from ..core._session import Session, Turn
from ..core._settings import Settings
from ..core._taxonomy import ErrorCategory, ToolErrorCategory
from ..core._tool_calls import ToolCall, ToolOutcome
from ..core._usage import Usage
from ..io._providers import _arguments, _label, _tokens, checked_prices
from ._bridge import (
    Bridge,
    CallResult,
    Run,
    bridges,
    classify_raised,
    listed,
    model_names,
    no_outcome,
    outcome,
    settings_for,
    token_cost,
)
from ._bridge import TurnFailed as _TurnFailed

__all__ = ["EngineModel", "EngineModelProvider", "TurnFailed"]

MAX_RUNS = 256
"""Runs whose sessions an :class:`EngineModel` keeps when their owner cannot be held
weakly (the oldest is let go)."""


class TurnFailed(_TurnFailed, AgentsException):
    """:class:`statemachine.integrations.TurnFailed` as the SDK's ``AgentsException``,
    so an agent's existing ``except AgentsException`` sees it."""


@dataclasses.dataclass
class _Request:
    """One model call as the engine assembles it."""

    instructions: str | None
    items: list[Any]
    tools: list[Tool]
    handoffs: list[Any]
    sent: list[Any] = dataclasses.field(default_factory=list)
    withhold: bool = False


def _name(model: Any) -> str:
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else type(model).__name__


class EngineModel(Model):
    """An Agents SDK model whose every call the engine decides. See the module
    docstring; ``models``: a model or a list of them, the first the default and the
    rest the fallback chain (named by their ``model`` attribute)."""

    def __init__(
        self,
        models: Model | Sequence[Model],
        *,
        settings: Settings | None = None,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Any] | None = None,
        session: Session | None = None,
        price_per_mtok: tuple[float, float] | None = None,
    ) -> None:
        chain = [models] if isinstance(models, Model) else listed(models)
        for model in chain:
            if not isinstance(model, Model):
                raise ConfigError(f"models: expected Agents SDK Model instances, got {model!r:.80}")
            if isinstance(model, EngineModel):
                raise ConfigError(
                    f"models: {model!r:.80} is an EngineModel already; wrap the models once "
                    "(two engines would multiply the retries)"
                )
        names = model_names(chain, _name)
        self.models = chain
        self.engine_settings = settings_for(settings, names)
        self.price_per_mtok = checked_prices(price_per_mtok)
        self._by_name = dict(zip(names, chain, strict=True))
        self._first = names[0]
        self._new_bridge, self._shared = bridges(
            self.engine_settings,
            seed=seed,
            clock=clock,
            wall_clock=wall_clock,
            sleep=sleep,
            session=session,
            failure=TurnFailed,
        )
        self._weak: weakref.WeakKeyDictionary[Any, Run] = weakref.WeakKeyDictionary()
        self._strong: collections.OrderedDict[int, Run] = collections.OrderedDict()
        self._last: Run | None = self._shared

    @property
    def last_session(self) -> Session | None:
        """The session of the latest run this model served (or the shared one)."""
        return None if self._last is None else self._last.bridge.session

    def _current(self) -> Run:
        if self._shared is not None:
            return self._shared
        owner = get_model_run_owner()
        run: Run | None
        try:
            run = self._weak.get(owner) if owner is not None else None
            if run is None and owner is not None:
                run = self._weak[owner] = Run(self._new_bridge())
        except TypeError:  # an owner that cannot be held weakly
            run = self._strong.get(id(owner))
            if run is None:
                run = self._strong[id(owner)] = Run(self._new_bridge())
                while len(self._strong) > MAX_RUNS:
                    self._strong.popitem(last=False)
        if run is None:  # called outside a Runner run: one session for such calls
            run = self._strong.get(0)
            if run is None:
                run = self._strong[0] = Run(self._new_bridge())
        self._last = run
        return run

    async def _cleanup_on_run_end(self, owner: object) -> None:
        for model in self.models:
            await model._cleanup_on_run_end(owner)  # noqa: SLF001 - the SDK's own hook, forwarded

    async def close(self) -> None:
        for model in self.models:
            await model.close()

    # -- calls ------------------------------------------------------------------------

    def _begin(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        handoffs: list[Any],
    ) -> tuple[Run, _Request]:
        """A call's run and request, the tool round before it settled."""
        _no_runner_retries(model_settings)
        run = self._current()
        request = _Request(system_instructions, _items(input), tools, handoffs)
        _settle(run.bridge, request.items)
        return run, request

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        """One model call, as one engine turn."""
        run, request = self._begin(system_instructions, input, model_settings, tools, handoffs)

        async def call(action: CallModel) -> CallResult[ModelResponse]:
            name, model = self._model(action)
            tools, handoffs = _offered(request)
            try:
                with provider_managed_retries_disabled(True):
                    response = await model.get_response(
                        request.instructions,
                        request.sent,
                        model_settings,
                        tools,
                        output_schema,
                        handoffs,
                        tracing,
                        previous_response_id=previous_response_id,
                        conversation_id=conversation_id,
                        prompt=prompt,
                    )
            except Exception as exc:
                return self._failed(exc, streamed=False), None
            return self._event(response, request, name, streamed=False), response

        _, response = await run.bridge.request(lambda action: _assemble(run, request, action), call)
        return response

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """One streamed model call, as one engine turn: passed through from its first
        event on; a failure after that is never resent."""
        run, request = self._begin(system_instructions, input, model_settings, tools, handoffs)
        opened: list[tuple[str, AsyncIterator[TResponseStreamEvent]]] = []

        async def call(action: CallModel) -> CallResult[TResponseStreamEvent]:
            name, model = self._model(action)
            tools, handoffs = _offered(request)
            events = model.stream_response(
                request.instructions,
                request.sent,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            ).__aiter__()
            try:
                with provider_managed_retries_disabled(True):
                    first = await events.__anext__()
            except StopAsyncIteration:
                first = None
            except Exception as exc:
                await _close(events)
                return self._failed(exc, streamed=True), None
            opened[:] = [(name, events)]
            return None, first

        turn, first = await run.bridge.request(lambda action: _assemble(run, request, action), call)
        name, events = opened[0]
        completed: Any = None
        try:
            event: Any = first
            while event is not None:
                if getattr(event, "type", None) == "response.completed":
                    completed = getattr(event, "response", None)
                yield event
                try:
                    with provider_managed_retries_disabled(True):
                        event = await events.__anext__()
                except StopAsyncIteration:
                    event = None
                except Exception as exc:
                    self._broken(run.bridge, turn, exc)
                    raise
        except BaseException as exc:
            if turn.current and not turn.done:
                run.bridge.abandon(turn, exc)
            raise
        finally:
            await _close(events)
        run.bridge.settle(turn, self._streamed_event(completed, request, name))

    def _broken(self, bridge: Bridge, turn: Turn, exc: Exception) -> None:
        """Settle a stream that raised ``exc`` after it was passed through: never
        resent (``partial``); raises :class:`TurnFailed` (``stream_interrupted``)."""
        where = Usage(streamed=True)
        try:
            bridge.settle(turn, ModelFailed(classify_raised(exc), partial=True, usage=where))
        except _TurnFailed as failed:
            raise failed from exc

    # -- one call's pieces --------------------------------------------------------------

    def _model(self, action: CallModel) -> tuple[str, Model]:
        name = action.model or self._first
        return name, self._by_name[name]

    def _failed(self, exc: Exception, *, streamed: bool) -> ModelFailed:
        return ModelFailed(classify_raised(exc), usage=Usage(streamed=streamed))

    def _streamed_event(
        self, completed: Any, request: _Request, name: str
    ) -> ModelReplied | ModelFailed:
        if completed is None:
            return ModelReplied(usage=Usage(streamed=True))
        usage = getattr(completed, "usage", None)
        response = ModelResponse(
            output=list(getattr(completed, "output", None) or ()),
            usage=_agents_usage(usage),
            response_id=getattr(completed, "id", None),
        )
        return self._event(response, request, name, streamed=True)

    def _event(
        self, response: ModelResponse, request: _Request, name: str, *, streamed: bool
    ) -> ModelReplied | ModelFailed:
        usage = self._usage(response, name, streamed=streamed)
        cost = usage.cost_usd or 0.0
        refusal = _refusal(response.output)
        if refusal is not None:
            error = ModelError(ErrorCategory.CONTENT_FILTERED, refusal, code="refusal", status=200)
            return ModelFailed(error, cost=cost, usage=usage)
        tools = {getattr(tool, "name", None) for tool in request.tools}
        calls = tuple(
            ToolCall(
                str(_get(item, "call_id")),
                "tools",
                str(_get(item, "name")),
                _arguments(_get(item, "arguments")),
            )
            for item in response.output
            if _get(item, "type") == "function_call"
            and _get(item, "name") in tools
            and _get(item, "call_id")
        )
        return ModelReplied(tool_calls=calls, cost=cost, usage=usage)

    def _usage(self, response: ModelResponse, name: str, *, streamed: bool) -> Usage:
        counts = response.usage
        tokens_in = _tokens(getattr(counts, "input_tokens", None))
        tokens_out = _tokens(getattr(counts, "output_tokens", None))
        details = getattr(counts, "input_tokens_details", None)
        cost = token_cost(self.price_per_mtok, tokens_in, tokens_out)
        return Usage(
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cached_tokens=_tokens(getattr(details, "cached_tokens", None)),
            cost_usd=cost,
            model=_label(name),
            response_id=_label(response.response_id),
            streamed=streamed,
        )

    def __repr__(self) -> str:
        return f"EngineModel(models={list(self._by_name)!r})"


_ENGINE_ARGS = frozenset(
    {"settings", "seed", "clock", "wall_clock", "sleep", "session", "price_per_mtok"}
)
"""The keyword arguments of :class:`EngineModel` an :class:`EngineModelProvider` passes on."""


class EngineModelProvider(ModelProvider):
    """A ``ModelProvider`` whose every model is an :class:`EngineModel`: the model a
    run names (through ``provider``), then ``fallbacks`` (names ``provider`` knows).
    One :class:`EngineModel` per name, so a run's session holds across its calls.
    ``engine``: the keyword arguments of each :class:`EngineModel` (``settings``,
    ``sleep``, ``clock``...)."""

    def __init__(
        self, provider: ModelProvider, *, fallbacks: Sequence[str] = (), **engine: Any
    ) -> None:
        if not isinstance(provider, ModelProvider):
            raise ConfigError(f"provider: expected an Agents SDK ModelProvider, got {provider!r}")
        if isinstance(fallbacks, str) or not all(isinstance(name, str) for name in fallbacks):
            raise ConfigError(f"fallbacks: expected a list of model names, got {fallbacks!r}")
        unknown = sorted(set(engine) - _ENGINE_ARGS)
        if unknown:
            raise ConfigError(
                f"EngineModelProvider: unknown keyword argument(s) {unknown}; an EngineModel "
                f"takes {sorted(_ENGINE_ARGS)}"
            )
        settings = engine.get("settings")
        if settings is not None and not isinstance(settings, Settings):
            # checked here, not at the run's first model call
            raise ConfigError(f"settings: must be a statemachine.Settings, got {settings!r:.80}")
        timing = {
            key: engine[key] for key in ("seed", "clock", "wall_clock", "sleep") if key in engine
        }
        Bridge(Settings() if settings is None else settings, **timing)  # refused here, if bad
        self.provider = provider
        self.fallbacks = tuple(fallbacks)
        self.engine = engine
        self._models: dict[str | None, EngineModel] = {}

    def get_model(self, model_name: str | None) -> Model:
        """The :class:`EngineModel` over ``model_name`` and the fallbacks."""
        model = self._models.get(model_name)
        if model is None:
            chain = [self.provider.get_model(model_name)]
            chain += [self.provider.get_model(name) for name in self.fallbacks]
            model = self._models[model_name] = EngineModel(chain, **self.engine)
        return model

    async def aclose(self) -> None:
        await self.provider.aclose()


# -- helpers ----------------------------------------------------------------------------


def _no_runner_retries(settings: ModelSettings) -> None:
    retry = getattr(settings, "retry", None)
    retries = getattr(retry, "max_retries", None)
    if isinstance(retries, int) and retries > 0:
        raise ConfigError(
            f"model_settings.retry: max_retries={retries} makes the runner retry around the "
            "engine, which already retried (the two would multiply); leave retry unset"
        )


def _items(value: str | list[TResponseInputItem]) -> list[Any]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value)


def _get(item: Any, key: str) -> Any:
    if isinstance(item, dict):
        return item.get(key)
    return getattr(item, key, None)


def _refusal(output: list[Any]) -> str | None:
    """The refusal text of a reply's message, if it holds one."""
    for item in output:
        if _get(item, "type") != "message":
            continue
        for part in _get(item, "content") or ():
            if _get(part, "type") == "refusal":
                return str(_get(part, "refusal") or "the model refused")
    return None


def _agents_usage(usage: Any) -> Any:
    from agents.usage import Usage as AgentsUsage  # noqa: PLC0415

    if usage is None:
        return AgentsUsage()
    return AgentsUsage(
        requests=1,
        input_tokens=_tokens(getattr(usage, "input_tokens", None)) or 0,
        output_tokens=_tokens(getattr(usage, "output_tokens", None)) or 0,
        total_tokens=_tokens(getattr(usage, "total_tokens", None)) or 0,
    )


def _offered(request: _Request) -> tuple[list[Tool], list[Any]]:
    if request.withhold:
        return [], []
    return request.tools, request.handoffs


async def _close(events: AsyncIterator[Any]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()


_FAILED_TOOL_TEXT = default_tool_error_function(None, Exception())  # type: ignore[arg-type]
"""The output the SDK gives the model for a function tool that raised, when the tool
keeps the SDK's default ``failure_error_function`` (it says nothing of the error)."""


def _settle(bridge: Bridge, items: list[Any]) -> None:
    """Send the previous reply's tool outcomes, read from the input that brings them:
    an output that is the SDK's default text for a tool that raised is an invocation
    that failed (the crash breaker counts it); any other output is the tool's answer."""
    calls = bridge.pending_calls
    if not calls:
        bridge.settle_tools(no_outcome)
        return
    ids = {call.id for call in calls}
    seen: dict[str, ToolOutcome] = {}
    for item in items:
        call_id = _get(item, "call_id")
        if _get(item, "type") == "function_call_output" and call_id in ids:
            call = next(call for call in calls if call.id == call_id)
            output = _get(item, "output")
            if output == _FAILED_TOOL_TEXT:
                unknown = ToolErrorCategory.UNKNOWN
                seen[call_id] = outcome(call, False, output, unknown, invoke_failed=True)
            else:
                seen[call_id] = outcome(call, True, output, None)
    bridge.settle_tools(lambda call: seen.get(call.id))


def _assemble(run: Run, request: _Request, action: Assemble) -> Assembled | CannotShrink:
    """The input to send: the first item, then the items from ``run.cut`` on (moved
    further on a reduction), the engine's instruction appended."""
    items = request.items
    cuts = [
        index
        for index in range(1, len(items) - 1)
        if _get(items[index], "role") in {"user", "assistant"}
        or _get(items[index], "type") == "message"
    ]
    if run.cut > 1 and run.cut not in cuts:
        run.cut = 1
    if action.reduce:
        later = [index for index in cuts if index > run.cut]
        if not later:
            return CannotShrink()
        run.cut = later[len(later) // 2]
    sent = items if run.cut == 1 else [items[0], *items[run.cut :]]
    if action.instruction:
        sent = [*sent, {"role": "user", "content": action.instruction}]
    request.sent = sent
    request.withhold = action.withhold_tools
    return Assembled({"items": len(sent), "dropped": len(items) - len(sent)}, size=len(sent))
