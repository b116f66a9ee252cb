"""``statemachine.integrations.langchain.EngineChatModel`` inside a real LangGraph agent
(``create_react_agent``) with the real ``langchain-openai`` ``ChatOpenAI`` and ``openai``
client, against the loopback vendor (tests/servers/fake_llm.py).

Nothing is mocked between the graph and the socket; the vendor counts the requests.
Waits go to a fake sleep that advances the session's clock. Outside CI a missing
LangChain skips this module; in CI (``CI=1``) it fails.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import ToolNode, create_react_agent

import statemachine as sm
from statemachine.integrations import TurnFailed as AnyTurnFailed
from statemachine.integrations.langchain import EngineChatModel, TurnFailed

from .helpers import FakeTime
from .servers.fake_llm import OPENAI, FakeLLM, openai_completion, openai_error, openai_stream
from .test_docs import ROOT, blocks

DOCS = ROOT / "docs" / "integrations.md"

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")


@pytest.fixture
def servers() -> Iterator[tuple[FakeLLM, FakeLLM]]:
    with FakeLLM() as main, FakeLLM() as backup:
        yield main, backup


def _chat(server: FakeLLM, name: str = "gpt-main", **fields: Any) -> ChatOpenAI:
    """The model as LangChain's docs build it: the SDK's default retries (2)."""
    return ChatOpenAI(model=name, base_url=server.url + "/v1", api_key="sk-test", **fields)


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: sunny"


@tool
def broken(city: str) -> str:
    """A tool that always raises."""
    raise RuntimeError(f"no station in {city}")


def _thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


@pytest.mark.requirement("ER-304")
def test_a_react_agent_runs_each_request_as_one_engine_turn(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A 429 with retry-after, a tool call, the answer: three requests (the SDK's
    retries off though the model was built with its default), one engine wait, two
    turns in the thread's session, the tool call seen, the cost on each AIMessage."""
    main, _ = servers
    main.script(
        OPENAI,
        openai_error(429, "Rate limit reached", "requests", retry_after="2"),
        openai_completion(None, tool_calls=(("c1", "weather", {"city": "Paris"}),)),
        openai_completion("It is sunny in Paris"),
    )
    time = FakeTime()
    chat = _chat(main)
    model = EngineChatModel(chat, clock=time.clock, sleep=time.sleep, price_per_mtok=(1.0, 2.0))
    assert chat.max_retries is None and model.models[0].max_retries == 0  # a copy, rebuilt
    agent = create_react_agent(model, [weather])
    result = agent.invoke({"messages": [("user", "weather in Paris?")]}, _thread("t1"))
    messages = result["messages"]
    assert messages[-1].content == "It is sunny in Paris"
    assert main.count(OPENAI) == 3 and time.waits == [2.0]
    session = model.session("t1")
    assert session is not None and session.turns == 2
    assert session.cost_usd == pytest.approx(2 * (10 * 1.0 + 5 * 2.0) / 1e6)
    replies = [m for m in messages if isinstance(m, AIMessage)]
    assert all(m.response_metadata["cost_usd"] == pytest.approx(2e-5) for m in replies)
    assert replies[0].usage_metadata is not None and replies[0].usage_metadata["input_tokens"] == 10


@pytest.mark.requirement("ER-304")
def test_auth_error_never_falls_back_and_a_storm_falls_back_async(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A 401: one request, none to the fallback, TurnFailed(auth_error). A 5xx storm:
    the engine's retries (max_retries=1: two requests), then the fallback once."""
    main, backup = servers
    main.script(
        OPENAI, openai_error(401, "Incorrect API key", "invalid_request_error", "invalid_api_key")
    )
    backup.script(OPENAI, openai_completion("hidden"))
    time = FakeTime()
    model = EngineChatModel(
        [_chat(main), _chat(backup, "gpt-backup")],
        settings=sm.Settings(max_retries=1),
        clock=time.clock,
        sleep=time.sleep,
    )
    agent = create_react_agent(model, [weather])

    async def runs() -> tuple[TurnFailed, Any]:  # one event loop: the SDK's client is bound to it
        with pytest.raises(TurnFailed) as failed:
            await agent.ainvoke({"messages": [("user", "hi")]}, _thread("a"))
        assert (main.count(OPENAI), backup.count(OPENAI)) == (1, 0)
        main.script(OPENAI, *[openai_error(500, "The server had an error", "server_error")] * 2)
        return failed.value, await agent.ainvoke({"messages": [("user", "hi")]}, _thread("b"))

    error, result = asyncio.run(runs())
    assert isinstance(error, AnyTurnFailed)
    assert error.status == sm.TurnStatus.AUTH_ERROR
    assert result["messages"][-1].content == "hidden"
    assert (main.count(OPENAI), backup.count(OPENAI)) == (3, 1)


@pytest.mark.requirement("ER-304")
def test_retrying_and_falling_back_runnables_are_refused() -> None:
    """with_retry / with_fallbacks given as a model, and an EngineChatModel, are
    refused with ConfigError naming what to give instead."""
    chat = ChatOpenAI(model="m", api_key="sk-test")
    with pytest.raises(sm.ConfigError, match="with_fallbacks"):
        EngineChatModel(chat.with_fallbacks([ChatOpenAI(model="n", api_key="sk-test")]))
    with pytest.raises(sm.ConfigError, match="with_retry"):
        EngineChatModel([chat.with_retry()])
    with pytest.raises(sm.ConfigError, match="already"):
        EngineChatModel(EngineChatModel(chat))


@pytest.mark.requirement("ER-305")
def test_a_tool_raising_every_call_opens_the_breaker_and_the_run_ends_on_a_final_answer(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """ToolNode(handle_tool_errors=True) turns each raise into a ToolMessage(status="error"): a failed
    invocation for the breaker. After breaker_threshold of them the next request is the
    final-answer turn: the engine's instruction appended, tool use forbidden."""
    main, _ = servers
    call = openai_completion(None, tool_calls=(("c", "broken", {"city": "Paris"}),))
    main.script(OPENAI, call, call, openai_completion("I could not reach the station."))
    model = EngineChatModel(
        _chat(main), settings=sm.Settings(breaker_threshold=2), sleep=FakeTime().sleep
    )
    agent = create_react_agent(model, ToolNode([broken], handle_tool_errors=True))
    result = agent.invoke({"messages": [("user", "weather?")]}, _thread("t"))
    assert result["messages"][-1].content == "I could not reach the station."
    tool_messages = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in tool_messages] == ["error", "error"]
    last = main.requests(OPENAI)[-1].body
    assert last.get("tool_choice") == "none"
    assert last["messages"][-1]["role"] == "user"  # the engine's instruction
    session = model.session("t")
    assert session is not None and session.tripped_providers == frozenset({"tools"})


@pytest.mark.requirement("ER-305")
def test_a_context_overflow_is_answered_by_a_smaller_request(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A 400 context_length_exceeded: the next attempt drops the oldest rounds (the
    first prompt kept), never resending the same request."""
    main, _ = servers
    main.script(
        OPENAI,
        openai_error(
            400,
            "maximum context length exceeded",
            "invalid_request_error",
            "context_length_exceeded",
        ),
        openai_completion("short answer"),
    )
    history: list[Any] = [HumanMessage("first question")]
    for index in range(4):
        history += [AIMessage(f"answer {index}"), HumanMessage(f"question {index}")]
    model = EngineChatModel(_chat(main), sleep=FakeTime().sleep)
    reply = model.invoke(history)
    assert reply.content == "short answer"
    sizes = [len(seen.body["messages"]) for seen in main.requests(OPENAI)]
    assert sizes[0] == 9 and sizes[1] < 9
    assert main.requests(OPENAI)[1].body["messages"][0]["content"] == "first question"


@pytest.mark.requirement("ER-306")
def test_a_stream_passes_through_and_a_broken_one_is_never_resent(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """astream: a 500 before the first chunk is retried; the chunks pass through. A
    stream cut after its first chunk raises TurnFailed(stream_interrupted), one request."""
    main, _ = servers
    main.script(
        OPENAI,
        openai_error(500, "The server had an error", "server_error"),
        openai_stream({"role": "assistant", "content": "Hel"}, {"content": "lo"}),
    )
    model = EngineChatModel(_chat(main), sleep=FakeTime().sleep)

    async def pieces() -> list[str]:
        return [str(chunk.content) async for chunk in model.astream("hi")]

    async def both() -> tuple[str, TurnFailed]:  # one event loop: the SDK's client is bound to it
        streamed = "".join(await pieces())
        assert main.count(OPENAI) == 2
        main.script(
            OPENAI,
            openai_stream({"role": "assistant", "content": "Hel"}, cut=True),
            openai_completion("again"),
        )
        with pytest.raises(TurnFailed) as failed:
            await pieces()
        return streamed, failed.value

    streamed, error = asyncio.run(both())
    assert streamed == "Hello"
    assert error.status == sm.TurnStatus.STREAM_INTERRUPTED
    assert main.count(OPENAI) == 3


@pytest.mark.requirement("ER-304")
def test_the_pages_langgraph_example_runs_against_the_vendor(
    servers: tuple[FakeLLM, FakeLLM],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/integrations.md's LangGraph "After" block, run as written with the openai
    client pointed at the loopback vendor: a tool call, then the answer."""
    (code,) = [code for _, code in blocks(DOCS, "python") if "EngineChatModel(" in code]
    main, _ = servers
    main.script(
        OPENAI,
        openai_completion(None, tool_calls=(("c1", "get_weather", {"city": "Paris"}),)),
        openai_completion("It is sunny in Paris, 21 °C."),
    )
    monkeypatch.setenv("OPENAI_BASE_URL", main.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "loopback")
    exec(compile(code, str(DOCS), "exec"), {"__name__": "docs"})  # noqa: S102 - our docs
    assert capsys.readouterr().out == "It is sunny in Paris, 21 °C.\n"
    assert main.count(OPENAI) == 2
    assert main.requests(OPENAI)[1].body["messages"][-1]["content"] == "Paris: sunny, 21 °C"


@pytest.mark.requirement("ER-304", "ER-305", "ER-306", "ER-300", "ER-302", "ER-303")
def test_the_engine_columns_of_litellm_and_langchain_are_correct() -> None:
    """benchmarks/frameworks.py's eleven scenarios through the LiteLLM provider (alone
    and through a Router) and EngineChatModel (alone and in LangGraph's prebuilt
    agent): every row correct but the ones CANNOT names, which are never resent."""
    pytest.importorskip("litellm")
    from benchmarks import frameworks

    for stack in ("litellm", "litellm-router", "langchain", "langgraph"):
        for scenario in frameworks.SCENARIOS:
            outcome = frameworks.play(stack, scenario, engine=True)
            if (stack, scenario.key) in frameworks.CANNOT:
                assert outcome.main == 1 and outcome.status == "stream_interrupted", outcome
                continue
            assert frameworks.correct(scenario, outcome), (stack, scenario.key, outcome)


def test_without_langchain_the_import_names_the_extra() -> None:
    """Importing the integration without langchain-core raises an ImportError naming
    the module and the extra's install line (langchain-core hidden in a fresh
    interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'langchain_core':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "try:\n"
        "    import statemachine.integrations.langchain\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message = out.stdout.strip()
    assert message.startswith("statemachine.integrations.langchain needs "), message
    assert "pip install 'turnstate[langchain]'" in message
    assert "No module named 'langchain_core" in message
