"""I/O at the edge: drivers, ``classify``, SDK providers, MCP servers and tool routing.

Thin layers around the pure core; their public names are re-exported by
``statemachine``, ``statemachine.providers``, ``statemachine.mcp`` and ``statemachine.tools``.
"""
