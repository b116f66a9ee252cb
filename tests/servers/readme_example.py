"""The README's SDK example ("A turn behind a real SDK"), verbatim below the marker
(tests/test_docs.py checks it); tests/test_sdk_e2e.py runs it against the loopback server."""

# --- README snippet ---
import asyncio
import time

import anthropic

import statemachine as sm
from statemachine.providers import AsyncAnthropicModel


class Context:  # your context assembly: messages, tools, system prompt
    async def assemble(self, action):
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        return sm.Assembled({"messages": messages}, size=len(str(messages)))


class Tools:  # your tools (or statemachine.mcp.MCPStdioTools)
    async def invoke(self, call):
        return sm.ToolOutcome(call.id, ok=True, content=f"{call.name}: sunny")


async def main(base_url=None, api_key=None, sleep=None):
    session = sm.Session(sm.Settings(model_timeout_s=60), seed=1, clock=time.monotonic)
    # max_retries=0: the engine is the one retry owner (api_key=None: ANTHROPIC_API_KEY)
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)
    async with client:
        model = AsyncAnthropicModel(client, model="claude-sonnet-5")
        turn, tools, context = session.new_turn(), Tools(), Context()
        finish = await sm.arun_turn(turn, model=model, tools=tools, context=context, sleep=sleep)
    print(finish.status, [result.content for result in finish.tool_results])
    return finish


if __name__ == "__main__":
    asyncio.run(main())
