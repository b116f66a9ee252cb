"""``RedisStore``: session records in Redis, the version check done inside Redis.

Each session is one hash, ``<prefix>[:<tenant>]:session:<id>``, with two fields:
``version`` (an integer, 1 after the first write) and ``record`` (the JSON record).
Both reads and writes are Lua scripts, so each is one atomic step on the server:
a compare-and-set reads the version and writes the new record with no window in
between for another worker, and a read never sees a version from one write and a
record from another. Errors of redis-py are translated here, at this one boundary.
"""

from __future__ import annotations

import math
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

if TYPE_CHECKING:
    import redis

# KEYS[1] the session's key; ARGV[1] max_bytes.
# -> {0} no record | {-1, type} not a hash | {1, version|false, record|false, size}
_LOAD = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return {0} end
if kind ~= 'hash' then return {-1, kind} end
local version = redis.call('HGET', KEYS[1], 'version')
local size = redis.call('HSTRLEN', KEYS[1], 'record')
if size > tonumber(ARGV[1]) then return {1, version, false, size} end
return {1, version, redis.call('HGET', KEYS[1], 'record'), size}
"""

# KEYS[1] the key; ARGV[1] expected version (0: must not exist); ARGV[2] the record;
# ARGV[3] TTL in ms (0: no expiry); ARGV[4] the record's incarnation ('' if none).
# -> {1, new version} | {0, actual version} | {-1, what is wrong} | {2, actual version}
#    (2: the stored session is another incarnation)
_CAS = """
local kind = redis.call('TYPE', KEYS[1])['ok']
local current = 0
if kind == 'hash' then
  local raw = redis.call('HGET', KEYS[1], 'version')
  current = tonumber(raw)
  if current == nil then return {-1, 'version field ' .. tostring(raw)} end
elseif kind ~= 'none' then
  return {-1, 'a ' .. kind .. ', not a hash'}
end
if current ~= tonumber(ARGV[1]) then return {0, current} end
if current > 0 and ARGV[4] ~= '' then
  local stored = redis.call('HGET', KEYS[1], 'incarnation')
  if stored and stored ~= ARGV[4] then return {2, current} end
end
current = current + 1
redis.call('HSET', KEYS[1], 'version', current, 'record', ARGV[2], 'incarnation', ARGV[4])
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) else redis.call('PERSIST', KEYS[1]) end
return {1, current}
"""


DEFAULT_TIMEOUT_S = 2.0
"""The default socket and connect timeouts of a :class:`RedisStore`, in seconds."""


def _check_timeout(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise ConfigError(f"{name}: must be a finite number of seconds > 0, got {value!r:.60}")
    return float(value)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class RedisStore(BytesStore):
    """Session records in Redis (redis-py, the optional extra ``redis``).

    ``client`` is a ``redis.Redis`` (``decode_responses`` either way). Keys are
    ``<prefix>:session:<id>``, or ``<prefix>:<tenant>:session:<id>`` with a tenant,
    so one tenant's ids cannot address another's keys. With ``ended_ttl_s`` a
    session that has ended expires that many seconds after its last write.
    Records over ``max_bytes`` are refused on write and reported corrupt on read.

    Timeouts: a frozen or unreachable server gives :class:`StoreUnavailable` in
    bounded time, never a hang. ``timeout_s`` (default 2 s) bounds every reply and
    ``connect_timeout_s`` (default 2 s) every connection attempt; they are set on
    ``client``'s connection pool where the client left them unset (redis-py 5 blocks
    forever by default), and a client's own values are kept (``timeout_s`` and
    ``connect_timeout_s`` then report the client's). :meth:`from_url` builds a
    client with both and no automatic retries, so one call waits at most about
    ``timeout_s``; with a client that retries, multiply by its attempts.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "statemachine",
        tenant: str | None = None,
        ended_ttl_s: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.timeout_s = _check_timeout("timeout_s", timeout_s)
        self.connect_timeout_s = _check_timeout("connect_timeout_s", connect_timeout_s)
        pool = getattr(client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", None)
        if isinstance(kwargs, dict):
            if kwargs.get("socket_timeout") is None:
                kwargs["socket_timeout"] = self.timeout_s
            if kwargs.get("socket_connect_timeout") is None:
                kwargs["socket_connect_timeout"] = self.connect_timeout_s
            # report what the client will use (its own values win over the store's)
            self.timeout_s = float(kwargs["socket_timeout"])
            self.connect_timeout_s = float(kwargs["socket_connect_timeout"])
        self.client = client
        self._prefix = key_prefix(prefix, tenant)
        self.ended_ttl_s = check_ttl(ended_ttl_s)
        self.max_bytes = check_max_bytes(max_bytes)
        self._load = client.register_script(_LOAD)
        self._cas = client.register_script(_CAS)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisStore:
        """A store on a new client for ``url`` (``redis://127.0.0.1:6379/0``), with the
        store's timeouts and no automatic retries (``options`` as for the store)."""
        import redis  # noqa: PLC0415 - an optional dependency
        from redis.backoff import NoBackoff  # noqa: PLC0415
        from redis.retry import Retry  # noqa: PLC0415

        timeout = _check_timeout("timeout_s", options.get("timeout_s", DEFAULT_TIMEOUT_S))
        connect = _check_timeout(
            "connect_timeout_s", options.get("connect_timeout_s", DEFAULT_TIMEOUT_S)
        )
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=connect,
            retry=Retry(NoBackoff(), 0),
        )
        return cls(client, **options)

    def key(self, session_id: str) -> str:
        """The Redis key of ``session_id`` (validated)."""
        return self._prefix + check_name(session_id)

    def load_payload(self, session_id: str) -> tuple[int, bytes]:
        """:meth:`load` without decoding: the version and the record's bytes (one Lua
        read)."""
        key = self.key(session_id)
        reply = self._run(session_id, self._load, key, self.max_bytes)
        if reply[0] == 0:
            raise not_found(session_id)
        if reply[0] == -1:
            raise CorruptSession(
                f"session {session_id!r}: key {key!r} holds a {_text(reply[1])}, "
                "not a session record",
                session_id=session_id,
            )
        _, raw_version, payload, size = reply
        try:
            version = int(_text(raw_version))
        except ValueError:
            version = 0
        if raw_version is None or version < 1:
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
        if isinstance(payload, str):
            payload = payload.encode()
        if not isinstance(payload, bytes):
            raise CorruptSession(
                f"session {session_id!r}: the stored record is not text ({type(payload).__name__})",
                session_id=session_id,
            )
        if len(payload) > self.max_bytes:
            raise oversized(session_id, len(payload), self.max_bytes)
        return version, payload

    def compare_and_set_payload(
        self,
        session_id: str,
        expected_version: int,
        payload: bytes,
        *,
        incarnation: str | None,
        ended: bool = False,
    ) -> int:
        """:meth:`compare_and_set` of a record already encoded as JSON bytes (what a
        :class:`~statemachine.store.Worker` writes); ``incarnation`` is the one the
        record names."""
        key = self.key(session_id)
        expected = check_version(session_id, expected_version)
        check_payload(session_id, payload, self.max_bytes)
        ttl_ms = 0
        if ended and self.ended_ttl_s is not None:
            ttl_ms = max(1, math.ceil(self.ended_ttl_s * 1000))
        incarnation = incarnation or ""
        reply = self._run(session_id, self._cas, key, expected, payload, ttl_ms, incarnation)
        if reply[0] == 1:
            return int(reply[1])
        if reply[0] == 2:
            raise stale(session_id, expected, int(reply[1]), another_incarnation=True)
        if reply[0] == -1:
            raise CorruptSession(
                f"session {session_id!r}: key {key!r} holds {_text(reply[1])}; nothing was written",
                session_id=session_id,
            )
        raise stale(session_id, expected, int(reply[1]))

    def delete(self, session_id: str) -> bool:
        """Remove the record; whether there was one."""
        key = self.key(session_id)
        try:
            return bool(self.client.delete(key))
        except Exception as exc:
            self._translate(session_id, exc)

    def _run(self, session_id: str, script: Any, key: str, *args: object) -> list[Any]:
        try:
            reply = script(keys=[key], args=list(args))
        except Exception as exc:
            self._translate(session_id, exc)
        return list(reply)

    def _translate(self, session_id: str, exc: Exception) -> NoReturn:
        import redis  # noqa: PLC0415 - an optional dependency

        if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            raise StoreUnavailable(
                f"session {session_id!r}: Redis is unavailable: {exc} (a write sent before "
                "it stopped answering may still be applied: advance again with the same "
                "key to find out)",
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
        return f"<RedisStore {self._prefix}*>"
