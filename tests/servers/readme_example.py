"""The README's "Embedding with the async driver and an SDK" example, run by a test."""

import time

import anthropic

import statemachine as sm
from statemachine.providers import AsyncAnthropicModel


class Context:
    async def assemble(self, action: sm.Assemble) -> sm.Assembled:
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        return sm.Assembled({"messages": messages}, size=len(str(messages)))


class Tools:
    async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        return sm.ToolOutcome(call.id, ok=True, content=f"{call.name}: sunny")


async def main(base_url: str | None = None, sleep=None) -> sm.Finish:  # type: ignore[no-untyped-def]
    session = sm.Session(sm.Settings(model_timeout_s=60), seed=1, clock=time.monotonic)
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key="test", max_retries=0) as client:
        model = AsyncAnthropicModel(client, model="claude-sonnet-5")
        turn = session.new_turn()
        finish = await sm.arun_turn(
            turn, model=model, tools=Tools(), context=Context(), sleep=sleep
        )
    print(finish.status, [r.content for r in finish.tool_results])
    return finish
