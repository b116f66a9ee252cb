"""``RedisStore``: session records in Redis, the version check done inside Redis.

Each session is one hash, ``<prefix>[:<tenant>]:session:{<id>}`` (the braces make the
id the key's hash tag: one slot per session on a cluster), with the fields ``version``,
``record`` (the JSON record) and ``incarnation``. Reads and writes are Lua scripts, each
one atomic step on the server. Routing is ``_redis_cluster``'s; redis-py's errors are
translated here, at this one boundary.

The previous release's key, ``<prefix>[:<tenant>]:session:<id>``, is read where the new
one is missing and moved by the record's next write: on one server in the same script;
on a cluster, where the keys are in different slots, in two steps (``_PEEK`` reads and
checks the old key, the compare-and-set writes the new key only while it is missing,
then the old key is deleted). A worker dying between the steps leaves the old key
hidden behind the new one, removed by :meth:`RedisStore.delete`.
"""

from __future__ import annotations

import math
from contextlib import suppress
from typing import TYPE_CHECKING, Any, NoReturn

from ..core._exceptions import ConfigError
from ._bytes import BytesStore
from ._core import (
    DEFAULT_MAX_BYTES,
    check_max_bytes,
    check_name,
    check_payload,
    check_ttl,
    check_version,
    key_prefix,
)
from ._errors import CorruptSession, StoreUnavailable, not_found, oversized, stale
from ._redis_cluster import Router

if TYPE_CHECKING:
    import redis
    import redis.cluster

# KEYS[1] the session's key; KEYS[2] (on one server) its key of the previous release,
# read when KEYS[1] does not exist; ARGV[1] max_bytes.
# -> {0} no record | {-1, type, key read} | {1, version|false, record|false, size, key read}
_LOAD = """
local key = KEYS[1]
local kind = redis.call('TYPE', key)['ok']
if kind == 'none' and KEYS[2] then
  key = KEYS[2]
  kind = redis.call('TYPE', key)['ok']
end
if kind == 'none' then return {0} end
if kind ~= 'hash' then return {-1, kind, key} end
local version = redis.call('HGET', key, 'version')
local size = redis.call('HSTRLEN', key, 'record')
if size > tonumber(ARGV[1]) then return {1, version, false, size, key} end
return {1, version, redis.call('HGET', key, 'record'), size, key}
"""

# KEYS[1] the key; KEYS[2] as for _LOAD (a record there is moved to KEYS[1] by the
# write); ARGV[1] expected version (0: must not exist); ARGV[2] the record; ARGV[3] TTL
# in ms (0: no expiry); ARGV[4] the record's incarnation ('' if none); ARGV[5] (only
# on a cluster, moving a record from the previous release's key, whose incarnation the
# caller has checked) the version a missing KEYS[1] stands for.
# -> {1, new version} | {0, actual version} | {-1, what is wrong, key read}
#    | {2, actual version}
#    (2: the stored session is another incarnation)
_CAS = """
local key = KEYS[1]
local kind = redis.call('TYPE', key)['ok']
if kind == 'none' and KEYS[2] then
  local old = redis.call('TYPE', KEYS[2])['ok']
  if old ~= 'none' then key, kind = KEYS[2], old end
end
local current = 0
if kind == 'hash' then
  local raw = redis.call('HGET', key, 'version')
  current = tonumber(raw)
  if current == nil then return {-1, 'version field ' .. tostring(raw), key} end
elseif kind ~= 'none' then
  return {-1, 'a ' .. kind .. ', not a hash', key}
elseif ARGV[5] then
  current = tonumber(ARGV[5])
end
if current ~= tonumber(ARGV[1]) then return {0, current} end
if kind ~= 'none' and current > 0 and ARGV[4] ~= '' then
  local stored = redis.call('HGET', key, 'incarnation')
  if stored and stored ~= ARGV[4] then return {2, current} end
end
if key ~= KEYS[1] then redis.call('DEL', key) end
current = current + 1
redis.call('HSET', KEYS[1], 'version', current, 'record', ARGV[2], 'incarnation', ARGV[4])
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) else redis.call('PERSIST', KEYS[1]) end
return {1, current}
"""

# KEYS[1] a key of the previous release (on a cluster, where no script can reach it
# together with the new key). -> {0} no record | {-1, what is wrong, key}
#    | {1, version, incarnation|false}
_PEEK = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return {0} end
if kind ~= 'hash' then return {-1, 'a ' .. kind .. ', not a hash', KEYS[1]} end
local raw = redis.call('HGET', KEYS[1], 'version')
if tonumber(raw) == nil then return {-1, 'version field ' .. tostring(raw), KEYS[1]} end
return {1, tonumber(raw), redis.call('HGET', KEYS[1], 'incarnation')}
"""


DEFAULT_TIMEOUT_S = 2.0
"""The default socket and connect timeouts of a :class:`RedisStore`, in seconds."""

DEFAULT_REPLICA_TIMEOUT_S = 1.0
"""How long a write waits for its replicas by default (with ``replicas`` > 0), in seconds."""


def _check_timeout(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise ConfigError(f"{name}: must be a finite number of seconds > 0, got {value!r:.60}")
    return float(value)


def _check_replicas(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"replicas: must be an int >= 0, got {value!r:.60}")
    return value


def _check_wait(replicas: int, replica_timeout_s: float, reply_timeout_s: float) -> None:
    if replicas and replica_timeout_s >= reply_timeout_s:
        raise ConfigError(
            f"replica_timeout_s: must be shorter than the reply timeout "
            f"({reply_timeout_s:g} s), or the wait for replicas times out as an "
            f"unanswered call; got {replica_timeout_s:g}"
        )


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _is_cluster(client: object) -> bool:
    """Whether ``client`` is a ``RedisCluster``; ``ConfigError`` unless it is that or a
    ``redis.Redis`` (not a pipeline of either, not an asyncio client)."""
    try:
        import redis  # noqa: PLC0415 - an optional dependency
        from redis.cluster import ClusterPipeline, RedisCluster  # noqa: PLC0415
    except ImportError:  # pragma: no cover - the extra is installed wherever a client is
        raise ConfigError(
            "client: redis-py is not installed (pip install turnstate[redis])"
        ) from None
    if isinstance(client, ClusterPipeline | redis.client.Pipeline) or not isinstance(
        client, RedisCluster | redis.Redis
    ):
        raise ConfigError(
            "client: must be a redis.Redis or a redis.cluster.RedisCluster (synchronous, "
            f"not a pipeline), got {type(client).__module__}.{type(client).__qualname__}"
        )
    return isinstance(client, RedisCluster)


def _pool_kwargs(client: Any, cluster: bool) -> list[dict[str, Any]]:
    """The connection settings ``client`` makes new connections with: its pool's, or
    for a cluster, its node manager's and each known node's pool's."""
    if not cluster:
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
        return [kwargs] if isinstance(kwargs, dict) else []
    pools = [n.redis_connection.connection_pool for n in client.get_nodes() if n.redis_connection]
    return [client.nodes_manager.connection_kwargs, *(pool.connection_kwargs for pool in pools)]


class RedisStore(BytesStore):
    """Session records in Redis (redis-py, the optional extra ``redis``); see
    docs/workers.md.

    ``client`` is a ``redis.Redis`` or a ``redis.cluster.RedisCluster``
    (``decode_responses`` either way). Keys are ``<prefix>[:<tenant>]:session:{<id>}``
    (one tenant's ids cannot address another's keys); a record of the previous release's
    key is read there and moved by its next write. With ``ended_ttl_s`` an ended session
    expires that many seconds after its last write. Records over ``max_bytes`` are
    refused on write and reported corrupt on read.

    ``replicas=n``: every write waits (``WAIT``) until ``n`` replicas of the session's
    master hold it, at most ``replica_timeout_s`` (shorter than ``timeout_s``), else
    :class:`StoreUnavailable` (the write is on the master and may not survive a
    failover). ``timeout_s`` bounds every reply and ``connect_timeout_s`` every
    connection attempt: set on ``client``'s pools where it left them unset (redis-py
    blocks forever by default); the client's own values are kept and reported. A
    frozen or unreachable server, or a slot no master serves, is
    :class:`StoreUnavailable` in bounded time.
    """

    def __init__(
        self,
        client: redis.Redis | redis.cluster.RedisCluster,
        *,
        prefix: str = "statemachine",
        tenant: str | None = None,
        ended_ttl_s: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_TIMEOUT_S,
        replicas: int = 0,
        replica_timeout_s: float = DEFAULT_REPLICA_TIMEOUT_S,
    ) -> None:
        self.cluster = _is_cluster(client)
        """Whether the client is a ``RedisCluster``."""
        self.timeout_s = _check_timeout("timeout_s", timeout_s)
        self.connect_timeout_s = _check_timeout("connect_timeout_s", connect_timeout_s)
        self.replicas = _check_replicas(replicas)
        self.replica_timeout_s = _check_timeout("replica_timeout_s", replica_timeout_s)
        self._prefix = key_prefix(prefix, tenant)
        self.ended_ttl_s = check_ttl(ended_ttl_s)
        self.max_bytes = check_max_bytes(max_bytes)
        settings = _pool_kwargs(client, self.cluster)
        reply_timeout = min(
            [k.get("socket_timeout") or self.timeout_s for k in settings] or [self.timeout_s]
        )
        _check_wait(self.replicas, self.replica_timeout_s, reply_timeout)
        # every setting checked: only now is the client changed
        for kwargs in settings:
            if kwargs.get("socket_timeout") is None:
                kwargs["socket_timeout"] = self.timeout_s
            if kwargs.get("socket_connect_timeout") is None:
                kwargs["socket_connect_timeout"] = self.connect_timeout_s
        if settings:  # report what the client will use (its own values win over the store's)
            self.timeout_s = float(settings[0]["socket_timeout"])
            self.connect_timeout_s = float(settings[0]["socket_connect_timeout"])
        if self.cluster:  # connections made before the timeouts were set are made anew
            for node in client.get_nodes():  # type: ignore[union-attr]
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect(inuse_connections=False)
        self.client = client
        self._load = client.register_script(_LOAD)
        self._cas = client.register_script(_CAS)
        self._peek = client.register_script(_PEEK)
        self._router = Router(client, cluster=self.cluster)
        self._wait_ms = max(1, math.ceil(self.replica_timeout_s * 1000))

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **options: Any) -> RedisStore:
        """A store on a new client for ``url`` (``redis://127.0.0.1:6379/0``), with the
        store's timeouts and no automatic retries (``options`` as for the store).

        ``cluster=True``: a ``redis.cluster.RedisCluster`` for a Redis Cluster, ``url``
        naming any one of its nodes; it connects now to learn the cluster's slots
        (``StoreUnavailable`` if no node answers). A ``url`` redis-py cannot parse, or
        a setting the store refuses, is a ``ConfigError`` before anything connects; a
        client the store then refuses is closed."""
        import redis  # noqa: PLC0415 - an optional dependency
        from redis.backoff import NoBackoff  # noqa: PLC0415
        from redis.retry import Retry  # noqa: PLC0415

        if not isinstance(url, str):
            raise ConfigError(f"url: must be a str such as 'redis://host:6379/0', got {url!r:.60}")
        timeout = _check_timeout("timeout_s", options.get("timeout_s", DEFAULT_TIMEOUT_S))
        connect = _check_timeout(
            "connect_timeout_s", options.get("connect_timeout_s", DEFAULT_TIMEOUT_S)
        )
        _check_wait(
            _check_replicas(options.get("replicas", 0)),
            _check_timeout(
                "replica_timeout_s", options.get("replica_timeout_s", DEFAULT_REPLICA_TIMEOUT_S)
            ),
            timeout,
        )
        key_prefix(options.get("prefix", "statemachine"), options.get("tenant"))
        check_ttl(options.get("ended_ttl_s"))
        check_max_bytes(options.get("max_bytes", DEFAULT_MAX_BYTES))
        kind: Any = redis.Redis
        if cluster:
            from redis.cluster import RedisCluster  # noqa: PLC0415

            kind = RedisCluster
        try:
            client = kind.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=connect,
                retry=Retry(NoBackoff(), 0),
            )
        except ValueError as exc:  # what redis-py raises for a URL it cannot parse
            raise ConfigError(f"url: {url!r} is not a Redis URL: {exc}") from exc
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            down = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
            if isinstance(exc, down) or isinstance(exc.__cause__, down):
                raise StoreUnavailable(f"the Redis Cluster at {url} is unavailable: {exc}") from exc
            raise ConfigError(f"url: {url!r} does not lead to a Redis Cluster: {exc}") from exc
        try:
            return cls(client, **options)
        except BaseException:
            client.close()
            raise

    def key(self, session_id: str) -> str:
        """The Redis key of ``session_id`` (validated): ``<prefix>:session:{<id>}``."""
        return f"{self._prefix}{{{check_name(session_id)}}}"

    def _keys(self, session_id: str) -> list[str]:
        """The session's key, and on one server its key of the previous release."""
        key = self.key(session_id)
        return [key] if self.cluster else [key, self._old_key(session_id)]

    def _old_key(self, session_id: str) -> str:
        """The key the previous release wrote ``session_id`` (validated) under."""
        return self._prefix + check_name(session_id)

    def load_payload(self, session_id: str) -> tuple[int, bytes]:
        reply = self._run(session_id, self._load, self._keys(session_id), self.max_bytes)
        if reply[0] == 0 and self.cluster:
            reply = self._run(session_id, self._load, [self._old_key(session_id)], self.max_bytes)
        if reply[0] == 0:
            raise not_found(session_id)
        if reply[0] == -1:
            raise CorruptSession(
                f"session {session_id!r}: key {_text(reply[2])!r} holds a {_text(reply[1])}, "
                "not a session record",
                session_id=session_id,
            )
        _, raw_version, payload, size, key = reply
        key = _text(key)
        try:
            version = int(_text(raw_version))
        except ValueError:
            version = 0
        if version < 1:
            raise CorruptSession(
                f"session {session_id!r}: key {key!r} has no valid version ({raw_version!r})",
                session_id=session_id,
            )
        if payload is None:
            if int(size) > self.max_bytes:
                raise oversized(session_id, int(size), self.max_bytes)
            raise CorruptSession(
                f"session {session_id!r}: key {key!r} has no record field",
                session_id=session_id,
            )
        # the script read the record only when it fits (HSTRLEN: its size in bytes)
        return version, payload.encode() if isinstance(payload, str) else payload

    def compare_and_set_payload(
        self,
        session_id: str,
        expected_version: int,
        payload: bytes,
        incarnation: str | None,
        ended: bool = False,
    ) -> int:
        keys = self._keys(session_id)
        expected = check_version(session_id, expected_version)
        check_payload(session_id, payload, self.max_bytes)
        ttl_ms = 0
        if ended and self.ended_ttl_s is not None:
            ttl_ms = max(1, math.ceil(self.ended_ttl_s * 1000))
        args = [expected, payload, ttl_ms, incarnation or ""]
        if self.cluster:
            reply = self._cluster_cas(session_id, keys, args)
        else:
            reply = self._run(session_id, self._cas, keys, *args)
        if reply[0] == 1:
            return int(reply[1])
        if reply[0] == 2:
            raise stale(session_id, expected, int(reply[1]), another_incarnation=True)
        if reply[0] == -1:
            raise CorruptSession(
                f"session {session_id!r}: key {_text(reply[2])!r} holds {_text(reply[1])}; "
                "nothing was written",
                session_id=session_id,
            )
        raise stale(session_id, expected, int(reply[1]))

    def _cluster_cas(self, session_id: str, keys: list[str], args: list[Any]) -> list[Any]:
        """The compare-and-set on a cluster, where the previous release's key of the
        session is in another slot: a record there is moved by this write in two steps
        (see the module's docstring); a session created there is not created again."""
        old = self._old_key(session_id)
        expected, incarnation = args[0], args[3]
        if expected == 0:
            peeked = self._run(session_id, self._peek, [old])
            if peeked[0] != 0:  # it exists under the old key: a conflict, or corrupt
                return peeked if peeked[0] == -1 else [0, int(peeked[1])]
            return self._run(session_id, self._cas, keys, *args)
        reply = self._run(session_id, self._cas, keys, *args)
        if reply[:2] != [0, 0]:  # the key exists (or it was written): no move
            return reply
        peeked = self._run(session_id, self._peek, [old])
        if peeked[0] == 0:  # moved by another worker since the first call, or gone
            return self._run(session_id, self._cas, keys, *args)
        if peeked[0] == -1:
            return peeked
        version = int(peeked[1])
        if version != expected:
            return [0, version]
        if incarnation and peeked[2] is not None and _text(peeked[2]) != incarnation:
            return [2, version]
        reply = self._run(session_id, self._cas, keys, *args, version)
        if reply[0] == 1:
            import redis  # noqa: PLC0415 - an optional dependency

            # written: a failed delete leaves the old key hidden behind the new one
            with suppress(redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                self.client.delete(old)
        return reply

    def delete(self, session_id: str) -> bool:
        """Remove the record (under the session's key and the previous release's);
        whether there was one."""
        keys = [self.key(session_id), self._old_key(session_id)]
        try:
            return bool(self.client.delete(*keys))
        except Exception as exc:
            self._translate(session_id, exc)

    def _run(self, session_id: str, script: Any, keys: list[str], *args: Any) -> list[Any]:
        """``script``'s reply; with ``replicas``, a write's only once they hold it."""
        write = script is self._cas
        wait = (self.replicas, self._wait_ms) if write and self.replicas else None
        try:
            if self.cluster or wait is not None:
                reply, acked = self._router.run(script, keys, args, write=write, wait=wait)
            else:
                reply, acked = list(script(keys=keys, args=list(args))), None
        except Exception as exc:
            self._translate(session_id, exc)
        if acked is not None and reply[0] == 1 and int(acked) < self.replicas:
            raise StoreUnavailable(
                f"session {session_id!r}: version {reply[1]} was written on the master, "
                f"but {acked} of {self.replicas} replica(s) acknowledged it within "
                f"{self.replica_timeout_s:g} s, so it may or may not survive a failover "
                "(advance again with the same key to find out)",
                session_id=session_id,
            )
        return reply

    def _translate(self, session_id: str, exc: Exception) -> NoReturn:
        import redis  # noqa: PLC0415 - an optional dependency
        from redis import exceptions as errors  # noqa: PLC0415

        if isinstance(exc, errors.ConnectionError | errors.TimeoutError):
            raise StoreUnavailable(
                f"session {session_id!r}: Redis is unavailable: {exc} (a write sent before "
                "it stopped answering may still be applied: advance again with the same "
                "key to find out)",
                session_id=session_id,
            ) from exc
        moved = isinstance(exc, errors.AskError | errors.ClusterCrossSlotError)
        if not self.cluster and moved:
            raise ConfigError(
                f"client: the server is a Redis Cluster node ({exc}); use "
                "RedisStore.from_url(url, cluster=True) or a redis.cluster.RedisCluster "
                f"client (session {session_id!r}: nothing was written)"
            ) from exc
        if moved or isinstance(
            exc,
            errors.ClusterDownError
            | errors.TryAgainError
            | errors.ClusterError
            | errors.RedisClusterException,  # no node answers, or none serves the slot
        ):
            raise StoreUnavailable(
                f"session {session_id!r}: Redis is unavailable: no master of the cluster "
                f"serves its slot right now ({type(exc).__name__}: {exc}); a failover takes "
                "about twice the cluster-node-timeout: try again",
                session_id=session_id,
            ) from exc
        if isinstance(exc, errors.ReadOnlyError | errors.OutOfMemoryError):
            raise StoreUnavailable(
                f"session {session_id!r}: Redis is unavailable: {exc} (a replica, or a "
                "server out of memory, refused the call: nothing was written)",
                session_id=session_id,
            ) from exc
        if isinstance(exc, UnicodeDecodeError):  # a decode_responses client, binary data
            raise CorruptSession(
                f"session {session_id!r}: the stored data is not UTF-8 text: {exc}",
                session_id=session_id,
            ) from exc
        if isinstance(exc, redis.exceptions.ResponseError) and "WRONGTYPE" in str(exc):
            raise CorruptSession(
                f"session {session_id!r}: its key holds another kind of value: {exc}",
                session_id=session_id,
            ) from exc
        raise exc

    def __repr__(self) -> str:
        kind = "RedisStore (cluster)" if self.cluster else "RedisStore"
        return f"<{kind} {self._prefix}{{*}}>"
