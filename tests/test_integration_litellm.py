"""``statemachine.providers.LiteLLMModel`` / ``AsyncLiteLLMModel`` (the LiteLLM
provider, ``statemachine/integrations/litellm.py``) driven by the engine's drivers, with
the real ``litellm`` (and its ``Router``) against the loopback vendor
(tests/servers/fake_llm.py).

Nothing is mocked between LiteLLM and the socket but in the cancel test, whose stream
must stall; the vendor counts the requests. Waits go to a fake sleep. Outside CI a
missing litellm skips this module; in CI (``CI=1``) it fails.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price map download
if not os.environ.get("CI"):
    pytest.importorskip("litellm")

import litellm

import statemachine as sm
from statemachine.dev._vendor import openai_streamed
from statemachine.integrations.litellm import RETRY_KNOBS, classify_litellm
from statemachine.providers import AsyncLiteLLMModel, LiteLLMModel

from .servers.fake_llm import OPENAI, FakeLLM, openai_completion, openai_error, openai_stream
from .test_docs import ROOT, blocks
from .test_drivers import _Stalled, cancel_once_reported

DOCS = ROOT / "docs" / "integrations.md"

litellm.suppress_debug_info = True
# LiteLLM warns inside its calls (its lazily imported modules' TypedDicts, a pydantic
# attribute its stream reads), which the suite's filterwarnings=error would raise there
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*mutation on dictionary instances:UserWarning"),
    pytest.mark.filterwarnings(
        "ignore:Accessing the 'model_.*fields' attribute on the instance:DeprecationWarning"
    ),
]
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(autouse=True)
def _close_the_loop_litellm_leaves() -> Iterator[None]:
    """LiteLLM's sync call logs through ``asyncio.get_event_loop()``, which makes and
    sets a loop it never closes; closed here, or its garbage collection in a later test
    raises the unclosed-socket ResourceWarning (filterwarnings=error) there."""
    yield
    policy = asyncio.get_event_loop_policy()
    loop = getattr(policy._local, "_loop", None)  # the loop set, without making one
    if loop is not None and not loop.is_running():
        loop.close()
        policy.set_event_loop(None)


@pytest.fixture
def servers() -> Iterator[tuple[FakeLLM, FakeLLM]]:
    with FakeLLM() as main, FakeLLM() as backup:
        yield main, backup


class Context:
    def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled(MESSAGES, size=1)


class AsyncContext:
    async def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled(MESSAGES, size=1)


class Tools:
    def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        return sm.ToolOutcome(call.id, ok=True, content="sunny")


class AsyncTools:
    async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        return sm.ToolOutcome(call.id, ok=True, content="sunny")


def _session(**settings: Any) -> sm.Session:
    return sm.Session(sm.Settings(**settings), seed=7, clock=lambda: 0.0)


def _direct(server: FakeLLM, cls: type[Any] = LiteLLMModel, **kwargs: Any) -> Any:
    return cls("openai/gpt-4o", api_base=server.url + "/v1", api_key="sk-test", **kwargs)


def _router(main: FakeLLM, backup: FakeLLM) -> Any:
    """A Router as LiteLLM's docs build one: its default retries (2) and a fallback."""
    return litellm.Router(
        model_list=[
            {
                "model_name": name,
                "litellm_params": {"model": model, "api_base": url + "/v1", "api_key": "sk"},
            }
            for name, model, url in (
                ("gpt-main", "openai/gpt-4o", main.url),
                ("gpt-backup", "openai/gpt-4o-mini", backup.url),
            )
        ],
        fallbacks=[{"gpt-main": ["gpt-backup"]}],
    )


@pytest.mark.requirement("ER-300")
def test_litellm_sends_each_engine_attempt_once_and_the_engine_waits(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """Two 429s with retry-after, then a reply: three requests (LiteLLM's and its
    client's retries off), two engine waits of the vendor's retry-after, and the reply's
    usage priced by LiteLLM's own price map (gpt-4o) on the session's cost."""
    main, _ = servers
    main.script(
        OPENAI,
        openai_error(429, "Rate limit reached", "requests", retry_after="2"),
        openai_error(429, "Rate limit reached", "requests", retry_after="3"),
        openai_completion("sunny", tokens=(1000, 100)),
    )
    waits: list[float] = []
    session = _session()
    finish = sm.run_turn(
        session.new_turn(),
        model=_direct(main),
        tools=Tools(),
        context=Context(),
        sleep=waits.append,
    )
    assert finish.status == sm.TurnStatus.COMPLETED, finish.error
    assert main.count(OPENAI) == 3
    assert len(waits) == 2 and waits[0] >= 2 and waits[1] >= 3
    body = main.requests(OPENAI)[0].body
    assert "num_retries" not in body and "max_retries" not in body  # not sent to the vendor
    expected = sum(
        litellm.cost_per_token(model="gpt-4o", prompt_tokens=1000, completion_tokens=100)
    )
    assert session.cost_usd == pytest.approx(expected) and expected > 0


@pytest.mark.requirement("ER-300")
def test_retry_knobs_and_litellms_global_retries_are_refused(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A retry or fallback argument is refused when the provider is built, LiteLLM's
    process-wide num_retries when a call is made (before anything is sent)."""
    main, _ = servers
    for knob in sorted(RETRY_KNOBS):
        with pytest.raises(sm.ConfigError, match=knob):
            _direct(main, **{knob: 1})
    model = _direct(main)
    litellm.num_retries = 3
    try:
        with pytest.raises(sm.ConfigError, match=r"litellm\.num_retries"):
            model.complete(sm.CallModel(MESSAGES, attempt=0))
    finally:
        litellm.num_retries = None
    assert main.count(OPENAI) == 0
    with pytest.raises(sm.ConfigError, match="router"):
        LiteLLMModel("gpt-main", router=object())


@pytest.mark.requirement("ER-301")
@pytest.mark.parametrize(
    ("canned", "category", "code"),
    [
        (
            openai_error(
                429, "You exceeded your current quota.", "insufficient_quota", "insufficient_quota"
            ),
            sm.ErrorCategory.UNKNOWN,
            "insufficient_quota",
        ),
        (
            openai_error(
                400,
                "maximum context length is 8192 tokens",
                "invalid_request_error",
                "context_length_exceeded",
            ),
            sm.ErrorCategory.CONTEXT_LENGTH_EXCEEDED,
            "context_length_exceeded",
        ),
        (
            openai_error(
                400, "API key not valid. Please pass a valid API key.", "invalid_request_error"
            ),
            sm.ErrorCategory.AUTH_ERROR,
            None,
        ),
        (openai_error(529, "Overloaded", "overloaded_error"), sm.ErrorCategory.OVERLOADED, None),
    ],
)
def test_litellms_exceptions_are_classified_by_the_vendor_body_inside(
    servers: tuple[FakeLLM, FakeLLM], canned: Any, category: sm.ErrorCategory, code: str | None
) -> None:
    """LiteLLM's RateLimitError / ContextWindowExceededError / BadRequestError /
    APIError are read by the vendor's answer they wrap: its code, its wording."""
    main, _ = servers
    main.script(OPENAI, canned)
    event = _direct(main).complete(sm.CallModel(MESSAGES, attempt=0))
    assert isinstance(event, sm.ModelFailed)
    assert event.error.category == category, event.error
    assert event.error.status == canned.status
    if code is not None:
        assert event.error.code == code
    assert event.usage is not None and event.usage.provider_name == "litellm"
    assert main.count(OPENAI) == 1


@pytest.mark.requirement("ER-301")
def test_a_litellm_error_of_its_own_is_read_from_its_status_headers_and_message() -> None:
    """An exception LiteLLM raised with no vendor error under it (a Router with no
    deployment free) is classified from its status, the headers it kept and its text."""
    import httpx

    response = httpx.Response(
        429, headers={"retry-after": "9"}, request=httpx.Request("POST", "http://x")
    )
    exc = litellm.RateLimitError(
        "No deployments available for selected model",
        llm_provider="",
        model="gpt-main",
        response=response,
    )
    error = classify_litellm(exc)
    assert error.category == sm.ErrorCategory.RATE_LIMITED
    assert error.retry_after_seconds == 9
    assert classify_litellm(ValueError("not LiteLLM's")).category == sm.ErrorCategory.UNKNOWN


@pytest.mark.requirement("ER-302")
def test_through_a_router_its_retries_and_fallbacks_are_off_and_the_engine_falls_back(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A Router built with its default retries and a fallback: a 5xx storm reaches the
    main group once per engine attempt (max_retries=2: three) and then the engine's
    fallback group, once; a 401 reaches the main group once and no fallback."""
    main, backup = servers
    router = _router(main, backup)
    main.script(OPENAI, *[openai_error(500, "The server had an error", "server_error")] * 3)
    backup.script(OPENAI, openai_completion("from the backup"))
    model = AsyncLiteLLMModel("gpt-main", router=router)
    session = _session(max_retries=2, fallback_models=("gpt-backup",))
    finish = asyncio.run(
        sm.arun_turn(
            session.new_turn(),
            model=model,
            tools=AsyncTools(),
            context=AsyncContext(),
            sleep=_no_sleep,
        )
    )
    assert finish.status == sm.TurnStatus.COMPLETED
    assert (main.count(OPENAI), backup.count(OPENAI)) == (3, 1)

    main.script(
        OPENAI, openai_error(401, "Incorrect API key", "invalid_request_error", "invalid_api_key")
    )
    backup.script(OPENAI, openai_completion("hidden"))
    session = _session(fallback_models=("gpt-backup",))
    finish = sm.run_turn(
        session.new_turn(),
        model=LiteLLMModel("gpt-main", router=router),
        tools=Tools(),
        context=Context(),
        sleep=lambda _s: None,
    )
    assert finish.status == sm.TurnStatus.AUTH_ERROR
    assert (main.count(OPENAI), backup.count(OPENAI)) == (4, 1)


async def _no_sleep(_seconds: float) -> None:
    return None


@pytest.mark.requirement("ER-303")
def test_a_stream_is_delivered_and_its_usage_counted_once(servers: tuple[FakeLLM, FakeLLM]) -> None:
    """Streamed with on_text: the text arrives in pieces, the reply's tool call is read,
    and the usage (one usage chunk, or the totals on every chunk) is counted once. A
    stream that reports what each chunk added is counted as LiteLLM hands it on: its
    stream wrapper keeps the last chunk's usage only."""
    main, _ = servers
    reply = openai_completion(
        "the quick brown fox", tool_calls=(("c1", "weather", {"city": "Paris"}),)
    )
    for shape, expected in (("final", 5), ("cumulative", 5), ("delta", 1)):
        main.script(OPENAI, openai_streamed(reply, shape))
        texts: list[str] = []
        model = _direct(main, AsyncLiteLLMModel, on_text=texts.append)
        event = asyncio.run(model.complete(sm.CallModel(MESSAGES, attempt=0)))
        assert isinstance(event, sm.ModelReplied), event
        assert "".join(texts) == "the quick brown fox"
        assert [call.name for call in event.tool_calls] == ["weather"]
        assert event.tool_calls[0].arguments == {"city": "Paris"}
        assert event.usage is not None and event.usage.streamed
        assert (event.usage.input_tokens, event.usage.output_tokens) == (10, expected), shape
        assert event.cost == event.usage.cost_usd and event.cost > 0
    assert main.requests(OPENAI)[0].body["stream_options"] == {"include_usage": True}


@pytest.mark.requirement("ER-303")
def test_a_stream_broken_after_text_is_never_resent(servers: tuple[FakeLLM, FakeLLM]) -> None:
    """A stream cut after text was delivered ends the turn stream_interrupted: one
    request, the text delivered once."""
    main, _ = servers
    main.script(
        OPENAI,
        openai_stream({"role": "assistant", "content": "Hel"}, {"content": "lo"}, cut=True),
        openai_completion("again"),
    )
    texts: list[str] = []
    model = _direct(main, AsyncLiteLLMModel, on_text=texts.append)
    session = _session()
    finish = asyncio.run(
        sm.arun_turn(
            session.new_turn(),
            model=model,
            tools=AsyncTools(),
            context=AsyncContext(),
            sleep=_no_sleep,
        )
    )
    assert finish.status == sm.TurnStatus.STREAM_INTERRUPTED
    assert main.count(OPENAI) == 1 and "".join(texts) == "Hello"


@pytest.mark.requirement("ER-303")
def test_a_cancelled_stream_charges_the_usage_it_reported() -> None:
    """A turn cancelled while its stream stalls after a usage chunk: the Cancelled
    charges that usage, priced by LiteLLM (what the OpenAI provider does)."""
    from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices, Usage

    chunk = ModelResponseStream(
        id="s",
        model="gpt-4o",
        choices=[StreamingChoices(delta=Delta(content="Hel", role="assistant"))],
        usage=Usage(prompt_tokens=1000, completion_tokens=3, total_tokens=1003),
    )

    async def scenario() -> tuple[sm.Session, sm.Turn]:
        reported = asyncio.Event()
        model = AsyncLiteLLMModel("openai/gpt-4o", on_text=lambda _text: None)

        async def stalled(**_kwargs: Any) -> _Stalled:
            return _Stalled(chunk, reported)

        model.client.target = type("Stalls", (), {"acompletion": staticmethod(stalled)})()
        session = _session()
        turn = session.new_turn()
        await cancel_once_reported(turn, model, reported)
        return session, turn

    session, turn = asyncio.run(scenario())
    assert turn.status is sm.TurnStatus.CANCELLED
    expected = sum(litellm.cost_per_token(model="gpt-4o", prompt_tokens=1000, completion_tokens=3))
    assert session.cost_usd == pytest.approx(expected) and expected > 0


@pytest.mark.requirement("ER-300")
def test_content_filter_and_withheld_tools(servers: tuple[FakeLLM, FakeLLM]) -> None:
    """A 200 whose finish_reason is content_filter is content_filtered; a final-answer
    call sends no tools."""
    main, _ = servers
    main.script(
        OPENAI, openai_completion(None, finish_reason="content_filter"), openai_completion("ok")
    )
    tools = [
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    ]
    model = _direct(main, tools=tools)
    event = model.complete(sm.CallModel(MESSAGES, attempt=0))
    assert isinstance(event, sm.ModelFailed)
    assert event.error.category == sm.ErrorCategory.CONTENT_FILTERED
    assert isinstance(
        model.complete(sm.CallModel(MESSAGES, attempt=0, withhold_tools=True)), sm.ModelReplied
    )
    assert "tools" in main.requests(OPENAI)[0].body and "tools" not in main.requests(OPENAI)[1].body


def test_without_litellm_the_providers_import_and_building_one_names_the_extra() -> None:
    """``statemachine.providers`` imports without litellm (it is imported when a
    LiteLLM provider is built); building one names the extra's install line."""
    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'litellm':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "from statemachine.providers import LiteLLMModel\n"
        "try:\n"
        "    LiteLLMModel('openai/gpt-5')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message = out.stdout.strip()
    assert message.startswith("statemachine.integrations.litellm needs "), message
    assert "pip install 'turnstate[litellm]'" in message and "No module named 'litellm" in message


@pytest.mark.requirement("ER-300")
def test_the_pages_litellm_example_runs_against_the_vendor(
    servers: tuple[FakeLLM, FakeLLM],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/integrations.md's LiteLLM block, run as written with LiteLLM's OpenAI route
    pointed at the loopback vendor."""
    (code,) = [code for _, code in blocks(DOCS, "python") if "AsyncLiteLLMModel(" in code]
    main, _ = servers
    main.script(OPENAI, openai_completion("It is sunny in Paris, 21 °C."))
    monkeypatch.setenv("OPENAI_BASE_URL", main.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "loopback")
    exec(compile(code, str(DOCS), "exec"), {"__name__": "docs"})  # noqa: S102 - our docs
    assert capsys.readouterr().out == "completed It is sunny in Paris, 21 °C.\n"
    assert main.count(OPENAI) == 1


@pytest.mark.requirement("ER-300")
def test_a_fallback_model_on_its_own_server_takes_its_own_call_arguments(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """model_kwargs gives a model its own arguments (a fallback's api_base): a 5xx storm
    on the default model (max_retries=1: two requests) falls back to the backup server;
    a retry knob among them is refused too."""
    main, backup = servers
    main.script(OPENAI, *[openai_error(500, "The server had an error", "server_error")] * 2)
    backup.script(OPENAI, openai_completion("from the backup"))
    model = _direct(main, model_kwargs={"openai/gpt-backup": {"api_base": backup.url + "/v1"}})
    session = _session(max_retries=1, fallback_models=("openai/gpt-backup",))
    finish = sm.run_turn(
        session.new_turn(), model=model, tools=Tools(), context=Context(), sleep=lambda _s: None
    )
    assert finish.status == sm.TurnStatus.COMPLETED
    assert (main.count(OPENAI), backup.count(OPENAI)) == (2, 1)
    assert backup.requests(OPENAI)[0].body["model"] == "gpt-backup"
    with pytest.raises(sm.ConfigError, match="fallbacks"):
        _direct(main, model_kwargs={"openai/gpt-backup": {"fallbacks": ["x"]}})
