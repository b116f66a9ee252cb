"""Ready-made model providers over the official ``anthropic`` and ``openai`` SDKs.

The code lives in :mod:`statemachine.io._providers`; this module is its public name.
"""

from .io._providers import AnthropicModel, AsyncAnthropicModel, AsyncOpenAIModel, OpenAIModel

__all__ = ["AnthropicModel", "AsyncAnthropicModel", "AsyncOpenAIModel", "OpenAIModel"]
