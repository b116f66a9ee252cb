"""Developer tools: the model check, ``simulate`` and its scenarios, diagrams, the CLI.

``import statemachine`` never imports this package; ``python -m statemachine`` does.
"""
