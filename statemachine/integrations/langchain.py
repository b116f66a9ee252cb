"""The engine inside LangChain and LangGraph: :class:`EngineChatModel`.

``pip install 'turnstate[langchain]'``. Wrap the chat model an agent already uses (or
the list a ``with_fallbacks`` chained)::

    model = EngineChatModel([ChatOpenAI(model="gpt-5"), ChatAnthropic(model="claude-sonnet-4-5")])
    agent = create_react_agent(model, tools)

Every model request is one engine turn (:mod:`statemachine.integrations._bridge`):

* **one retry owner.** The engine retries, waits (``sleep``, ``asyncio.sleep`` unless
  given) and falls back. A wrapped model with a ``max_retries`` field that is not 0
  (``ChatOpenAI``, ``ChatAnthropic``: the SDK client's retries; unset is the SDK's
  default, 2) is rebuilt from the fields it was given with ``max_retries=0``; the model
  you passed is not changed. A
  ``with_retry`` or ``with_fallbacks`` runnable given as a model is refused with
  ``ConfigError`` (it retries or falls back where the engine cannot see it). Around
  this model they cannot be seen: a ``with_retry``, a ``with_fallbacks`` or a
  LangGraph node ``RetryPolicy`` around it retries the turns the engine ended (each
  :class:`TurnFailed` a ``RuntimeError``), a second retry owner: leave them out.
* **fallbacks by the engine.** ``models[0]`` is the default; the others are
  ``Settings.fallback_models``, named by their ``model_name`` / ``model`` field (else
  their ``_llm_type`` and index). An ``auth_error`` or ``invalid_request`` is never
  hidden by a fallback (``with_fallbacks`` falls back on every exception).
* **one session per graph run**: the run's ``configurable.thread_id`` when it has one
  (a conversation's runs share it), else the id of the conversation's first message
  (LangGraph gives every message one); ``session=`` shares one session across calls.
  ``max_turns``, ``max_cost_usd`` (``price_per_mtok``) and the doom-loop guard hold
  across the run.
* **tool calls.** A reply's ``tool_calls`` are the turn's tool calls; the next
  request's ``ToolMessage`` s are their outcomes (``status="error"``, what LangGraph's
  ``ToolNode`` writes for a tool that raised, is a failed invocation the tool breaker
  counts). What a model cannot see: a tool that raised when the graph does not turn
  the error into a ``ToolMessage`` (``handle_tool_errors=False``) ends the graph run
  with no further request; tools the graph runs without a model's call.
* **a turn the engine ends** raises :class:`TurnFailed` naming its status.
* **streaming** (``astream``, LangGraph's ``stream_mode="messages"``): retried, waited
  and fallen back until the wrapped model's stream produced its first chunk, then
  passed through; a failure after that is never resent (``stream_interrupted``). A
  synchronous ``stream`` yields the whole reply as one chunk.
* **usage and cost on the AIMessage**: the wrapped model's ``usage_metadata``, and
  ``response_metadata["cost_usd"]`` when ``price_per_mtok`` is given.
* **sync** calls (``invoke``, a graph's ``invoke``) run the turn with
  ``asyncio.run`` (so not from inside a running event loop: use ``ainvoke`` there).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForLLMRun,
        CallbackManagerForLLMRun,
    )
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        AIMessageChunk,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
    from langchain_core.runnables import Runnable
    from langchain_core.runnables.config import ensure_config
    from pydantic import ConfigDict, PrivateAttr
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError(
        "statemachine.integrations.langchain needs langchain-core: "
        f"pip install 'turnstate[langchain]' ({exc})"
    ) from exc

from ..core._actions import Assemble, CallModel
from ..core._events import Assembled, CannotShrink, ModelFailed, ModelReplied
from ..core._exceptions import ConfigError
from ..core._model_error import ModelError
from ..core._session import Session
from ..core._settings import Settings
from ..core._taxonomy import ErrorCategory, ToolErrorCategory
from ..core._tool_calls import ToolCall, ToolOutcome
from ..core._usage import Usage
from ..io._providers import _label, _tokens, checked_prices
from ._bridge import (
    Bridge,
    CallResult,
    Run,
    TurnFailed,
    bridges,
    classify_raised,
    listed,
    model_names,
    outcome,
    settings_for,
    token_cost,
)

__all__ = ["EngineChatModel", "TurnFailed"]

MAX_RUNS = 256
"""Graph runs whose sessions an :class:`EngineChatModel` keeps (the oldest idle one is
let go)."""

_CLIENTS = ("client", "async_client", "root_client", "root_async_client")
"""ChatOpenAI's SDK clients, built from ``max_retries``: rebuilt, not copied."""


class EngineChatModel(BaseChatModel):
    """A LangChain chat model whose every request the engine decides. See the module
    docstring; ``models``: a chat model or a list of them, the first the default and
    the rest the fallback chain."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    models: list[BaseChatModel]
    engine_settings: Settings
    price_per_mtok: tuple[float, float] | None = None

    _names: tuple[str, ...] = PrivateAttr()
    _new_bridge: Callable[[], Bridge] = PrivateAttr()
    _shared: Run | None = PrivateAttr()
    _runs: collections.OrderedDict[Any, Run] = PrivateAttr()

    def __init__(
        self,
        models: BaseChatModel | Sequence[BaseChatModel],
        *,
        settings: Settings | None = None,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Any] | None = None,
        session: Session | None = None,
        price_per_mtok: tuple[float, float] | None = None,
        **fields: Any,
    ) -> None:
        chain = [models] if isinstance(models, Runnable) else listed(models)
        built = [_no_retries(model) for model in chain]
        names = model_names(built, _name_of(built))
        values: dict[str, Any] = {
            "models": built,
            "engine_settings": settings_for(settings, names),
            "price_per_mtok": checked_prices(price_per_mtok),
        }
        super().__init__(**values, **fields)
        self._names = names
        self._new_bridge, self._shared = bridges(
            self.engine_settings,
            seed=seed,
            clock=clock,
            wall_clock=wall_clock,
            sleep=sleep,
            session=session,
            failure=TurnFailed,
        )
        self._runs = collections.OrderedDict()

    @property
    def _llm_type(self) -> str:
        return "statemachine-engine"

    # -- which session ----------------------------------------------------------------

    def session(self, key: Any = None) -> Session | None:
        """The session of the graph run ``key`` (its ``thread_id``, else its first
        message's id; the shared one when ``session=`` was given; ``None``: unseen)."""
        if self._shared is not None:
            return self._shared.bridge.session
        run = self._runs.get(key)
        return None if run is None else run.bridge.session

    def _run(self, messages: list[BaseMessage]) -> Run:
        if self._shared is not None:
            return self._shared
        configurable = ensure_config().get("configurable") or {}
        key = configurable.get("thread_id") or (messages[0].id if messages else None)
        run = self._runs.get(key) if key is not None else None
        if run is None:
            run = Run(self._new_bridge())
            if key is None:  # no conversation to keep: a session for this request only
                return run
            self._runs[key] = run
            while len(self._runs) > MAX_RUNS:
                # a run still going is let go only when every other is too
                oldest = next(iter(self._runs))
                idle = (k for k, kept in self._runs.items() if not kept.bridge.busy)
                del self._runs[next(idle, oldest)]
        else:
            self._runs.move_to_end(key)
        return run

    # -- tools ----------------------------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        """Bind ``tools`` as each wrapped model binds them, at each request."""
        return self.bind(tools=list(tools), tool_choice=tool_choice, **kwargs)

    # -- requests -------------------------------------------------------------------

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,  # noqa: ARG002 - the base reports
        **kwargs: Any,
    ) -> ChatResult:
        return asyncio.run(self._request(messages, stop, kwargs, blocking=True))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,  # noqa: ARG002 - the base reports
        **kwargs: Any,
    ) -> ChatResult:
        return await self._request(messages, stop, kwargs, blocking=False)

    async def _request(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        *,
        blocking: bool,
    ) -> ChatResult:
        """One request, as one engine turn (``blocking``: the wrapped model's sync
        ``invoke``, from ``_generate``)."""
        run = self._run(messages)
        request = _Request(messages, stop, kwargs)
        _settle(run.bridge, messages)

        async def call(action: CallModel) -> CallResult[AIMessage]:
            name, runnable, sent = self._prepared(action, request)
            try:
                if blocking:
                    reply = runnable.invoke(sent, stop=stop)
                else:
                    reply = await runnable.ainvoke(sent, stop=stop)
            except Exception as exc:
                return self._failed(exc, name, streamed=False), None
            return self._event(reply, name, streamed=False)

        _, reply = await run.bridge.request(lambda action: _assemble(run, request, action), call)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,  # noqa: ARG002 - the base reports
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """One streamed request, as one engine turn: handed over at its first chunk; a
        failure after that is never resent."""
        run = self._run(messages)
        request = _Request(messages, stop, kwargs)
        _settle(run.bridge, messages)
        used: list[str] = []

        async def call(action: CallModel) -> CallResult[tuple[AIMessageChunk, AsyncIterator[Any]]]:
            name, runnable, sent = self._prepared(action, request)
            used[:] = [name]
            stream = aiter(runnable.astream(sent, stop=stop))
            try:
                first = await anext(stream)
            except Exception as exc:
                return self._failed(exc, name, streamed=True), None
            return None, (first, stream)

        turn, (first, stream) = await run.bridge.request(
            lambda action: _assemble(run, request, action), call
        )
        total: AIMessageChunk = first
        try:
            yield ChatGenerationChunk(message=first)
            async for piece in stream:
                total = total + piece
                yield ChatGenerationChunk(message=piece)
        except Exception as exc:
            usage = self._usage(total, used[0], streamed=True)
            if isinstance(exc, TurnFailed) or not _is_model_failure(exc):
                run.bridge.abandon(turn, exc, usage)
                raise
            broken = ModelFailed(
                classify_raised(exc), partial=True, cost=usage.cost_usd or 0.0, usage=usage
            )
            try:
                run.bridge.settle(turn, broken)
            except TurnFailed as failed:
                raise failed from exc
            raise
        except BaseException as exc:  # a cancel: what the stream reported is charged
            run.bridge.abandon(turn, exc, self._usage(total, used[0], streamed=True))
            raise
        event, _ = self._event(total, used[0], streamed=True)
        run.bridge.settle(turn, event)

    # -- one call ---------------------------------------------------------------------

    def _prepared(
        self, action: CallModel, request: _Request
    ) -> tuple[str, Runnable[Any, Any], list[BaseMessage]]:
        name = action.model or self._names[0]
        model = self.models[self._names.index(name)]
        kwargs = dict(request.kwargs)
        tools = kwargs.pop("tools", None)
        if kwargs.get("tool_choice") is None:
            kwargs.pop("tool_choice", None)
        runnable: Runnable[Any, Any] = model
        if tools and request.withhold:
            if any(isinstance(m, ToolMessage) for m in request.sent):
                runnable = model.bind_tools(tools, **{**kwargs, "tool_choice": "none"})
            elif kwargs:
                runnable = model.bind(**{k: v for k, v in kwargs.items() if k != "tool_choice"})
        elif tools:
            runnable = model.bind_tools(tools, **kwargs)
        elif kwargs:
            runnable = model.bind(**kwargs)
        return name, runnable, request.sent

    def _failed(self, exc: Exception, name: str, *, streamed: bool) -> ModelFailed:
        return ModelFailed(classify_raised(exc), usage=Usage(model=_label(name), streamed=streamed))

    def _event(
        self, reply: Any, name: str, *, streamed: bool
    ) -> tuple[ModelReplied | ModelFailed, AIMessage]:
        message = reply if isinstance(reply, AIMessage) else AIMessage(content=str(reply))
        usage = self._usage(message, name, streamed=streamed)
        if usage.cost_usd is not None:
            message.response_metadata["cost_usd"] = usage.cost_usd
        cost = usage.cost_usd or 0.0
        if message.response_metadata.get("finish_reason") == "content_filter":
            error = ModelError(
                ErrorCategory.CONTENT_FILTERED,
                "the reply was stopped by the content filter (finish_reason=content_filter)",
                code="content_filter",
                status=200,
            )
            return ModelFailed(error, cost=cost, usage=usage), message
        calls = tuple(
            ToolCall(
                call.get("id") or f"call-{index}", "tools", call["name"], call.get("args") or {}
            )
            for index, call in enumerate(message.tool_calls)
        )
        return ModelReplied(tool_calls=calls, cost=cost, usage=usage), message

    def _usage(self, message: Any, name: str, *, streamed: bool) -> Usage:
        counts = getattr(message, "usage_metadata", None) or {}
        details = counts.get("input_token_details") or {}
        tokens_in, tokens_out = (
            _tokens(counts.get("input_tokens")),
            _tokens(counts.get("output_tokens")),
        )
        metadata = getattr(message, "response_metadata", None) or {}
        return Usage(
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cached_tokens=_tokens(details.get("cache_read")),
            cache_creation_tokens=_tokens(details.get("cache_creation")),
            cost_usd=token_cost(self.price_per_mtok, tokens_in, tokens_out),
            model=_label(metadata.get("model_name") or name),
            response_id=_label(getattr(message, "id", None)),
            finish_reason=_label(metadata.get("finish_reason") or metadata.get("stop_reason")),
            streamed=streamed,
        )


class _Request:
    """One request as the engine assembles it."""

    def __init__(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]):
        self.messages = messages
        self.stop = stop
        self.kwargs = kwargs
        self.sent: list[BaseMessage] = messages
        self.withhold = False


def _name_of(models: list[BaseChatModel]) -> Callable[[BaseChatModel], str]:
    def name(model: BaseChatModel) -> str:
        for field in ("model_name", "model", "model_id"):
            value = getattr(model, field, None)
            if isinstance(value, str) and value:
                return value
        return f"{model._llm_type}-{models.index(model)}"  # noqa: SLF001 - LangChain's own name of it

    return name


def _no_retries(model: Any) -> BaseChatModel:
    """``model`` as the engine calls it: refused when it retries or falls back on its
    own above its SDK client, rebuilt with ``max_retries=0`` when it has one."""
    if isinstance(model, EngineChatModel):
        raise ConfigError(
            f"models: {model!r:.80} is an EngineChatModel already; wrap the models once "
            "(two engines would multiply the retries)"
        )
    if not isinstance(model, BaseChatModel):
        raise ConfigError(
            f"models: expected LangChain chat models (BaseChatModel), got {type(model).__name__}: "
            "a with_retry or with_fallbacks runnable retries or falls back where the engine "
            "cannot see it; give its models as the list instead: EngineChatModel([first, fallback])"
        )
    if "max_retries" not in type(model).model_fields or model.max_retries == 0:  # type: ignore[attr-defined]
        return model  # no SDK retries to switch off (None is the SDK's default, 2)
    given = {name: getattr(model, name) for name in model.model_fields_set if name not in _CLIENTS}
    return type(model)(**{**given, "max_retries": 0})


def _is_model_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a model call's failure (an SDK or HTTP error), not the graph's."""
    link: BaseException | None = exc
    while link is not None:
        if type(link).__module__.split(".")[0] in {"openai", "anthropic", "httpx", "httpcore"}:
            return True
        link = link.__cause__ or link.__context__
    return False


def _settle(bridge: Bridge, messages: list[BaseMessage]) -> None:
    """Send the previous reply's tool outcomes, read from the ToolMessages that bring them."""
    calls = {call.id: call for call in bridge.pending_calls}
    seen: dict[str, ToolOutcome] = {}
    for message in reversed(messages):
        if not isinstance(message, ToolMessage):
            break
        call = calls.get(message.tool_call_id)
        if call is not None:
            failed = message.status == "error"
            category = ToolErrorCategory.EXECUTION_FAILED if failed else None
            seen[call.id] = outcome(
                call, not failed, message.content, category, invoke_failed=failed
            )
    bridge.settle_tools(lambda call: seen.get(call.id))


def _head(messages: list[BaseMessage]) -> int:
    """Messages kept whatever is dropped: the system messages and the first prompt."""
    index = 0
    while index < len(messages) and isinstance(messages[index], SystemMessage):
        index += 1
    return min(index + 1, len(messages))


def _assemble(run: Run, request: _Request, action: Assemble) -> Assembled | CannotShrink:
    """The messages to send: the head, then the history from ``run.cut`` on (moved
    further on a reduction, only ever to a reply, so a tool call keeps its results),
    the engine's instruction appended."""
    messages = request.messages
    head = _head(messages)
    cuts = [
        index for index in range(head, len(messages) - 1) if isinstance(messages[index], AIMessage)
    ]
    if run.cut > 1 and run.cut not in cuts:  # another history than the cut was made in
        run.cut = 1
    if action.reduce:
        later = [index for index in cuts if index > run.cut]
        if not later:
            return CannotShrink()
        run.cut = later[len(later) // 2]
    sent = messages if run.cut == 1 else [*messages[:head], *messages[run.cut :]]
    if action.instruction:
        sent = [*sent, HumanMessage(content=action.instruction)]
    request.sent = sent
    request.withhold = action.withhold_tools
    return Assembled({"messages": len(sent), "dropped": len(messages) - len(sent)}, size=len(sent))
