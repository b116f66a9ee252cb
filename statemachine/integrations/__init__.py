"""Drop-in integrations: the engine where an agent framework calls its model.

* :mod:`statemachine.integrations.pydantic_ai`: ``EngineModel``, a pydantic-ai model
  (``pip install 'turnstate[pydantic-ai]'``);
* :mod:`statemachine.integrations.openai_agents`: ``EngineModel`` and
  ``EngineModelProvider`` for the OpenAI Agents SDK (``pip install
  'turnstate[openai-agents]'``);
* :mod:`statemachine.integrations.langchain`: ``EngineChatModel``, a LangChain chat
  model for LangChain and LangGraph agents (``pip install 'turnstate[langchain]'``);
* :mod:`statemachine.integrations.litellm`: ``LiteLLMModel`` and ``AsyncLiteLLMModel``,
  model providers over LiteLLM (public as :mod:`statemachine.providers`; ``pip install
  'turnstate[litellm]'``).

Each framework request is one engine turn: the engine decides the retries, the waits,
the fallbacks and the context reductions, and a turn it ends without a reply reaches
the caller as :class:`TurnFailed` naming the status. Importing this package imports
no framework. See ``docs/integrations.md``.
"""

from ._bridge import TurnFailed

__all__ = ["TurnFailed"]
