"""Development tools of the project (``python -m tools.mutate``)."""
