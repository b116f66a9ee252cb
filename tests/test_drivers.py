"""The drivers, ``run_turn`` and ``arun_turn``, with small in-process providers.

Waits go to fake sleeps; timeouts use short real bounds (tens of milliseconds)
around calls that wait on events, never on a sleep.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest

import statemachine as sm
from statemachine.providers import OpenAIModel

C = sm.ErrorCategory


def session(**settings: Any) -> sm.Session:
    return sm.Session(sm.Settings(**settings), seed=7, clock=lambda: 0.0)


class Context:
    def __init__(self) -> None:
        self.size = 100
        self.actions: list[sm.Assemble] = []

    def assemble(self, action: sm.Assemble) -> sm.Assembled:
        self.actions.append(action)
        if action.reduce:
            self.size -= 10
        return sm.Assembled({"size": self.size}, self.size)


class AsyncContext(Context):
    async def assemble(self, action: sm.Assemble) -> sm.Assembled:  # type: ignore[override]
        return Context.assemble(self, action)


class Script:
    """A model replaying a script: each item is an event to return or an exception
    to raise."""

    def __init__(self, *items: Any) -> None:
        self.items = list(items)
        self.actions: list[sm.CallModel] = []

    def complete(self, action: sm.CallModel) -> Any:
        self.actions.append(action)
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


class AsyncScript(Script):
    async def complete(self, action: sm.CallModel) -> Any:  # type: ignore[override]
        return Script.complete(self, action)


class Tools:
    def __init__(self, behaviour: Callable[[sm.ToolCall], Any] | None = None) -> None:
        self.behaviour = behaviour
        self.calls: list[sm.ToolCall] = []

    def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        self.calls.append(call)
        if self.behaviour is not None:
            return self.behaviour(call)  # type: ignore[no-any-return]
        return sm.ToolOutcome(call.id, ok=True, content=f"{call.name} done")


class AsyncTools(Tools):
    async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:  # type: ignore[override]
        return Tools.invoke(self, call)


def calls(*names: str, provider: str = "p") -> sm.ModelReplied:
    return sm.ModelReplied(
        tool_calls=tuple(sm.ToolCall(f"c{i}", provider, n, {"i": i}) for i, n in enumerate(names))
    )


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


class AsyncSleeps(Sleeps):
    async def __call__(self, seconds: float) -> None:  # type: ignore[override]
        self.waits.append(seconds)


RATE_LIMIT = openai.RateLimitError(
    "slow",
    response=httpx2.Response(
        429, request=httpx2.Request("POST", "http://127.0.0.1/"), headers={"retry-after": "2"}
    ),
    body={"message": "slow", "type": "requests", "code": "rate_limit_exceeded"},
)


# -- the happy path and error translation --------------------------------------------


@pytest.mark.requirement("ER-46", "ER-47", "ER-12")
def test_sync_driver_runs_a_turn_and_translates_errors() -> None:
    """run_turn starts the turn, classifies a raised SDK 429 (waiting >= its
    retry-after), runs the tools (a raising tool becomes an unknown error result,
    a TimeoutError a timeout one) and returns the Finish."""

    def behaviour(call: sm.ToolCall) -> sm.ToolOutcome:
        if call.name == "boom":
            raise RuntimeError("tool blew up")
        if call.name == "slow":
            raise TimeoutError("took too long")
        return sm.ToolOutcome(call.id, ok=True, content="fine")

    sleeps = Sleeps()
    turn = session().new_turn()
    finish = sm.run_turn(
        turn,
        model=Script(RATE_LIMIT, calls("ok", "boom", "slow")),
        tools=Tools(behaviour),
        context=Context(),
        sleep=sleeps,
    )
    assert finish.status is sm.TurnStatus.COMPLETED
    assert len(sleeps.waits) == 1
    assert sleeps.waits[0] >= 2.0
    ok, boom, slow = finish.tool_results
    assert (ok.is_error, ok.content) == (False, "fine")
    assert (boom.is_error, boom.category) == (True, sm.ToolErrorCategory.UNKNOWN)
    assert "tool blew up" in boom.content
    assert slow.category is sm.ToolErrorCategory.TIMEOUT
    assert turn.finish is finish


@pytest.mark.requirement("ER-46", "ER-47")
def test_async_driver_runs_a_turn_and_translates_errors() -> None:
    """arun_turn: a context overflow reduces, a raised ValueError from the model is an
    unknown error (not retried) on the next turn; waits go to the async sleep."""
    sess = session()
    sleeps = AsyncSleeps()
    overflow = sm.ModelFailed(sm.ModelError(C.CONTEXT_LENGTH_EXCEEDED, "too long"))
    model = AsyncScript(overflow, calls("a"), ValueError("bad glue"))
    context = AsyncContext()

    async def scenario() -> tuple[sm.Finish, sm.Finish]:
        first = await sm.arun_turn(
            sess.new_turn(), model=model, tools=AsyncTools(), context=context, sleep=sleeps
        )
        second = await sm.arun_turn(
            sess.new_turn(), model=model, tools=AsyncTools(), context=context, sleep=sleeps
        )
        return first, second

    first, second = asyncio.run(scenario())
    assert first.status is sm.TurnStatus.COMPLETED
    assert [a.reduce for a in context.actions[:2]] == [False, True]
    assert second.status is sm.TurnStatus.UNKNOWN_ERROR
    assert second.error is not None and "bad glue" in second.error.message
    assert sleeps.waits == []


@pytest.mark.requirement("ER-46")
def test_drivers_resume_a_started_turn_and_return_a_finished_one() -> None:
    """A turn the host started by hand is resumed from its last action; a finished
    turn's Finish is returned without calling anything."""
    turn = session().new_turn()
    turn.start()
    turn.send(sm.Assembled("req", 5))  # now calling: the driver must call the model
    model = Script(sm.ModelReplied())
    finish = sm.run_turn(turn, model=model, tools=Tools(), context=Context())
    assert finish.status is sm.TurnStatus.COMPLETED
    assert len(model.actions) == 1
    again = Script()
    assert sm.run_turn(turn, model=again, tools=Tools(), context=Context()) is finish
    assert (
        asyncio.run(
            sm.arun_turn(turn, model=AsyncScript(), tools=AsyncTools(), context=AsyncContext())
        )
        is finish
    )


@pytest.mark.requirement("ER-46")
def test_a_provider_returning_the_wrong_type_is_named_and_the_turn_cancelled() -> None:
    """A model that returns something other than ModelReplied/ModelFailed is a host
    bug: TypeError naming what came back; the turn ends cancelled, not half-run."""
    turn = session().new_turn()
    with pytest.raises(TypeError, match="must return ModelReplied or ModelFailed"):
        sm.run_turn(turn, model=Script("a string"), tools=Tools(), context=Context())
    assert turn.status is sm.TurnStatus.CANCELLED
    wrong = Tools(lambda call: sm.ToolOutcome("other-id", ok=True))
    finish = sm.run_turn(
        session().new_turn(), model=Script(calls("a")), tools=wrong, context=Context()
    )
    (result,) = finish.tool_results
    assert result.is_error
    assert "must return a ToolOutcome" in result.content


@pytest.mark.requirement("ER-31")
def test_a_partial_failure_returned_by_the_model_ends_stream_interrupted() -> None:
    """A model provider may return ModelFailed(partial=True) for a stream that broke
    after delivering text: the driver passes it on and the call is never resent."""
    failed = sm.ModelFailed(sm.ModelError(C.OVERLOADED, "stream cut"), partial=True)
    model = Script(failed)
    finish = sm.run_turn(session().new_turn(), model=model, tools=Tools(), context=Context())
    assert finish.status is sm.TurnStatus.STREAM_INTERRUPTED
    assert len(model.actions) == 1


# -- timeouts ---------------------------------------------------------------------


@pytest.mark.requirement("ER-48", "ER-45")
def test_async_model_timeout_is_classified_overloaded_and_retried() -> None:
    """A model call longer than model_timeout_s is cut: overloaded with code timeout,
    retried, and after max_retries the turn ends retries_exhausted, never a hang."""

    class Hanging:
        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            self.calls += 1
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    model = Hanging()
    sleeps = AsyncSleeps()
    finish = asyncio.run(
        sm.arun_turn(
            session(model_timeout_s=0.02, max_retries=2).new_turn(),
            model=model,
            tools=AsyncTools(),
            context=AsyncContext(),
            sleep=sleeps,
        )
    )
    assert finish.status is sm.TurnStatus.RETRIES_EXHAUSTED
    assert finish.error is not None
    assert (finish.error.category, finish.error.code) == (C.OVERLOADED, "timeout")
    assert model.calls == 3
    assert len(sleeps.waits) == 2


@pytest.mark.requirement("ER-48")
def test_sync_timeouts_bound_model_and_tool_calls() -> None:
    """The sync driver bounds a blocking model call (model_timeout_s) and a blocking
    tool call (tool_timeout_s) on a worker thread: a timeout error, then a timeout
    tool result; the blocked calls are released afterwards."""
    release = threading.Event()

    class Blocking:
        def __init__(self) -> None:
            self.calls = 0

        def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            self.calls += 1
            if self.calls == 1:
                release.wait(5)
            return calls("t") if self.calls == 2 else sm.ModelReplied()

    def block(call: sm.ToolCall) -> sm.ToolOutcome:
        release.wait(5)
        return sm.ToolOutcome(call.id, ok=True)

    sleeps = Sleeps()
    try:
        finish = sm.run_turn(
            session(model_timeout_s=0.05, tool_timeout_s=0.05).new_turn(),
            model=Blocking(),
            tools=Tools(block),
            context=Context(),
            sleep=sleeps,
        )
    finally:
        release.set()
    assert finish.status is sm.TurnStatus.COMPLETED
    assert len(sleeps.waits) == 1  # the model timeout was retried once
    (result,) = finish.tool_results
    assert result.category is sm.ToolErrorCategory.TIMEOUT


# -- concurrency --------------------------------------------------------------------


@pytest.mark.requirement("ER-49")
def test_async_tools_of_one_round_run_concurrently() -> None:
    """Three tool calls of one InvokeTools are in flight at once: each waits until all
    three have started, which only concurrent execution can satisfy."""
    started: list[str] = []

    class Gathered:
        def __init__(self) -> None:
            self.all_in = asyncio.Event()

        async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
            started.append(call.id)
            if len(started) == 3:
                self.all_in.set()
            async with asyncio.timeout(2):
                await self.all_in.wait()
            return sm.ToolOutcome(call.id, ok=True, content=len(started))

    finish = asyncio.run(
        sm.arun_turn(
            session().new_turn(),
            model=AsyncScript(calls("a", "b", "c"), sm.ModelReplied()),
            tools=Gathered(),
            context=AsyncContext(),
        )
    )
    assert [r.content for r in finish.tool_results] == [3, 3, 3]
    assert [r.call_id for r in finish.tool_results] == ["c0", "c1", "c2"]


# -- cancellation ---------------------------------------------------------------------


def _assert_snapshot_ok(sess: sm.Session) -> None:
    data = sess.snapshot()
    json.dumps(data)
    restored = sm.Session.restore(data, clock=lambda: 0.0)
    assert restored.current_turn is not None
    assert restored.current_turn.status is sm.TurnStatus.CANCELLED
    restored.new_turn()  # the session goes on


class _Stalled:
    """A vendor stream that sends ``first`` and then goes quiet until cancelled,
    setting ``reported`` once ``first`` is out (the SDKs' stream managers' shape)."""

    def __init__(self, first: Any, reported: asyncio.Event, snapshot: Any = None) -> None:
        self.first, self.reported = first, reported
        self.current_message_snapshot = snapshot  # Anthropic's stream keeps its message

    async def __aenter__(self) -> _Stalled:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        return None

    async def __aiter__(self) -> Any:
        yield self.first
        self.reported.set()
        await asyncio.Event().wait()  # the vendor goes quiet: cancelled here


async def cancel_once_reported(turn: sm.Turn, model: Any, reported: asyncio.Event) -> None:
    """Drive ``turn`` on ``model`` with ``arun_turn`` and cancel its task once the
    provider reported its usage (``reported`` set); the task ends cancelled."""
    task = asyncio.create_task(
        sm.arun_turn(turn, model=model, tools=AsyncTools(), context=AsyncContext())
    )
    await reported.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _cancel_once_reported(model: Any, reported: asyncio.Event) -> tuple[sm.Session, sm.Turn]:
    """:func:`cancel_once_reported` on a fresh session's turn, then the model's client
    closed; the session and the cancelled turn."""
    sess = session()
    turn = sess.new_turn()
    await cancel_once_reported(turn, model, reported)
    await model.client.close()
    return sess, turn


@pytest.mark.requirement("ER-245")
def test_a_stream_cancelled_after_its_usage_is_charged_through_arun_turn() -> None:
    """A ready-made streaming provider whose stream reported usage and then stalls:
    cancelling arun_turn's task ends the turn cancelled, charged what the vendor had
    reported (at the provider's price), as a reply would have been."""
    from openai.types.chat import ChatCompletionChunk
    from openai.types.completion_usage import CompletionUsage

    from statemachine.providers import AsyncOpenAIModel

    usage = CompletionUsage(prompt_tokens=1000, completion_tokens=10, total_tokens=1010)
    chunk = ChatCompletionChunk(
        id="c1", choices=[], created=0, model="gpt-x", object="chat.completion.chunk", usage=usage
    )

    async def scenario() -> tuple[sm.Session, sm.Turn]:
        reported = asyncio.Event()

        async def create(**_kwargs: Any) -> _Stalled:
            return _Stalled(chunk, reported)

        client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
        client.chat.completions.create = create  # type: ignore[method-assign]
        model = AsyncOpenAIModel(
            client, model="gpt-x", on_text=lambda _text: None, price_per_mtok=(1.0, 2.0)
        )
        return await _cancel_once_reported(model, reported)

    sess, turn = asyncio.run(scenario())
    assert turn.status is sm.TurnStatus.CANCELLED
    assert sess.cost_usd == pytest.approx(1000 * 1.0e-6 + 10 * 2.0e-6)
    (cancelled,) = [r.caused_by for r in turn.trace if isinstance(r.caused_by, sm.Cancelled)]
    assert cancelled.usage is not None and cancelled.usage.input_tokens == 1000
    _assert_snapshot_ok(sess)


@pytest.mark.requirement("ER-245")
def test_a_host_written_provider_reports_what_a_cancelled_call_used() -> None:
    """A provider of the host's own says what its call has used with ``sm.report_usage``
    (the last report counts); cancelling arun_turn's task charges that, cost included."""
    reported = asyncio.Event()

    class Streaming:
        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            sm.report_usage(sm.Usage(input_tokens=10, cost_usd=0.01))
            sm.report_usage(sm.Usage(input_tokens=500, output_tokens=5, cost_usd=0.25))
            reported.set()
            await asyncio.Event().wait()  # the vendor goes quiet: cancelled here
            raise AssertionError("unreachable")

    async def scenario() -> tuple[sm.Session, sm.Turn]:
        sess = session()
        turn = sess.new_turn()
        await cancel_once_reported(turn, Streaming(), reported)
        return sess, turn

    sess, turn = asyncio.run(scenario())
    assert turn.status is sm.TurnStatus.CANCELLED
    assert sess.cost_usd == pytest.approx(0.25)
    (cancelled,) = [r.caused_by for r in turn.trace if isinstance(r.caused_by, sm.Cancelled)]
    assert cancelled.usage == sm.Usage(input_tokens=500, output_tokens=5, cost_usd=0.25)
    with pytest.raises(TypeError, match=r"usage: must be a statemachine\.Usage, got dict"):
        sm.report_usage({"input_tokens": 1})  # type: ignore[arg-type]


@pytest.mark.requirement("ER-245")
def test_an_anthropic_stream_cancelled_after_message_start_is_charged() -> None:
    """The same for AsyncAnthropicModel: the usage of the stream's message_start (the
    SDK's snapshot) is what the turn's Cancelled charges."""
    import anthropic
    from anthropic.types import Message, Usage

    from statemachine.providers import AsyncAnthropicModel

    started = Message(
        id="m1",
        content=[],
        model="claude-x",
        role="assistant",
        stop_reason=None,
        stop_sequence=None,
        type="message",
        usage=Usage(input_tokens=2000, output_tokens=1),
    )
    start = type("Start", (), {"type": "message_start", "message": started})()

    async def scenario() -> tuple[sm.Session, sm.Turn]:
        reported = asyncio.Event()
        client = anthropic.AsyncAnthropic(base_url="http://127.0.0.1:9", api_key="k", max_retries=0)
        client.messages.stream = lambda **_kwargs: _Stalled(start, reported, started)  # type: ignore[method-assign,assignment]
        model = AsyncAnthropicModel(
            client, model="claude-x", on_text=lambda _text: None, price_per_mtok=(1.0, 2.0)
        )
        return await _cancel_once_reported(model, reported)

    sess, turn = asyncio.run(scenario())
    assert turn.status is sm.TurnStatus.CANCELLED
    assert sess.cost_usd == pytest.approx(2000 * 1.0e-6 + 1 * 2.0e-6)


@pytest.mark.requirement("ER-50", "ER-32")
@pytest.mark.parametrize("where", ["wait", "model", "tools"])
def test_async_cancellation_cancels_the_turn_and_leaks_no_task(where: str) -> None:
    """Cancelling the driver's task during a wait, a model call or a tool round: the
    turn finishes cancelled (in-flight tool calls as cancelled error results), every
    child task was cancelled, CancelledError propagates, nothing is left running,
    and the session snapshot is plain JSON and restores."""
    sess = session()
    turn = sess.new_turn()
    cancelled_children: list[str] = []
    blocked = asyncio.Event()

    async def hang(label: str) -> None:
        blocked.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled_children.append(label)
            raise

    class Model:
        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, action: sm.CallModel) -> Any:
            self.calls += 1
            if where == "wait" and self.calls == 1:
                raise RATE_LIMIT
            if where == "model":
                await hang("model")
            return calls("a", "b")

    class HangTools:
        async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
            await hang(call.id)
            raise AssertionError("unreachable")

    async def sleep(seconds: float) -> None:
        await hang("sleep")

    async def scenario() -> list[asyncio.Task[Any]]:
        task = asyncio.create_task(
            sm.arun_turn(
                turn, model=Model(), tools=HangTools(), context=AsyncContext(), sleep=sleep
            )
        )
        await blocked.wait()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        current = asyncio.current_task()
        return [t for t in asyncio.all_tasks() if t is not current and not t.done()]

    leftovers = asyncio.run(scenario())
    assert leftovers == []
    assert turn.status is sm.TurnStatus.CANCELLED
    if where == "tools":
        assert sorted(cancelled_children) == ["c0", "c1"]
        assert [r.category for r in turn.finish.tool_results] == [  # type: ignore[union-attr]
            sm.ToolErrorCategory.CANCELLED,
            sm.ToolErrorCategory.CANCELLED,
        ]
    else:
        assert cancelled_children == [where if where == "model" else "sleep"]
    _assert_snapshot_ok(sess)


@pytest.mark.requirement("ER-245")
def test_a_cancel_that_knows_what_the_call_in_flight_cost_charges_it() -> None:
    """The drivers' cancel (``_loop.cancel``) charges what the escaping cancellation
    says the model call in flight cost (``CallCancelled``, as the Temporal workflow
    raises it), or the usage its caller saw so far; in a state with no model call in
    flight it cancels without a charge."""
    from statemachine.io._loop import CallCancelled, cancel

    for escaped, usage, cost in (
        (CallCancelled("stop", 0.25, sm.Usage(output_tokens=3)), None, 0.25),
        (asyncio.CancelledError(), sm.Usage(input_tokens=9, cost_usd=0.5), 0.5),
        (asyncio.CancelledError(), None, 0.0),
    ):
        sess = session()
        turn = sess.new_turn()
        turn.start()
        turn.send(sm.Assembled("req", 10))
        cancel(turn, escaped, usage)
        assert turn.status is sm.TurnStatus.CANCELLED and sess.cost_usd == cost
    sess = session()
    turn = sess.new_turn()
    turn.start()
    cancel(turn, CallCancelled("stop", 0.25), sm.Usage(input_tokens=1))
    assert turn.status is sm.TurnStatus.CANCELLED and sess.cost_usd == 0.0


@pytest.mark.requirement("ER-50", "ER-32")
@pytest.mark.parametrize("where", ["wait", "model", "tools"])
def test_sync_keyboard_interrupt_cancels_the_turn_and_reraises(where: str) -> None:
    """A KeyboardInterrupt during a wait, a model call or a tool call in run_turn:
    the turn finishes cancelled, the interrupt propagates, the session restores."""
    sess = session()
    turn = sess.new_turn()

    def model(action: sm.CallModel) -> Any:
        if where == "wait" and action.attempt == 0:
            raise RATE_LIMIT
        if where == "model":
            raise KeyboardInterrupt
        return calls("a")

    class Model:
        complete = staticmethod(model)

    def interrupt(_: object) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sm.run_turn(turn, model=Model(), tools=Tools(interrupt), context=Context(), sleep=interrupt)
    assert turn.status is sm.TurnStatus.CANCELLED
    if where == "tools":
        (result,) = turn.finish.tool_results  # type: ignore[union-attr]
        assert result.category is sm.ToolErrorCategory.CANCELLED
    _assert_snapshot_ok(sess)


@pytest.mark.requirement("ER-50")
def test_a_failing_context_provider_cancels_the_turn_and_reraises() -> None:
    """An exception from context.assemble is the host's own: it propagates, and the
    turn is cancelled so the session can start the next one."""

    class Broken:
        def assemble(self, action: sm.Assemble) -> sm.Assembled:
            raise OSError("disk gone")

    sess = session()
    turn = sess.new_turn()
    with pytest.raises(OSError, match="disk gone"):
        sm.run_turn(turn, model=Script(), tools=Tools(), context=Broken())
    assert turn.status is sm.TurnStatus.CANCELLED
    sess.new_turn()


# -- one retry owner ------------------------------------------------------------------


@pytest.mark.requirement("ER-51")
def test_sync_driver_refuses_a_retrying_sdk_client() -> None:
    """A provider holding openai.OpenAI with its default max_retries is refused with
    a ConfigError naming the attribute and the fix; one built with max_retries=0,
    or wrapped by OpenAIModel, is accepted."""

    class Glue:
        def __init__(self, client: openai.OpenAI) -> None:
            self.client = client

        def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            return sm.ModelReplied()

    with openai.OpenAI(api_key="t", base_url="http://127.0.0.1:9/v1") as retrying:
        turn = session().new_turn()
        with pytest.raises(sm.ConfigError, match=r"model.client: .*max_retries=2.*max_retries=0"):
            sm.run_turn(turn, model=Glue(retrying), tools=Tools(), context=Context())
        assert turn.state == "idle"
        with pytest.raises(sm.ConfigError, match="model: "):
            sm.run_turn(turn, model=retrying, tools=Tools(), context=Context())  # type: ignore[arg-type]
        assert OpenAIModel(retrying).client.max_retries == 0
    with openai.OpenAI(api_key="t", base_url="http://127.0.0.1:9/v1", max_retries=0) as quiet:
        finish = sm.run_turn(
            session().new_turn(), model=Glue(quiet), tools=Tools(), context=Context()
        )
        assert finish.status is sm.TurnStatus.COMPLETED


@pytest.mark.requirement("ER-51")
def test_a_retrying_client_under_any_attribute_name_is_refused() -> None:
    """The retry-owner check looks at every attribute of the provider, not only
    ``client``: a retrying client kept as ``self.llm`` is refused too."""

    class Glue:
        def __init__(self, llm: openai.OpenAI) -> None:
            self.llm = llm

        def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            return sm.ModelReplied()

    with (
        openai.OpenAI(api_key="t", base_url="http://127.0.0.1:9/v1", max_retries=4) as llm,
        pytest.raises(sm.ConfigError, match=r"model.llm: .*max_retries=4"),
    ):
        sm.run_turn(session().new_turn(), model=Glue(llm), tools=Tools(), context=Context())


@pytest.mark.requirement("ER-46")
def test_tool_routers_dispatch_by_provider_and_name_the_unknown() -> None:
    """ToolRouter / AsyncToolRouter hand each call to its provider by name; a call
    for an unknown provider is a not_found error result naming the known ones; the
    async router closes its providers."""
    from statemachine.tools import AsyncToolRouter, ToolRouter

    class Named(AsyncTools):
        def __init__(self, label: str) -> None:
            super().__init__(lambda call: sm.ToolOutcome(call.id, ok=True, content=label))
            self.closed = False

        async def aclose(self) -> None:
            self.closed = True

    reply = sm.ModelReplied(
        tool_calls=(
            sm.ToolCall("1", "files", "read"),
            sm.ToolCall("2", "web", "get"),
            sm.ToolCall("3", "ghost", "boo"),
        )
    )
    files, web = Named("from files"), Named("from web")

    async def scenario() -> sm.Finish:
        async with AsyncToolRouter({"files": files, "web": web}) as tools:
            return await sm.arun_turn(
                session().new_turn(),
                model=AsyncScript(reply, sm.ModelReplied()),
                tools=tools,
                context=AsyncContext(),
            )

    first, second, third = asyncio.run(scenario()).tool_results
    assert (first.content, second.content) == ("from files", "from web")
    assert third.category is sm.ToolErrorCategory.NOT_FOUND
    assert "ghost" in third.content and "files, web" in third.content
    assert files.closed and web.closed
    sync = ToolRouter({"files": Tools()})
    assert sync.invoke(sm.ToolCall("1", "files", "read")).ok
    assert sync.invoke(sm.ToolCall("2", "nope", "read")).category is sm.ToolErrorCategory.NOT_FOUND
    with pytest.raises(TypeError, match="invoke"):
        ToolRouter({"bad": object()})  # type: ignore[dict-item]


@pytest.mark.requirement("ER-52")
def test_providers_refuse_bad_construction_with_named_errors() -> None:
    """The ready-made providers name what is wrong: not an SDK client, a bad price,
    a bad tool_provider; and a request that is neither a mapping nor a message list."""
    with pytest.raises(TypeError, match="client: expected an official SDK client"):
        OpenAIModel(object())
    with openai.OpenAI(api_key="t", base_url="http://127.0.0.1:9/v1", max_retries=0) as client:
        with pytest.raises(TypeError, match="price_per_mtok"):
            OpenAIModel(client, price_per_mtok=(1.0,))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="tool_provider"):
            OpenAIModel(client, tool_provider="")
        model = OpenAIModel(client, model="gpt-test")
        with pytest.raises(TypeError, match=r"CallModel\.request"):
            model.complete(sm.CallModel(request=42, attempt=0))
        with pytest.raises(TypeError, match="model: no model named"):
            OpenAIModel(client).complete(sm.CallModel(request=[], attempt=0))


@pytest.mark.requirement("ER-14")
def test_a_tool_raising_any_libraries_timeout_is_a_timeout_outcome() -> None:
    """Not only the builtin TimeoutError: an httpx timeout raised by a tool is reported
    as a ``timeout`` outcome too."""

    def slow(call: sm.ToolCall) -> sm.ToolOutcome:
        raise httpx2.ReadTimeout("the tool's HTTP call timed out")

    session = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0)
    turn = session.new_turn()
    model = Script(sm.ModelReplied(tool_calls=[sm.ToolCall("c1", "web", "fetch")]))
    finish = sm.run_turn(turn, model=model, tools=Tools(slow), context=Context(), sleep=Sleeps())
    assert finish.tool_results[0].is_error
    assert finish.tool_results[0].category is sm.ToolErrorCategory.TIMEOUT


@pytest.mark.requirement("ER-16")
def test_withheld_tools_stay_defined_when_the_history_holds_tool_blocks() -> None:
    """On the final-answer turn the providers drop ``tools`` from a fresh conversation,
    but keep them with tool_choice none when the history already holds tool calls
    (both APIs refuse tool history without tool definitions)."""
    from statemachine.providers import AnthropicModel

    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    fresh = {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    history = {
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}],
            },
        ],
        "tools": tools,
        "tool_choice": {"type": "any"},
    }
    anthropic_model = AnthropicModel(_NoRetryClient(), model="m")
    openai_model = OpenAIModel(_NoRetryClient(), model="m")
    withheld = sm.CallModel(fresh, 0, None, withhold_tools=True)
    assert "tools" not in anthropic_model._kwargs(withheld)
    kept = anthropic_model._kwargs(sm.CallModel(history, 0, None, withhold_tools=True))
    assert kept["tools"] == tools and kept["tool_choice"] == {"type": "none"}
    openai_history = {
        "messages": [
            {"role": "assistant", "tool_calls": [{"id": "t1"}]},
            {"role": "tool", "content": "x"},
        ],
        "tools": tools,
    }
    kept = openai_model._kwargs(sm.CallModel(openai_history, 0, None, withhold_tools=True))
    assert kept["tool_choice"] == "none"
    normal = anthropic_model._kwargs(sm.CallModel(history, 0, None, withhold_tools=False))
    assert normal["tool_choice"] == {"type": "any"}


class _NoRetryClient:
    """The least an SDK client needs to be for a provider: max_retries and with_options."""

    max_retries = 0

    def with_options(self, **_: Any) -> _NoRetryClient:
        return self
