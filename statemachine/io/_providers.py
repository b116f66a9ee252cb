"""Ready-made model providers for the official ``anthropic`` and ``openai`` SDKs.

Optional extras: ``pip install 'turnstate[anthropic]'`` / ``'turnstate[openai]'``.
Nothing here imports an SDK; the providers take a client you built::

    model = AsyncAnthropicModel(anthropic.AsyncAnthropic(), model="claude-sonnet-4-5")
    finish = await sm.arun_turn(turn, model=model, tools=tools, context=context)

Each provider switches the client's own retries off (the engine is the one retry
owner), builds the call from ``CallModel.request`` over its ``create_kwargs`` (the
model: ``action.model``, else the request's, else its ``model=``), and *returns* what
went wrong rather than raising it: ``ModelFailed(content_filtered)`` for a refusal or
a content filter (the HTTP call succeeded), ``ModelFailed(classify(exc))`` for an
exception the SDK raised. Streamed (the async ones, given ``on_text``), a failure
after text was delivered is ``partial=True`` (the turn ends ``stream_interrupted``),
and one after the stream reported its usage carries that usage, so it is charged.

Every event carries a :class:`~statemachine.Usage` of what the response reported (what
is missing, or not a count or a short string, is ``None``: reading it never raises)
and where the call went (``provider_name``: ``openai``, ``anthropic`` or the SDKs'
Azure, Bedrock and Vertex clients'; the ``base_url``'s host and port; ``streamed``),
priced with ``price_per_mtok=(input_usd, output_usd)`` per million tokens (every prompt
token, cached or not, at the input price). A stream's usage is counted once whatever
shape its chunks report it in (:mod:`statemachine.io._stream_usage`). The reply is the
response as plain JSON (``model_dump``). ``docs/drivers.md`` shows them at work.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..core._actions import CallModel
from ..core._events import ModelFailed, ModelReplied
from ..core._json_data import MAX_COUNT, finite
from ..core._tool_calls import ToolCall
from ..core._usage import MAX_PORT, MAX_TEXT, Usage
from ._classify import classify, plain_data, refused
from ._loop import report_usage
from ._stream_usage import StreamUsage, Tokens, plus

__all__ = ["AnthropicModel", "AsyncAnthropicModel", "AsyncOpenAIModel", "OpenAIModel"]

ToolProviderName = str | Callable[[str], str]
TextSink = Callable[[str], Any]
"""Receives each streamed text delta; may be a coroutine function."""


def _no_sdk_retries(client: Any) -> Any:
    retries = getattr(client, "max_retries", None)
    if retries is None or not callable(getattr(client, "with_options", None)):
        raise TypeError(
            f"client: expected an official SDK client (with max_retries and with_options), "
            f"got {client!r}"
        )
    return client if retries == 0 else client.with_options(max_retries=0)


# -- reading a response's usage, whatever its shape ------------------------------------


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` (or ``obj[name]`` of a mapping); ``None`` when absent or unreadable."""
    if obj is None:
        return None
    try:
        if isinstance(obj, Mapping):
            return obj.get(name)
        return getattr(obj, name, None)
    except Exception:  # a property that raises (an SDK snapshot not started yet)
        return None


def _tokens(value: Any) -> int | None:
    """A token count as reported: an int >= 0 (a whole float too), else unknown."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        return None
    return int(value)


def _label(value: Any) -> str | None:
    """A model name, response id or finish reason as reported: a short str, else unknown."""
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return None
    return str.__str__(value)


def _is_price(value: Any) -> bool:
    """Whether ``value`` is a price per million tokens: a finite number >= 0."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and finite(value)
        and value >= 0
    )


def _reported(usage: Usage) -> bool:
    """Whether the response reported a token count (so the call may have been billed)."""
    return usage.input_tokens is not None or usage.output_tokens is not None


def checked_prices(price_per_mtok: object) -> tuple[float, float] | None:
    """``price_per_mtok`` (input and output USD per million tokens, or ``None``), or
    ``TypeError`` naming it."""
    if price_per_mtok is not None and (
        not isinstance(price_per_mtok, tuple)
        or len(price_per_mtok) != 2
        or not all(_is_price(price) for price in price_per_mtok)
    ):
        raise TypeError(
            "price_per_mtok: expected (input_usd, output_usd) per million tokens, "
            f"two finite numbers >= 0, got {price_per_mtok!r}"
        )
    return price_per_mtok


def _charged(usage: Usage) -> float:
    """The ``cost`` of an event carrying ``usage`` (its ``cost_usd``, or 0.0 unknown)."""
    return usage.cost_usd or 0.0


_SCHEME_PORTS = {"https": 443, "http": 80}

_CLIENT_PROVIDERS = (
    ("azure", "azure.ai.openai"),
    ("bedrock", "aws.bedrock"),
    ("vertex", "gcp.vertex_ai"),
)
"""A word of the SDK client's class name, and the GenAI provider name it stands for (the
SDKs' ``AzureOpenAI``, ``AnthropicBedrock``, ``AnthropicVertex`` and their async twins)."""


def _where(client: Any, provider: str) -> tuple[str, str | None, int | None]:
    """The GenAI provider name of ``client`` (``provider`` unless its class is one of the
    SDKs' cloud clients) and the host and port of its ``base_url``: (name, host, port),
    each unknown (``None``) when unreadable."""
    kind = type(client).__name__.lower()
    name = next((named for word, named in _CLIENT_PROVIDERS if word in kind), provider)
    url = _field(client, "base_url")
    if url is None:
        return name, None, None
    try:
        parts = urlsplit(str(url))
        port = parts.port or _SCHEME_PORTS.get(parts.scheme)
    except ValueError:  # a port out of range, a malformed netloc
        return name, None, None
    host = _label(parts.hostname)
    if not host:
        return name, None, None
    return name, host, port if port is not None and 0 < port <= MAX_PORT else None


class _Base:
    """What the four providers share: construction, request building, usage and costs."""

    def __init__(
        self,
        client: Any,
        *,
        model: str | None = None,
        tool_provider: ToolProviderName = "tools",
        price_per_mtok: tuple[float, float] | None = None,
        **create_kwargs: Any,
    ) -> None:
        price_per_mtok = checked_prices(price_per_mtok)
        if not (isinstance(tool_provider, str) and tool_provider) and not callable(tool_provider):
            raise TypeError(
                f"tool_provider: expected a provider name or a function of the tool name, "
                f"got {tool_provider!r}"
            )
        self.client = _no_sdk_retries(client)
        self.model = model
        self.tool_provider = tool_provider
        self.price_per_mtok = price_per_mtok
        self.create_kwargs = create_kwargs
        self._where = _where(self.client, self._provider)

    _provider = "openai"
    """The GenAI provider name of the API's own clients."""
    streams = False
    """Whether this provider's calls stream (the async ones given ``on_text``)."""

    def _kwargs(self, action: CallModel) -> dict[str, Any]:
        request = action.request
        kwargs = dict(self.create_kwargs)
        if isinstance(request, Mapping):
            kwargs.update(request)
        elif isinstance(request, list | tuple):
            kwargs["messages"] = list(request)
        else:
            raise TypeError(
                f"CallModel.request: expected a mapping of create arguments or a list of "
                f"messages, got {request!r}"
            )
        model = action.model or kwargs.get("model") or self.model
        if not model:
            raise TypeError(
                "model: no model named (CallModel.model, the request, or the provider's model=)"
            )
        kwargs["model"] = model
        if action.withhold_tools:
            kwargs.pop("tool_choice", None)
            if "tools" in kwargs and _has_tool_history(kwargs.get("messages")):
                # The APIs refuse tool_use / tool_result history without tool
                # definitions: keep the definitions, forbid their use.
                kwargs["tool_choice"] = self._no_tool_choice
            else:
                kwargs.pop("tools", None)
        return kwargs

    _no_tool_choice: Any = "none"

    def _provider_of(self, name: str) -> str:
        chosen = self.tool_provider
        return chosen if isinstance(chosen, str) else chosen(name)

    def _cost(self, tokens_in: int | None, tokens_out: int | None) -> float | None:
        """What the tokens cost at ``price_per_mtok``; ``None`` without a price or a count."""
        if self.price_per_mtok is None or (tokens_in is None and tokens_out is None):
            return None
        price_in, price_out = (float(price) for price in self.price_per_mtok)
        cost = (tokens_in or 0) * price_in / 1_000_000 + (tokens_out or 0) * price_out / 1_000_000
        return cost if math.isfinite(cost) else sys.float_info.max

    def _usage(self, **reported: Any) -> Usage:
        """A :class:`Usage` of what a response ``reported`` (token counts; its model,
        response id and finish reason as reported, checked here), priced, saying where
        the call went."""
        provider, address, port = self._where
        for name in ("model", "response_id", "finish_reason"):
            reported[name] = _label(reported.get(name))
        return Usage(
            **reported,
            cost_usd=self._cost(reported.get("input_tokens"), reported.get("output_tokens")),
            provider_name=provider,
            server_address=address,
            server_port=port,
            streamed=self.streams,
        )

    def _raised(self, exc: Exception) -> ModelFailed:
        """The event of an SDK call that raised ``exc``: what a driver would send
        (``ModelFailed(classify(exc))``), with a usage saying where the call went."""
        return ModelFailed(classify(exc), usage=self._usage())

    def _answer(
        self, create: Callable[..., Any], kwargs: dict[str, Any]
    ) -> ModelReplied | ModelFailed:
        """The event of ``create(**kwargs)``, a sync SDK call."""
        try:
            response = create(**kwargs)
        except Exception as exc:
            return self._raised(exc)
        return self._event(response)

    async def _aanswer(
        self, create: Callable[..., Any], kwargs: dict[str, Any]
    ) -> ModelReplied | ModelFailed:
        """The event of ``await create(**kwargs)``, an async SDK call."""
        try:
            response = await create(**kwargs)
        except Exception as exc:
            return self._raised(exc)
        return self._event(response)

    def _event(self, response: Any) -> ModelReplied | ModelFailed:
        raise NotImplementedError  # pragma: no cover - each API reads its own

    def _usage_of(self, response: Any, reported: Any = None) -> Usage:
        """The :class:`Usage` of ``response`` (``reported``: a usage object seen apart
        from it, in a stream); never raises: what cannot be read is ``None``."""
        try:
            return self._read_usage(response, reported)
        except Exception:  # every field is checked on the way; a last resort
            return Usage()

    def _read_usage(self, response: Any, reported: Any) -> Usage:
        raise NotImplementedError  # pragma: no cover - each API reads its own


def _replied(response: Any, usage: Usage, calls: tuple[ToolCall, ...] = ()) -> ModelReplied:
    return ModelReplied(
        tool_calls=calls, cost=_charged(usage), reply=plain_data(response), usage=usage
    )


def _filtered(message: str, code: str, response: Any, usage: Usage) -> ModelFailed:
    return ModelFailed(
        refused(message, code, plain_data(response)), cost=_charged(usage), usage=usage
    )


def _has_tool_history(messages: Any) -> bool:
    """Whether a conversation already holds tool calls or results (either API's form)."""
    if not isinstance(messages, list | tuple):
        return False
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        if message.get("role") == "tool" or message.get("tool_calls"):
            return True
        content = message.get("content")
        if isinstance(content, list | tuple) and any(
            isinstance(block, Mapping) and block.get("type") in {"tool_use", "tool_result"}
            for block in content
        ):
            return True
    return False


# -- Anthropic Messages -------------------------------------------------------------


class _AnthropicBase(_Base):
    _no_tool_choice: Any = {"type": "none"}  # noqa: RUF012 - a constant, never mutated
    _provider = "anthropic"

    def _kwargs(self, action: CallModel) -> dict[str, Any]:
        kwargs = super()._kwargs(action)
        kwargs.setdefault("max_tokens", 1024)
        return kwargs

    def _read_usage(self, response: Any, reported: Any) -> Usage:
        """Anthropic's ``usage.input_tokens`` counts only the prompt tokens neither read
        from nor written to the prompt cache; the ``Usage.input_tokens`` reported is the
        whole prompt: ``input_tokens + cache_read_input_tokens +
        cache_creation_input_tokens`` (the cache counts that are present), and
        ``cached_tokens`` is ``cache_read_input_tokens``. Unknown when
        ``input_tokens`` is."""
        usage = reported if reported is not None else _field(response, "usage")
        uncached = _tokens(_field(usage, "input_tokens"))
        read = _tokens(_field(usage, "cache_read_input_tokens"))
        written = _tokens(_field(usage, "cache_creation_input_tokens"))
        prompt = None if uncached is None else _tokens(uncached + (read or 0) + (written or 0))
        return self._usage(
            input_tokens=prompt,
            output_tokens=_tokens(_field(usage, "output_tokens")),
            cached_tokens=read,
            model=_field(response, "model"),
            response_id=_field(response, "id"),
            finish_reason=_field(response, "stop_reason"),
            cache_creation_tokens=written,
        )

    def _event(self, message: Any) -> ModelReplied | ModelFailed:
        usage = self._usage_of(message)
        if getattr(message, "stop_reason", None) == "refusal":
            return _filtered("the model refused (stop_reason=refusal)", "refusal", message, usage)
        calls = tuple(
            ToolCall(block.id, self._provider_of(block.name), block.name, block.input)
            for block in getattr(message, "content", None) or ()
            if getattr(block, "type", None) == "tool_use"
        )
        return _replied(message, usage, calls)


class AnthropicModel(_AnthropicBase):
    """A sync model provider on ``anthropic.Anthropic`` (``messages.create``).

    ``max_tokens`` defaults to 1024 unless the request or ``create_kwargs`` set it.
    """

    def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a refusal comes back as ``ModelFailed(content_filtered)``."""
        return self._answer(self.client.messages.create, self._kwargs(action))


class _Streaming(_Base):
    """The streaming switch of the async providers: with ``on_text`` (a function or
    coroutine function of one text delta) the call streams, and a failure comes back
    as the module docstring says; one before any delta or usage as a driver sends it,
    ``ModelFailed(classify(exc))``. (A driver ``model_timeout_s`` cancels the call from
    outside and is neither marked partial nor charged: with streaming, prefer the SDK
    client's own timeout.)"""

    def __init__(self, client: Any, *, on_text: TextSink | None = None, **kwargs: Any) -> None:
        self.streams = on_text is not None
        super().__init__(client, **kwargs)
        self.on_text = on_text

    async def _deliver(self, text: str | None) -> None:
        if text and self.on_text is not None:
            result = self.on_text(text)
            if inspect.isawaitable(result):
                await result

    def _interrupted(
        self, exc: asyncio.CancelledError | Exception, delivered: bool, usage: Usage
    ) -> ModelFailed:
        """The event of a stream ``exc`` interrupted, given whether text was
        ``delivered`` and the ``usage`` it reported so far. A cancel is re-raised,
        having said what the call was billed (the turn's ``Cancelled`` charges it)."""
        if isinstance(exc, asyncio.CancelledError):
            if _reported(usage):
                report_usage(usage)
            raise exc
        if not (delivered or _reported(usage)):
            return self._raised(exc)
        return ModelFailed(classify(exc), partial=delivered, cost=_charged(usage), usage=usage)


class AsyncAnthropicModel(_Streaming, _AnthropicBase):
    """An asyncio model provider on ``anthropic.AsyncAnthropic``: ``messages.create``,
    or ``messages.stream`` when ``on_text`` is given (see :class:`_Streaming`)."""

    async def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a refusal comes back as ``ModelFailed(content_filtered)``."""
        kwargs = self._kwargs(action)
        if self.on_text is None:
            return await self._aanswer(self.client.messages.create, kwargs)
        delivered = False
        stream: Any = None
        started: Any = None  # the message of message_start, should the snapshot be unreadable
        try:
            async with self.client.messages.stream(**kwargs) as stream:
                async for event in stream:
                    kind = getattr(event, "type", None)
                    if kind == "message_start":
                        started = getattr(event, "message", None)
                    elif kind == "content_block_delta":
                        delivered = True
                        await self._deliver(getattr(event.delta, "text", None))
                message = await stream.get_final_message()
        except (asyncio.CancelledError, Exception) as exc:
            # The snapshot's property asserts that message_start arrived: _field reads
            # it as None before.
            snapshot = _field(stream, "current_message_snapshot")
            usage = self._usage_of(started if snapshot is None else snapshot)
            return self._interrupted(exc, delivered, usage)
        return self._event(message)


# -- OpenAI Chat Completions --------------------------------------------------------


def _arguments(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # the model wrote invalid JSON: the tool reports invalid_arguments


_OPENAI_COUNTS = {
    "input_tokens": ("prompt_tokens",),
    "output_tokens": ("completion_tokens",),
    "cached_tokens": ("prompt_tokens_details", "cached_tokens"),
    "reasoning_tokens": ("completion_tokens_details", "reasoning_tokens"),
}
"""Each count of an OpenAI usage: the :class:`Usage` field, and where the usage holds it."""


def _openai_count(usage: Any, path: tuple[str, ...]) -> int | None:
    for name in path:
        usage = _field(usage, name)
    return _tokens(usage)


def _openai_tokens(usage: Any) -> Tokens:
    return (
        _openai_count(usage, _OPENAI_COUNTS["input_tokens"]),
        _openai_count(usage, _OPENAI_COUNTS["output_tokens"]),
    )


def _openai_sum(first: Any, second: Any) -> dict[str, Any]:
    """Two OpenAI usages (SDK objects or mappings) added up, as a mapping of their shape."""
    summed: dict[str, Any] = {}
    for path in _OPENAI_COUNTS.values():
        total = plus(_openai_count(first, path), _openai_count(second, path))
        if len(path) == 1:
            summed[path[0]] = total
        else:
            summed.setdefault(path[0], {})[path[1]] = total
    return summed


class _OpenAIBase(_Base):
    def _read_usage(self, response: Any, reported: Any) -> Usage:
        usage = reported if reported is not None else _field(response, "usage")
        choices = _field(response, "choices")
        first = choices[0] if isinstance(choices, list | tuple) and choices else None
        counts = {name: _openai_count(usage, path) for name, path in _OPENAI_COUNTS.items()}
        return self._usage(
            **counts,
            model=_field(response, "model"),
            response_id=_field(response, "id"),
            finish_reason=_field(first, "finish_reason"),
        )

    def _event(self, completion: Any, reported: Any = None) -> ModelReplied | ModelFailed:
        """The event of ``completion``; ``reported``: the usage a stream reported."""
        usage = self._usage_of(completion, reported)
        choices = getattr(completion, "choices", None) or ()
        if not choices:
            return _replied(completion, usage)
        choice = choices[0]
        message = getattr(choice, "message", None)
        if getattr(choice, "finish_reason", None) == "content_filter":
            return _filtered(
                "the reply was stopped by the content filter (finish_reason=content_filter)",
                "content_filter",
                completion,
                usage,
            )
        refusal = getattr(message, "refusal", None)
        if isinstance(refusal, str) and refusal:
            return _filtered(refusal, "refusal", completion, usage)
        calls = tuple(
            ToolCall(
                call.id,
                self._provider_of(call.function.name),
                call.function.name,
                _arguments(call.function.arguments),
            )
            for call in getattr(message, "tool_calls", None) or ()
            if getattr(call, "function", None) is not None
        )
        return _replied(completion, usage, calls)


class OpenAIModel(_OpenAIBase):
    """A sync model provider on ``openai.OpenAI`` (``chat.completions.create``)."""

    def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a content filter comes back as ``ModelFailed(content_filtered)``."""
        return self._answer(self.client.chat.completions.create, self._kwargs(action))


class AsyncOpenAIModel(_Streaming, _OpenAIBase):
    """An asyncio model provider on ``openai.AsyncOpenAI``: ``chat.completions.create``,
    streamed (``stream=True``, chunks accumulated by the SDK's
    ``ChatCompletionStreamState``) when ``on_text`` is given (see :class:`_Streaming`).

    A stream reports its usage only when asked: the provider asks
    (``stream_options={"include_usage": True}``) unless ``create_kwargs`` or the request
    set ``stream_options`` themselves (``stream_options=None`` for a server that
    refuses the option: its streamed calls are then not charged)."""

    async def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a content filter comes back as ``ModelFailed(content_filtered)``."""
        kwargs = self._kwargs(action)
        if self.on_text is None:
            return await self._aanswer(self.client.chat.completions.create, kwargs)
        from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: PLC0415

        state: Any = ChatCompletionStreamState()
        delivered = False
        # The snapshot's usage is the *last* chunk's (None when that chunk had none):
        # count every usage a chunk reported, once whatever the stream's shape.
        counted: StreamUsage[Any] = StreamUsage(_openai_tokens, _openai_sum)
        try:
            if "stream_options" not in kwargs:  # usage is reported only when asked
                kwargs["stream_options"] = {"include_usage": True}
            elif kwargs["stream_options"] is None:
                del kwargs["stream_options"]
            stream = await self.client.chat.completions.create(**kwargs, stream=True)
            async with stream:
                async for chunk in stream:
                    chunk_usage = _field(chunk, "usage")
                    if chunk_usage is not None:
                        counted.see(chunk_usage)
                    state.handle_chunk(chunk)
                    for choice in getattr(chunk, "choices", None) or ():
                        delta = getattr(choice, "delta", None)
                        if getattr(delta, "content", None) or getattr(delta, "tool_calls", None):
                            delivered = True
                        await self._deliver(getattr(delta, "content", None))
            completion = state.get_final_completion()
        except (asyncio.CancelledError, Exception) as exc:
            # The snapshot's property asserts that a chunk arrived: _field reads it as
            # None before.
            usage = self._usage_of(_field(state, "current_completion_snapshot"), counted.total)
            return self._interrupted(exc, delivered, usage)
        return self._event(completion, counted.total)
