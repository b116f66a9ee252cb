"""Ready-made model providers for the official ``anthropic`` and ``openai`` SDKs.

Optional extras: ``pip install 'turnstate[anthropic]'`` / ``'turnstate[openai]'``.
Nothing here imports an SDK; the providers take a client you built::

    model = AsyncAnthropicModel(anthropic.AsyncAnthropic(), model="claude-sonnet-4-5")
    finish = await sm.arun_turn(turn, model=model, tools=tools, context=context)

Each provider:

* owns **no retries**: the client is replaced by ``client.with_options(max_retries=0)``
  when its ``max_retries`` is not 0 (the engine is the one retry owner);
* builds the call from ``CallModel.request``, which is either a mapping of create
  arguments (``{"messages": [...], "tools": [...], "system": ...}``) or a bare
  list of messages, over the ``create_kwargs`` given at construction; the model is
  ``action.model`` (a fallback) or else the provider's ``model``;
* withholds tools when ``action.withhold_tools``: drops ``tools`` and
  ``tool_choice``, or, when the conversation already holds tool calls or results
  (which both APIs refuse without tool definitions), keeps ``tools`` and sets
  ``tool_choice`` to none (the
  final-answer turn);
* *returns* ``ModelFailed(content_filtered)`` for a refusal (Anthropic
  ``stop_reason == "refusal"``) or a content filter (OpenAI ``finish_reason ==
  "content_filter"`` or ``message.refusal``): the HTTP call succeeded, so nothing
  is raised, but the turn must end ``content_filtered``; SDK exceptions are left
  to the driver, which classifies them;
* maps tool-use blocks / tool calls to ``ToolCall``\\ s whose ``provider`` is
  ``tool_provider`` (a name, or a function of the tool name);
* streams when given ``on_text`` (async providers): text deltas go to it as they
  arrive, and a failure after one was delivered is returned as
  ``ModelFailed(..., partial=True)`` so the engine ends the turn
  ``stream_interrupted`` instead of resending;
* reports ``cost`` when given ``price_per_mtok=(input_usd, output_usd)`` per
  million tokens; the ``reply`` is the response as plain JSON (``model_dump``),
  so a session holding it can be snapshotted.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from ..core._actions import CallModel
from ..core._events import ModelFailed, ModelReplied
from ..core._model_error import ModelError
from ..core._taxonomy import ErrorCategory
from ..core._tool_calls import ToolCall
from ._classify import classify, plain_data

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


class _Base:
    """What the four providers share: construction, request building, costs."""

    def __init__(
        self,
        client: Any,
        *,
        model: str | None = None,
        tool_provider: ToolProviderName = "tools",
        price_per_mtok: tuple[float, float] | None = None,
        **create_kwargs: Any,
    ) -> None:
        if price_per_mtok is not None and (
            not isinstance(price_per_mtok, tuple)
            or len(price_per_mtok) != 2
            or not all(
                isinstance(p, int | float) and not isinstance(p, bool) and p >= 0
                for p in price_per_mtok
            )
        ):
            raise TypeError(
                "price_per_mtok: expected (input_usd, output_usd) per million tokens, "
                f"two numbers >= 0, got {price_per_mtok!r}"
            )
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

    def _cost(self, tokens_in: Any, tokens_out: Any) -> float:
        if self.price_per_mtok is None:
            return 0.0
        price_in, price_out = self.price_per_mtok
        return (
            float(tokens_in or 0) * price_in / 1_000_000
            + float(tokens_out or 0) * price_out / 1_000_000
        )


def _filtered(message: str, code: str, response: Any) -> ModelFailed:
    return ModelFailed(
        ModelError(
            ErrorCategory.CONTENT_FILTERED,
            message,
            code=code,
            status=200,
            body=plain_data(response),
        )
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

    def _kwargs(self, action: CallModel) -> dict[str, Any]:
        kwargs = super()._kwargs(action)
        kwargs.setdefault("max_tokens", 1024)
        return kwargs

    def _event(self, message: Any) -> ModelReplied | ModelFailed:
        if getattr(message, "stop_reason", None) == "refusal":
            return _filtered("the model refused (stop_reason=refusal)", "refusal", message)
        calls = tuple(
            ToolCall(block.id, self._provider_of(block.name), block.name, block.input)
            for block in getattr(message, "content", None) or ()
            if getattr(block, "type", None) == "tool_use"
        )
        usage = getattr(message, "usage", None)
        cost = self._cost(getattr(usage, "input_tokens", 0), getattr(usage, "output_tokens", 0))
        return ModelReplied(tool_calls=calls, cost=cost, reply=plain_data(message))


class AnthropicModel(_AnthropicBase):
    """A sync model provider on ``anthropic.Anthropic`` (``messages.create``).

    ``max_tokens`` defaults to 1024 unless the request or ``create_kwargs`` set it.
    """

    def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a refusal comes back as ``ModelFailed(content_filtered)``."""
        return self._event(self.client.messages.create(**self._kwargs(action)))


class _Streaming:
    """The streaming switch of the async providers.

    With ``on_text`` (a function or coroutine function of one text delta) the call
    streams and every text delta goes to it as it arrives. A failure *after* a delta
    was delivered comes back as ``ModelFailed(classify(exc), partial=True)``: the
    engine never resends it and ends the turn ``stream_interrupted``. A failure
    before any delta is raised, for the driver to classify and retry as usual.
    (A driver ``model_timeout_s`` cancels the call from outside and is not marked
    partial: with streaming, prefer the SDK client's own timeout.)
    """

    on_text: TextSink | None

    async def _deliver(self, text: str | None) -> None:
        if text and self.on_text is not None:
            result = self.on_text(text)
            if inspect.isawaitable(result):
                await result


class AsyncAnthropicModel(_AnthropicBase, _Streaming):
    """An asyncio model provider on ``anthropic.AsyncAnthropic``: ``messages.create``,
    or ``messages.stream`` when ``on_text`` is given (see :class:`_Streaming`)."""

    def __init__(self, client: Any, *, on_text: TextSink | None = None, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.on_text = on_text

    async def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a refusal comes back as ``ModelFailed(content_filtered)``."""
        kwargs = self._kwargs(action)
        if self.on_text is None:
            return self._event(await self.client.messages.create(**kwargs))
        delivered = False
        try:
            async with self.client.messages.stream(**kwargs) as stream:
                async for event in stream:
                    if getattr(event, "type", None) == "content_block_delta":
                        delivered = True
                        await self._deliver(getattr(event.delta, "text", None))
                message = await stream.get_final_message()
        except Exception as exc:
            if not delivered:
                raise
            return ModelFailed(classify(exc), partial=True)
        return self._event(message)


# -- OpenAI Chat Completions --------------------------------------------------------


def _arguments(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # the model wrote invalid JSON: the tool reports invalid_arguments


class _OpenAIBase(_Base):
    def _event(self, completion: Any) -> ModelReplied | ModelFailed:
        choices = getattr(completion, "choices", None) or ()
        if not choices:
            return ModelReplied(reply=plain_data(completion))
        choice = choices[0]
        message = getattr(choice, "message", None)
        if getattr(choice, "finish_reason", None) == "content_filter":
            return _filtered(
                "the reply was stopped by the content filter (finish_reason=content_filter)",
                "content_filter",
                completion,
            )
        refusal = getattr(message, "refusal", None)
        if isinstance(refusal, str) and refusal:
            return _filtered(refusal, "refusal", completion)
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
        usage = getattr(completion, "usage", None)
        cost = self._cost(
            getattr(usage, "prompt_tokens", 0), getattr(usage, "completion_tokens", 0)
        )
        return ModelReplied(tool_calls=calls, cost=cost, reply=plain_data(completion))


class OpenAIModel(_OpenAIBase):
    """A sync model provider on ``openai.OpenAI`` (``chat.completions.create``)."""

    def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a content filter comes back as ``ModelFailed(content_filtered)``."""
        return self._event(self.client.chat.completions.create(**self._kwargs(action)))


class AsyncOpenAIModel(_OpenAIBase, _Streaming):
    """An asyncio model provider on ``openai.AsyncOpenAI``: ``chat.completions.create``,
    streamed (``stream=True``, chunks accumulated by the SDK's
    ``ChatCompletionStreamState``) when ``on_text`` is given (see :class:`_Streaming`)."""

    def __init__(self, client: Any, *, on_text: TextSink | None = None, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.on_text = on_text

    async def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a content filter comes back as ``ModelFailed(content_filtered)``."""
        kwargs = self._kwargs(action)
        if self.on_text is None:
            return self._event(await self.client.chat.completions.create(**kwargs))
        from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: PLC0415

        state: Any = ChatCompletionStreamState()
        delivered = False
        try:
            stream = await self.client.chat.completions.create(**kwargs, stream=True)
            async with stream:
                async for chunk in stream:
                    state.handle_chunk(chunk)
                    for choice in getattr(chunk, "choices", None) or ():
                        delta = getattr(choice, "delta", None)
                        if getattr(delta, "content", None) or getattr(delta, "tool_calls", None):
                            delivered = True
                        await self._deliver(getattr(delta, "content", None))
            completion = state.get_final_completion()
        except Exception as exc:
            if not delivered:
                raise
            return ModelFailed(classify(exc), partial=True)
        return self._event(completion)
