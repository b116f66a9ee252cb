"""The engine inside a pydantic-ai agent: :class:`EngineModel`.

``pip install 'turnstate[pydantic-ai]'``. Wrap the model an agent already uses (or
the list a ``FallbackModel`` held)::

    model = EngineModel([primary, fallback], settings=sm.Settings(max_cost_usd=2.0))
    agent = Agent(model, ...)

Every request the agent makes goes through the engine (one engine turn per request,
see :mod:`statemachine.integrations._bridge`):

* **one retry owner.** The engine retries, waits (with ``sleep``, ``asyncio.sleep``
  unless given) and falls back. The SDK client of a wrapped model that would retry on
  its own (``max_retries`` > 0, the SDKs' default is 2) is not refused: each request
  to it carries ``ModelSettings(max_retries=0)``, pydantic-ai's own per-request knob,
  so the client is used as built, retrying nothing (an agent-level
  ``model_settings={"max_retries": n}`` is overridden the same way). A model with no
  SDK client (a ``FunctionModel``, your own) is called as it is.
* **fallbacks by the engine.** ``models[0]`` is the default; the others are
  ``Settings.fallback_models``, named by their ``model_id`` (``openai:gpt-5``). A
  transient error's retries are spent on a model before the next is tried, and an
  ``auth_error`` or ``invalid_request`` is never hidden by a fallback (pydantic-ai's
  ``FallbackModel`` falls back on every ``ModelAPIError``, a 401 included).
* **context reductions by the engine.** A context overflow (a 400 saying so, or a 429
  whose request is over the minute's token limit: "must be reduced") is answered with
  a smaller request: the oldest rounds after the first request (system prompt and
  first user prompt) are dropped, half of what is left each time, never a tool call
  apart from its result; the reduction is kept for the rest of the run.
* **the session's bounds across the run.** One session per agent run (its
  ``run_id``), or the ``session`` you pass for all of them: ``max_turns`` counts model
  requests, ``max_cost_usd`` their cost (``price_per_mtok``), the doom-loop guard the
  tool calls of consecutive replies (their results arrive with the next request). A
  limit makes the next request the final-answer turn: function tools withheld, the
  engine's instruction appended as a user prompt; a request after it raises.
* **a turn the engine ends** (auth error, retries spent, a retry-after beyond
  ``max_server_wait_s``, a content filter, a broken stream...) raises
  :class:`TurnFailed`, an ``AgentRunError`` whose ``status`` names it.
* **streaming.** ``request_stream`` retries, waits and falls back until a stream
  produced its first event, then hands it over; a stream that breaks after that is
  never resent: its usage so far is counted once and the run raises
  :class:`TurnFailed` (``stream_interrupted``).
* **a stream's usage, counted once whatever its shape.** pydantic-ai's OpenAI chat
  stream adds up every chunk's usage unless the model's profile or the
  ``openai_continuous_usage_stats`` setting says the chunks carry cumulative totals, so
  a server that sends the totals so far on every chunk unasked (vLLM's continuous usage
  stats, an OpenAI-compatible proxy) is counted once per chunk. The engine's model reads
  each chunk's usage by the rule of :mod:`statemachine.io._stream_usage` instead (a
  chunk that repeats the prompt's count with no fewer output tokens replaces the totals,
  any other adds to them), for the run's usage as for the engine's cost. It cannot see
  raw chunks, so it takes each chunk's usage where pydantic-ai records it: the stream's
  ``_add_usage``, replaced on each stream it opens before the first chunk is read. The
  alternatives are worse: turning on ``openai_continuous_usage_stats`` changes the
  request (``stream_options.continuous_usage_stats``, which OpenAI's own API does not
  take) and is wrong for a delta stream; reading the stream's usage after each event
  sees several chunks added at once (a chunk that yields no event, the final usage
  chunk). A stream that records usage another way (pydantic-ai's Anthropic stream
  follows that protocol's cumulative ``message_delta``), or a pydantic-ai without
  ``_add_usage``, keeps pydantic-ai's own count.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

try:
    from pydantic_ai._fallback import request_stream_until_first_event
    from pydantic_ai._run_context import get_current_run_context
    from pydantic_ai.exceptions import AgentRunError
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse, infer_model
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.usage import RequestUsage
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError(
        "statemachine.integrations.pydantic_ai needs a pydantic-ai this release supports: "
        f"pip install 'turnstate[pydantic-ai]' ({exc})"
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
from ..io._providers import _label, _tokens, checked_prices
from ..io._stream_usage import StreamUsage, Tokens
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

__all__ = ["EngineModel", "TurnFailed"]

MAX_RUNS = 256
"""Agent runs whose sessions an :class:`EngineModel` keeps (the oldest is let go)."""


class TurnFailed(_TurnFailed, AgentRunError):
    """:class:`statemachine.integrations.TurnFailed` as pydantic-ai's ``AgentRunError``,
    so an agent's existing ``except AgentRunError`` sees it."""


@dataclasses.dataclass
class _Request:
    """One agent request as the engine assembles it."""

    messages: list[ModelMessage]
    settings: ModelSettings | None
    parameters: ModelRequestParameters
    sent: list[ModelMessage] = dataclasses.field(default_factory=list)
    withhold: bool = False


class EngineModel(WrapperModel):
    """A pydantic-ai model whose every request the engine decides. See the module
    docstring; ``models``: a model (or its name) or a list of them, the first the
    default and the rest the fallback chain."""

    def __init__(
        self,
        models: Model | str | Sequence[Model | str],
        *,
        settings: Settings | None = None,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Any] | None = None,
        session: Session | None = None,
        price_per_mtok: tuple[float, float] | None = None,
    ) -> None:
        chain = [models] if isinstance(models, Model | str) else listed(models)
        for model in chain:
            if not isinstance(model, Model | str):
                raise ConfigError(
                    "models: expected pydantic-ai Model instances or model names, got "
                    f"{model!r:.80}"
                )
        resolved = [infer_model(model) for model in chain]
        for model in resolved:
            _owns_no_retries(model)
        names = model_names(resolved, lambda model: str(model.model_id))
        super().__init__(resolved[0])
        self.models = resolved
        self.engine_settings = settings_for(settings, names)
        self.price_per_mtok = checked_prices(price_per_mtok)
        self._by_name = dict(zip(names, resolved, strict=True))
        self._retrying = {name: _sdk_retries(model) for name, model in self._by_name.items()}
        self._new_bridge, self._shared = bridges(
            self.engine_settings,
            seed=seed,
            clock=clock,
            wall_clock=wall_clock,
            sleep=sleep,
            session=session,
            failure=TurnFailed,
        )
        self._runs: collections.OrderedDict[str | None, Run] = collections.OrderedDict()

    # -- which session ----------------------------------------------------------------

    def session(self, run_id: str | None = None) -> Session | None:
        """The session of the agent run ``run_id`` (the shared one when ``session=``
        was given; ``None``: a run this model has not seen)."""
        if self._shared is not None:
            return self._shared.bridge.session
        run = self._runs.get(run_id)
        return None if run is None else run.bridge.session

    def _run(self, run_id: str | None) -> Run:
        if self._shared is not None:
            return self._shared
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = Run(self._new_bridge())
            while len(self._runs) > MAX_RUNS:
                # a run still going (a request out, or its tools running) is let go only
                # when every other is too: its next request would start a new session,
                # its bounds counted from zero
                idle = next((key for key, kept in self._runs.items() if not kept.bridge.busy), None)
                if idle is None:
                    self._runs.popitem(last=False)
                else:
                    del self._runs[idle]
        else:
            self._runs.move_to_end(run_id)
        return run

    def _current(self, run_context: Any = None) -> Run:
        context = run_context if run_context is not None else get_current_run_context()
        return self._run(getattr(context, "run_id", None))

    # -- lifecycle: every model of the chain, as FallbackModel does ----------------------

    async def __aenter__(self) -> EngineModel:
        for model in self.models:
            await model.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        for model in reversed(self.models):
            await model.__aexit__(*exc_info)
        return None

    # -- requests ---------------------------------------------------------------------

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """One agent request, as one engine turn."""
        run = self._current()
        request = _Request(messages, model_settings, model_request_parameters)
        _settle(run.bridge, messages)

        async def call(action: CallModel) -> CallResult[ModelResponse]:
            model, sent, settings, parameters = self._prepared(action, request)
            try:
                response = await model.request(sent, settings, parameters)
            except Exception as exc:
                return self._failed(exc, model, streamed=False), None
            return self._event(response, request, model, streamed=False), response

        _, response = await run.bridge.request(lambda action: _assemble(run, request, action), call)
        return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: Any = None,
    ) -> AsyncGenerator[StreamedResponse]:
        """One streamed agent request, as one engine turn: handed over at its first
        event; a failure after that is never resent."""
        run = self._current(run_context)
        request = _Request(messages, model_settings, model_request_parameters)
        _settle(run.bridge, messages)
        async with AsyncExitStack() as stack:
            used: list[Model] = []

            async def call(action: CallModel) -> CallResult[StreamedResponse]:
                model, sent, settings, parameters = self._prepared(action, request)
                used[:] = [model]
                try:
                    stream = await stack.enter_async_context(
                        request_stream_until_first_event(
                            _CountedOnce(model), None, sent, settings, parameters, run_context
                        )
                    )
                except Exception as exc:
                    return self._failed(exc, model, streamed=True), None
                return None, stream

            turn, stream = await run.bridge.request(
                lambda action: _assemble(run, request, action), call
            )
            try:
                yield stream
            except Exception as exc:
                try:
                    self._broken(run.bridge, turn, stream, used[0], exc)
                except _TurnFailed as failed:
                    raise failed from exc
                raise
            except BaseException as exc:  # a cancel: what the stream used so far is charged
                run.bridge.abandon(turn, exc, self._usage(stream.get(), used[0], streamed=True))
                raise
            run.bridge.settle(turn, self._event(stream.get(), request, used[0], streamed=True))

    def _broken(
        self, bridge: Bridge, turn: Turn, stream: StreamedResponse, model: Model, exc: Exception
    ) -> None:
        """Settle a stream that raised ``exc`` after the hand-over: a model failure is
        reported ``partial`` with the usage so far (raising :class:`TurnFailed`); any
        other error (the agent's own) cancels the turn and propagates."""
        usage = self._usage(stream.get(), model, streamed=True)
        if not _is_model_failure(exc):
            bridge.abandon(turn, exc, usage)
            return
        event = ModelFailed(
            classify_raised(exc), partial=True, cost=usage.cost_usd or 0.0, usage=usage
        )
        bridge.settle(turn, event)  # raises TurnFailed(stream_interrupted)

    # -- one call ---------------------------------------------------------------------

    def _prepared(
        self, action: CallModel, request: _Request
    ) -> tuple[Model, list[ModelMessage], ModelSettings | None, ModelRequestParameters]:
        name = action.model or next(iter(self._by_name))
        model = self._by_name[name]
        sent = request.sent
        if model is not self.models[0]:  # the agent prepared them for the default model
            sent = model.prepare_messages(sent, request.parameters)
        settings = request.settings
        if self._retrying[name] or (settings or {}).get("max_retries"):
            settings = cast(ModelSettings, {**(settings or {}), "max_retries": 0})
        parameters = request.parameters
        if request.withhold:
            parameters = dataclasses.replace(parameters, function_tools=[])
            if settings and "tool_choice" in settings:
                kept = {key: value for key, value in settings.items() if key != "tool_choice"}
                settings = cast(ModelSettings, kept)
        return model, sent, settings, parameters

    def _failed(self, exc: Exception, model: Model, *, streamed: bool) -> ModelFailed:
        where = Usage(provider_name=_label(model.system), streamed=streamed)
        return ModelFailed(classify_raised(exc), usage=where)

    def _event(
        self, response: ModelResponse, request: _Request, model: Model, *, streamed: bool
    ) -> ModelReplied | ModelFailed:
        usage = self._usage(response, model, streamed=streamed)
        cost = usage.cost_usd or 0.0
        if response.finish_reason == "content_filter":
            error = ModelError(
                ErrorCategory.CONTENT_FILTERED,
                "the reply was stopped by the content filter (finish_reason=content_filter)",
                code="content_filter",
                status=200,
            )
            return ModelFailed(error, cost=cost, usage=usage)
        tools = {tool.name for tool in request.parameters.function_tools}
        calls = tuple(
            ToolCall(part.tool_call_id, "tools", part.tool_name, _arguments(part))
            for part in response.parts
            if isinstance(part, ToolCallPart) and part.tool_name in tools
        )
        return ModelReplied(tool_calls=calls, cost=cost, usage=usage)

    def _usage(self, response: ModelResponse, model: Model, *, streamed: bool) -> Usage:
        counts = response.usage
        tokens_in = _tokens(counts.input_tokens)
        tokens_out = _tokens(counts.output_tokens)
        cost = token_cost(self.price_per_mtok, tokens_in, tokens_out)
        return Usage(
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cached_tokens=_tokens(counts.cache_read_tokens),
            cache_creation_tokens=_tokens(counts.cache_write_tokens),
            cost_usd=cost,
            model=_label(response.model_name),
            response_id=_label(response.provider_response_id),
            finish_reason=_label(response.finish_reason),
            provider_name=_label(response.provider_name or model.system),
            streamed=streamed,
        )

    def __repr__(self) -> str:
        return f"EngineModel(models={[model.model_id for model in self.models]!r})"


class _CountedOnce(WrapperModel):
    """``model`` whose every stream counts its chunks' usage once (:func:`_count_once`),
    as ``request_stream_until_first_event`` opens it."""

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: Any = None,
    ) -> AsyncGenerator[StreamedResponse]:
        async with self.wrapped.request_stream(
            messages, model_settings, model_request_parameters, run_context
        ) as stream:
            _count_once(stream)
            yield stream


def _count_once(stream: StreamedResponse) -> None:
    """Make ``stream`` count the usage each chunk reports by the one rule (see the module
    docstring), before it reads its first chunk."""
    record = getattr(stream, "_add_usage", None)
    if not callable(record):  # a pydantic-ai that records usage otherwise
        return
    counted: StreamUsage[RequestUsage] = StreamUsage(_request_tokens, operator.add)

    def add_usage(usage: RequestUsage, *, reported: bool, cumulative: bool = False) -> None:
        if cumulative:  # the model's profile or settings know the chunks repeat the totals
            counted.total = usage
        record(usage if cumulative else counted.see(usage), reported=reported, cumulative=True)

    stream._add_usage = add_usage  # type: ignore[method-assign]  # noqa: SLF001 - see above


def _request_tokens(usage: RequestUsage) -> Tokens:
    return usage.input_tokens, usage.output_tokens


def _owns_no_retries(model: Model) -> None:
    """Refuse a model that retries or falls back on its own above its SDK client: a
    ``FallbackModel`` (it falls back on every error, a 401 included, and its models'
    clients would retry unseen) or another :class:`EngineModel` (two engines)."""
    from pydantic_ai.models.fallback import FallbackModel  # noqa: PLC0415

    inner: Model | None = model
    while inner is not None:
        if isinstance(inner, FallbackModel):
            raise ConfigError(
                f"models: {inner!r:.80} is a FallbackModel, which falls back on every error "
                "(a 401 included) where the engine cannot see it; give its models as the "
                "list instead: EngineModel([first, fallback, ...])"
            )
        if isinstance(inner, EngineModel):
            raise ConfigError(
                f"models: {inner!r:.80} is an EngineModel already; wrap the models once "
                "(two engines would multiply the retries)"
            )
        inner = inner.wrapped if isinstance(inner, WrapperModel) else None


def _sdk_retries(model: Model) -> bool:
    """Whether ``model``'s SDK client retries on its own (``max_retries`` > 0)."""
    retries = getattr(getattr(model, "client", None), "max_retries", None)
    return isinstance(retries, int) and not isinstance(retries, bool) and retries > 0


def _arguments(part: ToolCallPart) -> Any:
    args = part.args
    if args is None or isinstance(args, dict):
        return args or {}
    try:
        return part.args_as_dict(raise_if_invalid=True)
    except ValueError:
        return str(args)  # the model wrote invalid JSON: compared as written


def _is_model_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a model call's failure (an SDK, HTTP or pydantic-ai model
    error), not the agent's own."""
    from pydantic_ai.exceptions import ModelAPIError, UnexpectedModelBehavior  # noqa: PLC0415

    link: BaseException | None = exc
    while link is not None:
        root = type(link).__module__.split(".")[0]
        if isinstance(link, ModelAPIError | UnexpectedModelBehavior) or root in {
            "openai",
            "anthropic",
            "httpx",
            "httpx2",
            "httpcore",
        }:
            return True
        link = link.__cause__ or link.__context__
    return False


def _settle(bridge: Bridge, messages: list[ModelMessage]) -> None:
    """Send the previous reply's tool outcomes, read from the request that brings them."""
    calls = bridge.pending_calls
    if not calls:
        bridge.settle_tools(no_outcome)
        return
    last = messages[-1] if messages else None
    seen: dict[str, ToolOutcome] = {}
    ids = {call.id: call for call in calls}
    for part in last.parts if isinstance(last, ModelRequest) else ():
        call = ids.get(getattr(part, "tool_call_id", ""))
        if call is None:
            continue
        if isinstance(part, ToolReturnPart):
            seen[call.id] = outcome(call, True, part.content, None)
        elif isinstance(part, RetryPromptPart):
            category = (
                ToolErrorCategory.INVALID_ARGUMENTS
                if isinstance(part.content, list)  # the arguments failed validation
                else ToolErrorCategory.EXECUTION_FAILED
            )
            seen[call.id] = outcome(call, False, part.content, category)
    bridge.settle_tools(lambda call: seen.get(call.id))


def _assemble(run: Run, request: _Request, action: Assemble) -> Assembled | CannotShrink:
    """The messages to send: the first request, then the history from ``run.cut`` on
    (moved further on a reduction), the engine's instruction appended."""
    messages = request.messages
    cuts = [
        index for index in range(1, len(messages) - 1) if isinstance(messages[index], ModelResponse)
    ]
    if run.cut > 1 and run.cut not in cuts:  # another history than the cut was made in
        run.cut = 1
    if action.reduce:
        later = [index for index in cuts if index > run.cut]
        if not later:
            return CannotShrink()
        run.cut = later[len(later) // 2]
    sent = messages if run.cut == 1 else [messages[0], *messages[run.cut :]]
    if action.instruction and sent and isinstance(sent[-1], ModelRequest):
        last = sent[-1]
        prompt = UserPromptPart(content=action.instruction)
        sent = [*sent[:-1], dataclasses.replace(last, parts=[*last.parts, prompt])]
    request.sent = sent
    request.withhold = action.withhold_tools
    return Assembled({"messages": len(sent), "dropped": len(messages) - len(sent)}, size=len(sent))
