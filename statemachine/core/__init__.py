"""The engine core: the table, the declared state, the engine over it, the value types.

Pure: no I/O, no clock or randomness of its own. ``statemachine/__init__.py`` re-exports
its public names.
"""
