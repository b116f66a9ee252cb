"""Ready-made model providers over the official ``anthropic`` and ``openai`` SDKs.

The code lives in :mod:`statemachine.io._providers`; this module is its public name.
"""

from .integrations.litellm import AsyncLiteLLMModel, LiteLLMModel
from .io._providers import AnthropicModel, AsyncAnthropicModel, AsyncOpenAIModel, OpenAIModel

__all__ = [
    "AnthropicModel",
    "AsyncAnthropicModel",
    "AsyncLiteLLMModel",
    "AsyncOpenAIModel",
    "LiteLLMModel",
    "OpenAIModel",
]
