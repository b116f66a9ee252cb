"""Sending one of ``RedisStore``'s scripts to the master that serves a session's key.

On one server that is the client's server. On a Redis Cluster the script goes straight
to the node the client's map of the slots names for the key, and the router follows
``MOVED`` (the map learned anew), ``ASK`` (sent once to the new node, after ``ASKING``)
and ``NOSCRIPT`` (loaded, sent again), at most :data:`REDIRECTS` times in a row: none
of these means the script ran. After a lost connection the map is learned anew and a
read is sent once more; a write is not, since it may have landed. With ``replicas`` a
write is followed by ``WAIT`` on the connection that sent it. Every other error is
raised as redis-py raised it, for the store to translate.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

REDIRECTS = 5
"""How many redirections (MOVED, ASK, NOSCRIPT) one call follows before it gives up."""


def _refused(exc: Exception) -> bool:
    """Whether ``exc`` is a connection lost or refused (not a reply that timed out)."""
    from redis import exceptions  # noqa: PLC0415 - an optional dependency

    return isinstance(exc, exceptions.ConnectionError)  # a TimeoutError is not one


class Router:
    """Sends scripts of ``client`` (a ``redis.Redis``, or with ``cluster`` a
    ``RedisCluster``) to the master serving their first key."""

    def __init__(self, client: Any, *, cluster: bool) -> None:
        self.client = client
        self.cluster = cluster

    def run(
        self, script: Any, keys: list[str], args: tuple[Any, ...], *, write: bool, wait: Any
    ) -> tuple[list[Any], Any]:
        """The reply of ``script`` (a redis-py ``Script``) on the master serving
        ``keys[0]``, and with ``wait`` (``(replicas, timeout in ms)``, for a write) how
        many replicas acknowledged it; ``(reply, None)`` without. A reply that is an
        error is raised; so is ``ClusterError`` after :data:`REDIRECTS` redirections."""
        import redis  # noqa: PLC0415 - an optional dependency

        errors = redis.exceptions
        asking: str | None = None
        resent = False
        for _ in range(REDIRECTS):
            node = self.node(keys[0], asking)
            try:
                if asking is None and wait is None:
                    try:
                        reply = node.evalsha(script.sha, len(keys), *keys, *args)
                    except errors.ResponseError as exc:  # a redirection, or an error reply
                        reply = exc
                    acked: Any = None
                else:
                    pipe = node.pipeline(transaction=False)
                    if asking is not None:
                        pipe.execute_command("ASKING")
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                    if wait is not None:
                        pipe.execute_command("WAIT", *wait)
                    replies = pipe.execute(raise_on_error=False)
                    reply, acked = replies[-2:] if wait is not None else (replies[-1], None)
            except (errors.ConnectionError, errors.TimeoutError) as exc:
                self.refresh()  # the node may have failed: ask the cluster who serves now
                if write or resent or not _refused(exc):
                    raise
                resent = True
                continue
            asking = None
            if isinstance(reply, errors.NoScriptError):
                node.script_load(script.script)
                continue
            if self.cluster and isinstance(reply, errors.MovedError):
                self.refresh()
                continue
            if self.cluster and isinstance(reply, errors.AskError):
                asking = f"{reply.host}:{reply.port}"
                continue
            for answer in (reply, acked):
                if isinstance(answer, Exception):
                    raise answer
            return list(reply), acked
        raise errors.ClusterError(
            f"the call was redirected {REDIRECTS} times (the cluster's slots are moving); "
            "nothing was written"
        )

    def node(self, key: str, asking: str | None) -> Any:
        """The client of the master serving ``key`` (or of the ASK target): the
        client itself on one server."""
        if not self.cluster:
            return self.client
        client = self.client
        if asking is None:
            return client.get_redis_connection(client.get_node_from_key(key))
        node = client.get_node(node_name=asking)
        if node is None:  # an ASK target the client has not met: learn the cluster anew
            client.nodes_manager.initialize()
            node = client.get_node(node_name=asking)
        if node is None:
            import redis  # noqa: PLC0415 - an optional dependency

            raise redis.exceptions.ClusterError(f"ASK to {asking}, a node the cluster denies")
        return client.get_redis_connection(node)

    def refresh(self) -> None:
        """On a cluster, learn the slots anew (after a failed node or a MOVED); a
        cluster that does not answer is left to the next call."""
        if self.cluster:
            import redis  # noqa: PLC0415 - an optional dependency

            with suppress(redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                self.client.nodes_manager.initialize()
