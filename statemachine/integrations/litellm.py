"""Model providers over LiteLLM: :class:`LiteLLMModel` and :class:`AsyncLiteLLMModel`.

``pip install 'turnstate[litellm]'``. One call shape for the providers LiteLLM reaches,
``litellm.completion`` / ``litellm.acompletion``, or a ``litellm.Router``'s::

    model = AsyncLiteLLMModel("anthropic/claude-sonnet-4-5")
    model = AsyncLiteLLMModel("gpt-main", router=router)   # a Router's model group
    finish = await sm.arun_turn(turn, model=model, tools=tools, context=context)

They are the OpenAI providers of :mod:`statemachine.io._providers` (LiteLLM answers in
OpenAI's shape), with these differences:

* **no retries but the engine's.** Every call carries ``num_retries=0`` (LiteLLM's own
  retry wrapper) and ``max_retries=0`` (the SDK client it builds); through a Router also
  ``fallbacks=[]``, ``context_window_fallbacks=[]`` and ``content_policy_fallbacks=[]``,
  the Router's per-request overrides, so its retries and fallbacks are off for these
  calls whatever it was built with: the fallback chain is ``Settings.fallback_models``,
  naming model groups. ``create_kwargs`` that would retry or fall back (``num_retries``,
  ``retry_policy``, ``fallbacks``...) are refused with ``ConfigError``, and so is a call
  while LiteLLM's process-wide ``litellm.num_retries`` or ``litellm.model_fallbacks`` is
  set (its sync path reads ``num_retries=0`` as unset and takes the global). A Router
  still cools down a deployment that failed and routes the group's next call to
  another of its deployments: that is load balancing within one model, not a retry; a
  group whose every deployment is cooling down answers LiteLLM's "No deployments
  available" (a 429), which the engine waits out as a rate limit.
* **LiteLLM's exceptions, classified by the vendor's answer inside them**
  (:func:`classify_litellm`): LiteLLM maps a vendor error to its own exception type and
  keeps the original in the exception chain (the ``openai`` SDK's error, or the
  ``httpx`` error of the providers it calls over HTTP itself), whose body and headers
  (the vendor's code, its ``retry-after``) are what :func:`~statemachine.classify`
  reads; an error of LiteLLM's own (a Router with no deployment free) is read from its
  status, the headers LiteLLM kept and its message.
* **cost.** ``price_per_mtok`` when given; else LiteLLM's own cost of the response
  (``response._hidden_params["response_cost"]``, else ``litellm.completion_cost``), for
  a model its price map knows; unknown otherwise.
* **streaming** (:class:`AsyncLiteLLMModel` given ``on_text``): ``stream=True`` with
  ``stream_options={"include_usage": True}`` unless set; the reply is LiteLLM's
  ``stream_chunk_builder`` of the chunks, its usage the chunks' usages counted once
  whatever their shape (:mod:`statemachine.io._stream_usage`); a failure after text was
  delivered is ``partial`` (never resent), a cancel charges what the stream reported
  (:func:`~statemachine.io._loop.report_usage`), as the OpenAI provider does.

``import litellm`` takes seconds and, unless ``LITELLM_LOCAL_MODEL_COST_MAP=True`` is
set, fetches LiteLLM's price map from the network: it is imported when a provider is
built, not when this module is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ..core._actions import CallModel
from ..core._events import ModelFailed, ModelReplied
from ..core._exceptions import ConfigError
from ..core._model_error import ModelError
from ..core._usage import Usage
from ..io._classify import classify
from ..io._loop import report_usage
from ..io._providers import (
    TextSink,
    ToolProviderName,
    _charged,
    _field,
    _is_price,
    _openai_sum,
    _openai_tokens,
    _OpenAIBase,
    _reported,
    _Streaming,
)
from ..io._stream_usage import StreamUsage
from ._bridge import _chain

__all__ = ["AsyncLiteLLMModel", "LiteLLMModel", "classify_litellm"]

_SDK_ROOTS = frozenset({"openai", "anthropic", "httpx", "httpx2"})
"""Top-level packages of the vendor errors LiteLLM wraps."""

RETRY_KNOBS = frozenset(
    {
        "num_retries",
        "max_retries",
        "retry_policy",
        "fallbacks",
        "context_window_fallbacks",
        "content_policy_fallbacks",
        "context_window_fallback_dict",
        "model_group_retry_policy",
    }
)
"""LiteLLM's and the Router's call arguments that retry or fall back."""


def _litellm() -> Any:
    try:
        import litellm  # noqa: PLC0415 - seconds to import: only once a provider is built
    except ImportError as exc:
        raise ImportError(
            "statemachine.integrations.litellm needs litellm: "
            f"pip install 'turnstate[litellm]' ({exc})"
        ) from exc
    return litellm


def _no_global_retries(litellm: Any) -> None:
    """Refuse LiteLLM's process-wide retries and fallbacks (see the module docstring)."""
    for name in ("num_retries", "model_fallbacks"):
        if getattr(litellm, name, None):
            raise ConfigError(
                f"litellm.{name} is set ({getattr(litellm, name)!r:.80}): LiteLLM would retry "
                "or fall back around the engine; set it to None (the engine is the one retry "
                "owner: Settings.max_retries, Settings.fallback_models)"
            )


class _Calls:
    """What the providers call (their ``client``): ``litellm``'s functions or a Router's,
    every call with LiteLLM's retries and the Router's fallbacks off."""

    max_retries = 0
    """Read by the providers' check: these calls never retry on their own."""

    def __init__(self, router: Any, base_url: Any) -> None:
        self.litellm = _litellm()
        self.target = self.litellm if router is None else router
        self.base_url = base_url
        self.off: dict[str, Any] = {"num_retries": 0, "max_retries": 0}
        if router is not None:
            self.off.update(fallbacks=[], context_window_fallbacks=[], content_policy_fallbacks=[])

    def with_options(self, **_options: Any) -> _Calls:
        return self

    def completion(self, **kwargs: Any) -> Any:
        return self.target.completion(**kwargs, **self.off)

    async def acompletion(self, **kwargs: Any) -> Any:
        return await self.target.acompletion(**kwargs, **self.off)


def classify_litellm(exc: BaseException) -> ModelError:
    """The engine's error for an exception a LiteLLM call raised: the vendor error it
    wraps (its exception chain) when there is one, else its status, the response
    headers LiteLLM kept and its body or message; never raises."""
    for link in _chain(exc):
        if type(link).__module__.split(".")[0] in _SDK_ROOTS:
            return classify(link)
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int) or isinstance(status, bool):
        return classify(exc)
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = _field(getattr(exc, "response", None), "headers")
    body = getattr(exc, "body", None) or getattr(exc, "message", None) or str(exc)
    return classify((status, headers, body))


def _cost(response: Any) -> float | None:
    """LiteLLM's own cost of ``response``; ``None`` for a model its price map lacks."""
    hidden = getattr(response, "_hidden_params", None)
    known: Any = hidden.get("response_cost") if isinstance(hidden, Mapping) else None
    if known is None and response is not None:
        try:
            known = _litellm().completion_cost(completion_response=response)
        except Exception:  # a model LiteLLM has no price for
            return None
    return float(known) if _is_price(known) else None


class _LiteLLMBase(_OpenAIBase):
    """What both providers share; ``model``: a LiteLLM model name (``openai/gpt-5``,
    ``anthropic/...``) or, with ``router``, a model group; ``model_kwargs``: call
    arguments of one model by its name, over ``create_kwargs`` (a fallback's own
    ``api_base`` and ``api_key``)."""

    _provider = "litellm"

    def __init__(
        self,
        model: str | None = None,
        *,
        router: Any = None,
        tool_provider: ToolProviderName = "tools",
        price_per_mtok: tuple[float, float] | None = None,
        model_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        **create_kwargs: Any,
    ) -> None:
        self.model_kwargs = {name: dict(given) for name, given in (model_kwargs or {}).items()}
        named = set(create_kwargs).union(*self.model_kwargs.values())
        refused = sorted(RETRY_KNOBS & named)
        if refused:
            raise ConfigError(
                f"create_kwargs / model_kwargs: {', '.join(refused)} would retry or fall back "
                "inside LiteLLM; the engine is the one retry owner (Settings.max_retries, "
                "Settings.fallback_models)"
            )
        if router is not None and not callable(getattr(router, "acompletion", None)):
            raise ConfigError(f"router: expected a litellm.Router, got {router!r:.80}")
        base_url = create_kwargs.get("api_base") or create_kwargs.get("base_url")
        super().__init__(
            _Calls(router, base_url),
            model=model,
            tool_provider=tool_provider,
            price_per_mtok=price_per_mtok,
            **create_kwargs,
        )
        self.router = router

    def _kwargs(self, action: CallModel) -> dict[str, Any]:
        """The call's arguments; ``ConfigError`` (raised, before anything is sent) while
        LiteLLM's process-wide retries or fallbacks are set."""
        _no_global_retries(self.client.litellm)
        kwargs = super()._kwargs(action)
        kwargs.update(self.model_kwargs.get(kwargs["model"], ()))
        return kwargs

    def _raised(self, exc: Exception) -> ModelFailed:
        return ModelFailed(classify_litellm(exc), usage=self._usage())

    def _read_usage(self, response: Any, reported: Any) -> Usage:
        usage = super()._read_usage(response, reported)
        if usage.cost_usd is None and _reported(usage):
            usage = attrs.evolve(usage, cost_usd=_cost(response))
        return usage


class LiteLLMModel(_LiteLLMBase):
    """A sync model provider on ``litellm.completion`` (or ``router.completion``)."""

    def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a content filter comes back as ``ModelFailed(content_filtered)``."""
        return self._answer(self.client.completion, self._kwargs(action))


class AsyncLiteLLMModel(_Streaming, _LiteLLMBase):
    """An asyncio model provider on ``litellm.acompletion`` (or ``router.acompletion``),
    streamed when ``on_text`` is given (see the module docstring)."""

    def __init__(self, model: str | None = None, *, on_text: TextSink | None = None, **kwargs: Any):
        super().__init__(model, on_text=on_text, **kwargs)

    async def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        """Call the model; a content filter comes back as ``ModelFailed(content_filtered)``."""
        kwargs = self._kwargs(action)
        if self.on_text is None:
            return await self._aanswer(self.client.acompletion, kwargs)
        if "stream_options" not in kwargs:  # usage is reported only when asked
            kwargs["stream_options"] = {"include_usage": True}
        elif kwargs["stream_options"] is None:
            del kwargs["stream_options"]
        chunks: list[Any] = []
        delivered = False
        # only what the chunks reported counts: the builder's usage of a stream that
        # reported none is LiteLLM's own estimate, not what was billed
        counted: StreamUsage[Any] = StreamUsage(_openai_tokens, _openai_sum)
        built = self._built(chunks, kwargs)

        def reported() -> Any:
            return {} if counted.total is None else counted.total

        try:
            stream = await self.client.acompletion(**kwargs, stream=True)
            async for chunk in stream:
                chunks.append(chunk)
                chunk_usage = _field(chunk, "usage")
                if chunk_usage is not None:
                    counted.see(chunk_usage)
                for choice in _field(chunk, "choices") or ():
                    delta = _field(choice, "delta")
                    if _field(delta, "content") or _field(delta, "tool_calls"):
                        delivered = True
                    await self._deliver(_field(delta, "content"))
            completion = built()
        except asyncio.CancelledError:
            usage = self._usage_of(built(), reported())
            if _reported(usage):
                report_usage(usage)  # the turn's Cancelled charges what was billed
            raise
        except Exception as exc:
            usage = self._usage_of(built(), reported())
            if not (delivered or _reported(usage)):
                return self._raised(exc)
            error = classify_litellm(exc)
            return ModelFailed(error, partial=delivered, cost=_charged(usage), usage=usage)
        return self._event(completion, reported())

    def _built(self, chunks: list[Any], kwargs: dict[str, Any]) -> Callable[[], Any]:
        """What builds the reply of the chunks so far (``None`` when there is none)."""
        litellm = self.client.litellm

        def build() -> Any:
            if not chunks:
                return None
            try:
                return litellm.stream_chunk_builder(chunks, messages=kwargs.get("messages"))
            except Exception:  # chunks LiteLLM cannot assemble (a stream cut mid-call)
                return None

        return build
