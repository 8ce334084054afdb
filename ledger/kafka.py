"""Kafka client properties, defined once for every ledger client.

Every producer, consumer and admin client of the ledger and its testbed takes
its librdkafka properties from :func:`producer_config`,
:func:`consumer_config` or :func:`admin_config` (:func:`client_config`
underneath). Each merges four layers, later ones winning:

1. **the ledger's defaults**: ``bootstrap.servers`` from the settings
   (``LEDGER_BOOTSTRAP_SERVERS`` ...), ``debug`` from ``LEDGER_KAFKA_DEBUG``,
   and each role's tuning (a producer's ``linger.ms`` ...);
2. **the properties file** named by ``LEDGER_KAFKA_CONFIG_FILE``
   (:attr:`LedgerSettings.kafka_config_file`), in the Java properties format
   Kafka's own tools take (:func:`parse_properties`): where security, SASL,
   TLS and the cluster's address go;
3. **pass-through environment variables** ``LEDGER_KAFKA_<PROPERTY>``: the
   property name upper-cased with ``.`` written ``_`` (``LEDGER_KAFKA_SASL_PASSWORD``
   is ``sasl.password``), read from the process environment when a client is
   built. The names of the ledger's own ``LEDGER_KAFKA_*`` settings
   (``LEDGER_KAFKA_HOME``, ``_PORT``, ``_DEBUG``, ``_CONFIG_FILE``) are not
   properties. (Not ``KAFKA_*`` as in Confluent's images: there those are
   broker properties, and ``KAFKA_OPTS``, ``KAFKA_HEAP_OPTS`` or ``KAFKA_HOME``
   set for the Java tools would reach librdkafka as nonsense properties.);
4. **the role's own properties**, which no file or variable can weaken:
   producers are idempotent (``enable.idempotence``, ``acks=all``) and use the
   ``murmur2_random`` partitioner, the Java client's default, so that Java and
   Python producers put a key on the same partition (DESIGN.md "Kafka
   layout"); consumers read ``read_committed`` (KIP-98) unless the code asks
   to see open transactions, never auto-commit and start from the earliest
   offset; transactional IDs, group IDs and static member IDs are the
   ledger's. A file or variable that sets one of those to an unsafe value
   (``enable.idempotence=false``, ``acks=1``, ``isolation.level=read_uncommitted``
   ...) or sets an identity at all is refused (:class:`~ledger.errors.LocalFileError`
   for the file, naming it and the line).

Any other key is handed to librdkafka as it is; librdkafka names a key it
does not know when the client is built. Values of keys that hold secrets are
never printed: :func:`masked` and :func:`describe` (``ledger config``) show
them as ``********``. Every client logs through :data:`CLIENT_LOGGER`, silent
unless a handler is attached.

Kafka's errors are classified here too, once for every caller
(:func:`classify`: retriable, abortable or fatal); stages ride out the
retriable ones with :mod:`consumers.retry`.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException

from ledger.errors import LocalFileError, SettingsError
from ledger.settings import LedgerSettings

#: Logger for librdkafka's own log lines: "connection refused" while a broker
#: boots and the like go here instead of stderr. Silent unless you attach a
#: handler to it (``ledger processor`` does when ``LEDGER_KAFKA_DEBUG`` is set).
CLIENT_LOGGER = logging.getLogger("ledger.kafka.client")
CLIENT_LOGGER.addHandler(logging.NullHandler())
CLIENT_LOGGER.propagate = False

#: The partitioner of every ledger producer (the Java client's default).
PARTITIONER = "murmur2_random"

#: Prefix of the pass-through environment variables (``LEDGER_KAFKA_SASL_USERNAME``).
ENV_PREFIX = "LEDGER_KAFKA_"

#: What a masked secret is shown as.
MASK = "********"

Isolation = Literal["read_committed", "read_uncommitted"]

#: Producer tuning a file may change.
_PRODUCER_DEFAULTS: dict[str, Any] = {"linger.ms": 5, "retry.backoff.ms": 10}

#: What every ledger producer must be (DESIGN.md "Kafka layout").
_PRODUCER_REQUIRED: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "partitioner": PARTITIONER,
}


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("true", "t", "1")


def _falsy(value: str) -> bool:
    return value.strip().lower() in ("false", "f", "0")


#: Keys a file or variable may set only to the value the ledger relies on:
#: key -> (is the value safe, what is required).
_GUARDED: dict[str, tuple[Callable[[str], bool], str]] = {
    "enable.idempotence": (_truthy, "true (no duplicates on a producer retry)"),
    "acks": (
        lambda v: v.strip().lower() in ("all", "-1"),
        "all (evidence on every in-sync replica)",
    ),
    "request.required.acks": (lambda v: v.strip().lower() in ("all", "-1"), "all"),
    "partitioner": (
        lambda v: v.strip() == PARTITIONER,
        f"{PARTITIONER} (co-partitioned topics; the Java client's default)",
    ),
    "isolation.level": (
        lambda v: v.strip() == "read_committed",
        "read_committed (stages never act on an aborted transaction)",
    ),
    "enable.auto.commit": (_falsy, "false (stages commit offsets in their transactions)"),
    "auto.offset.reset": (
        lambda v: v.strip().lower() in ("earliest", "smallest", "beginning"),
        "earliest (a new reader must not skip evidence)",
    ),
}

#: Keys only the ledger sets, per client: key -> why (the remedy).
_LEDGER_OWNED: dict[str, str] = {
    "transactional.id": "each stage instance has its own (from --instance)",
    "group.id": "each stage and reader has its own consumer group",
    "group.instance.id": "each stage instance has its own static member ID",
    "transaction.timeout.ms": "set LEDGER_TRANSACTION_TIMEOUT_MS instead",
    "enable.partition.eof": "the ledger's readers rely on their own choice",
    "logger": "a Python object; the ledger logs through ledger.kafka.client",
}

#: Key parts that mark a value as secret.
_SECRET_WORDS = ("password", "secret", "token", "jaas", "credential", "apikey")
#: Last key parts that name where a secret is (a file, a URL), not the secret.
_NOT_SECRET_TAILS = ("location", "file", "path", "dir", "url", "cmd", "algorithm", "id")


def is_secret(key: str) -> bool:
    """Tell whether a client property's value is a secret that must never be printed.

    Secret: every key with ``password``, ``secret``, ``token``, ``jaas`` or
    ``credential`` in its name, every key with a ``key`` part
    (``ssl.key.pem``), and ``sasl.oauthbearer.config`` (it can hold a client
    secret) -- except keys that name a file, URL or command
    (``ssl.key.location``, ``sasl.oauthbearer.token.endpoint.url``).

    Args:
        key: a librdkafka property name (dotted).

    Returns:
        ``True`` when its value must be masked.
    """
    lowered = key.strip().lower()
    parts = re.split(r"[._-]", lowered)
    if parts[-1] in _NOT_SECRET_TAILS:
        return False
    if lowered == "sasl.oauthbearer.config":
        return True
    return any(word in lowered for word in _SECRET_WORDS) or "key" in parts


def masked(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a client configuration that is safe to print or log.

    Args:
        config: librdkafka properties (values of any type).

    Returns:
        The same keys; the value of every :func:`is_secret` key is
        :data:`MASK` (whatever its length), callbacks and loggers are
        shown by their type name.
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        if is_secret(key):
            out[key] = MASK
        elif callable(value) or isinstance(value, logging.Logger):
            out[key] = f"<{type(value).__name__}>"
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Property:
    """One client property and where it came from.

    Attributes:
        key: the librdkafka property name (dotted).
        value: its value as written (a string from a file or variable).
        source: ``"defaults"``, ``"{file}:{line}"`` or the variable's name.
    """

    key: str
    value: Any
    source: str


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str, path: Path, line: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        if i + 1 >= len(text):
            i += 1  # a lone trailing backslash (after a continuation) means nothing
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise LocalFileError(
                    f"Kafka client properties file {path}, line {line}: malformed \\uXXXX "
                    "escape; write four hexadecimal digits after \\u",
                    expected="\\uXXXX",
                    observed=f"{path}:{line}",
                )
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join continued lines (odd number of trailing backslashes); keep the first line number."""
    lines: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip(" \t\f")
        if pending is None:
            if not line or line[0] in "#!":
                continue
            start, body = number, line
        else:
            start, body = pending[0], pending[1] + line
        trailing = len(body) - len(body.rstrip("\\"))
        if trailing % 2 == 1:
            pending = (start, body[:-1])
            continue
        pending = None
        lines.append((start, body))
    if pending is not None:
        lines.append(pending)
    return lines


def _split(body: str) -> tuple[str, str] | None:
    """Split a logical line at its first unescaped ``=``, ``:`` or whitespace."""
    i = 0
    while i < len(body):
        char = body[i]
        if char == "\\":
            i += 2
            continue
        if char in "=: \t\f":
            key, rest = body[:i], body[i:]
            rest = rest.lstrip(" \t\f")
            if rest[:1] in ("=", ":") and char in " \t\f" or char in "=:":
                rest = rest[1:].lstrip(" \t\f")
            return key, rest
        i += 1
    return None


def parse_properties(text: str, path: Path) -> dict[str, Property]:
    r"""Parse a Java-style properties file, as Kafka's own tools read one.

    ``key=value``, ``key: value`` or ``key value``; blank lines and lines
    whose first non-blank character is ``#`` or ``!`` are comments; a line
    ending in an odd number of backslashes continues on the next; ``\t``,
    ``\n``, ``\uXXXX``, ``\=``, ``\:`` and ``\\`` are escapes. A key
    given twice keeps its last value (as in Java).

    Args:
        text: the file's text.
        path: the file, for messages and sources.

    Returns:
        Key -> :class:`Property` whose source is ``"{path}:{line}"``; values
        are strings.

    Raises:
        LocalFileError: a line has a key but no separator and value, an empty
            key, or a malformed ``\u`` escape; the message names the file
            and line, never the line's text (it may hold a secret).
    """
    found: dict[str, Property] = {}
    for number, body in _logical_lines(text):
        split = _split(body)
        if split is None or not split[0] or not split[1].strip():
            raise LocalFileError(
                f"Kafka client properties file {path}, line {number}: expected "
                "'key=value' (a property name, '=' and its value); comment a line out "
                "with '#'",
                expected="key=value",
                observed=f"{path}:{number}",
            )
        key = _unescape(split[0], path, number).strip()
        value = _unescape(split[1], path, number).strip()
        found[key] = Property(key, value, f"{path}:{number}")
    return found


@functools.lru_cache(maxsize=8)
def _read_file(path: Path, _mtime_ns: int, _size: int) -> dict[str, Property]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise LocalFileError(
            f"Kafka client properties file {path} is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start}); save it as UTF-8 or write the character as \\uXXXX",
            observed=str(path),
        ) from None
    except OSError as exc:
        raise LocalFileError(
            f"cannot read the Kafka client properties file {path} "
            f"(LEDGER_KAFKA_CONFIG_FILE): {exc.strerror}",
            observed=str(path),
        ) from None
    return _checked(parse_properties(text, path), file=path)


def file_properties(path: Path) -> dict[str, Property]:
    """The checked properties of a client properties file (re-read when it changes).

    Args:
        path: the file (``LEDGER_KAFKA_CONFIG_FILE``).

    Returns:
        Key -> :class:`Property`.

    Raises:
        LocalFileError: the file is missing, unreadable, not UTF-8 or
            malformed (:func:`parse_properties`), or sets a property the
            ledger owns or sets one to an unsafe value; the message names
            the file and line.
    """
    try:
        stat = path.stat()
    except OSError as exc:
        raise LocalFileError(
            f"cannot read the Kafka client properties file {path} "
            f"(LEDGER_KAFKA_CONFIG_FILE): {exc.strerror}; fix the path or unset the variable",
            observed=str(path),
        ) from None
    return _read_file(path, stat.st_mtime_ns, stat.st_size)


def _own_setting_names() -> frozenset[str]:
    return frozenset(
        f"LEDGER_{name.upper()}"
        for name in LedgerSettings.model_fields
        if name.startswith("kafka_")
    )


def env_properties(environ: Mapping[str, str] | None = None) -> dict[str, Property]:
    """The pass-through properties of the environment (``LEDGER_KAFKA_<PROPERTY>``).

    ``LEDGER_KAFKA_SECURITY_PROTOCOL=SASL_SSL`` is ``security.protocol``:
    the rest of the name lower-cased, ``_`` read as ``.``. The ledger's own
    settings (``LEDGER_KAFKA_HOME``, ``LEDGER_KAFKA_PORT``,
    ``LEDGER_KAFKA_DEBUG``, ``LEDGER_KAFKA_CONFIG_FILE``) are skipped.

    Args:
        environ: the environment (default ``os.environ``).

    Returns:
        Key -> :class:`Property` whose source is the variable's name.

    Raises:
        LedgerError: a variable sets a property the ledger owns or sets one
            to an unsafe value; the message names the variable.
    """
    env = os.environ if environ is None else environ
    own = _own_setting_names()
    found: dict[str, Property] = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in own or len(name) == len(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower().replace("_", ".")
        found[key] = Property(key, env[name], name)
    return _checked(found, file=None)


def _checked(props: dict[str, Property], *, file: Path | None) -> dict[str, Property]:
    """Refuse a user layer that sets a ledger-owned key or weakens a guarded one."""
    for prop in props.values():
        problem: str | None = None
        if prop.key in _LEDGER_OWNED:
            problem = f"{prop.key} is set by the ledger for each client: {_LEDGER_OWNED[prop.key]}"
        elif prop.key in _GUARDED:
            safe, required = _GUARDED[prop.key]
            if not safe(str(prop.value)):
                problem = (
                    f"{prop.key}={prop.value} would weaken the ledger's guarantees; "
                    f"it must be {required}"
                )
        if problem is None:
            continue
        remedy = "remove the line" if file is not None else "unset the variable"
        message = f"Kafka client property refused ({prop.source}): {problem}; {remedy}"
        if file is not None:
            raise LocalFileError(message, expected="a safe value", observed=prop.source)
        raise SettingsError(message, expected="a safe value", observed=prop.source)
    return props


def user_properties(
    settings: LedgerSettings, environ: Mapping[str, str] | None = None
) -> dict[str, Property]:
    """The file's properties, overridden by the pass-through variables.

    Args:
        settings: uses ``kafka_config_file``.
        environ: the environment (default ``os.environ``).

    Returns:
        Key -> :class:`Property`, checked.

    Raises:
        LocalFileError: see :func:`file_properties`.
        LedgerError: see :func:`env_properties`.
    """
    merged: dict[str, Property] = {}
    if settings.kafka_config_file is not None:
        merged.update(file_properties(Path(settings.kafka_config_file)))
    merged.update(env_properties(environ))
    return merged


def _defaults(settings: LedgerSettings) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": settings.bootstrap_servers}
    if settings.kafka_debug:
        config["debug"] = settings.kafka_debug
    return config


def _merge(
    settings: LedgerSettings, defaults: Mapping[str, Any], required: Mapping[str, Any]
) -> dict[str, Any]:
    config = _defaults(settings)
    config.update(defaults)
    config.update({p.key: p.value for p in user_properties(settings).values()})
    config.update(required)
    config["logger"] = CLIENT_LOGGER
    return config


def bootstrap_servers(settings: LedgerSettings) -> str:
    """The bootstrap list clients use: the file's or a variable's, else the settings'.

    Args:
        settings: the process's settings.

    Returns:
        ``host:port[,host:port]``, for messages.

    Raises:
        LocalFileError, LedgerError: as :func:`user_properties`.
    """
    found = user_properties(settings).get("bootstrap.servers")
    return str(found.value) if found is not None else settings.bootstrap_servers


def client_config(settings: LedgerSettings, **extra: Any) -> dict[str, Any]:
    """Librdkafka settings every client of this ledger starts from.

    Args:
        settings: the process's settings (bootstrap list, debug contexts,
            properties file).
        **extra: the caller's own properties (dotted names), applied last.

    Returns:
        The ledger's defaults, then the file, then ``LEDGER_KAFKA_*``
        variables, then ``extra``, and ``logger`` (:data:`CLIENT_LOGGER`).

    Raises:
        LocalFileError: the properties file is unreadable, malformed or unsafe.
        LedgerError: a ``LEDGER_KAFKA_*`` variable is unsafe.
    """
    return _merge(settings, {}, extra)


def admin_config(settings: LedgerSettings, **extra: Any) -> dict[str, Any]:
    """Settings of an admin client (topic administration, broker checks).

    Args:
        settings: the process's settings.
        **extra: properties applied last, e.g. ``{"bootstrap.servers": ...}``
            for a check of one particular broker.

    Returns:
        A librdkafka admin configuration (see :func:`client_config`).

    Raises:
        LocalFileError, LedgerError: as :func:`client_config`.
    """
    return client_config(settings, **extra)


def producer_config(settings: LedgerSettings, **extra: Any) -> dict[str, Any]:
    """Settings of every ledger producer: idempotent, ``acks=all``, ``murmur2_random``.

    With ``acks=all`` a write is acknowledged only once every in-sync
    replica holds it, and at least the topic's ``min.insync.replicas``
    (``LEDGER_MIN_INSYNC_REPLICAS``, see :func:`ledger.topics.replication_for`):
    what makes replicated topics keep acknowledged evidence.

    Args:
        settings: the process's settings.
        **extra: the caller's properties, applied after the file and
            variables, e.g. ``{"transactional.id": ...}`` for a stage or
            ``{"linger.ms": 1}`` for a publisher. They cannot weaken the
            required properties either: ``enable.idempotence``, ``acks``
            and ``partitioner`` given here are overridden.

    Returns:
        A librdkafka producer configuration.

    Raises:
        LocalFileError, LedgerError: as :func:`client_config`.
    """
    return _merge(settings, _PRODUCER_DEFAULTS, {**extra, **_PRODUCER_REQUIRED})


def consumer_config(
    settings: LedgerSettings,
    group_id: str,
    *,
    isolation: Isolation = "read_committed",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Settings of every ledger consumer: no auto-commit, earliest, ``read_committed``.

    Args:
        settings: the process's settings.
        group_id: the consumer group (``group.id``); readers that never
            commit still need one for librdkafka.
        isolation: ``read_committed`` (the default: only committed
            transactions) or ``read_uncommitted`` (to see how far open
            transactions reach, e.g. while waiting for a previous owner).
        extra: the caller's properties (dotted names), applied after the
            file and variables, e.g. ``{"partition.assignment.strategy": "range"}``.

    Returns:
        A librdkafka consumer configuration.

    Raises:
        LocalFileError, LedgerError: as :func:`client_config`.
    """
    required: dict[str, Any] = {
        "group.id": group_id,
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    required.update(extra or {})
    return _merge(settings, {}, required)


def describe(settings: LedgerSettings) -> list[Property]:
    """The client properties in force for every client, secrets masked, with their sources.

    Args:
        settings: the process's settings.

    Returns:
        One :class:`Property` per key, sorted by key: the ledger's defaults
        (source ``"defaults"``) overridden by the file and variables; the
        value of every :func:`is_secret` key is :data:`MASK`. A role's own
        properties (see the module's docstring) come on top of these.

    Raises:
        LocalFileError, LedgerError: as :func:`client_config`.
    """
    merged = {k: Property(k, v, "defaults") for k, v in _defaults(settings).items()}
    merged.update(user_properties(settings))
    return [
        Property(p.key, MASK if is_secret(p.key) else p.value, p.source)
        for p in sorted(merged.values(), key=lambda p: p.key)
    ]


#: A role's own properties, for ``ledger config``: role -> key -> value.
ROLE_PROPERTIES: dict[str, dict[str, str]] = {
    "producer": {
        "enable.idempotence": "true",
        "acks": "all",
        "partitioner": PARTITIONER,
        "transactional.id": "(per stage instance)",
    },
    "consumer": {
        "isolation.level": "read_committed (read_uncommitted only for transaction probes)",
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
        "group.id": "(per stage or reader)",
    },
}


# --------------------------------------------------------------------------- errors

#: What to do about a Kafka error: ride it out, abort the transaction, or the caller's own handling.
ErrorClass = Literal["retriable", "abortable", "fatal"]

#: Errors with which Kafka refuses a zombie's transaction: its group
#: membership or generation is gone (KIP-447) or its producer was fenced.
FENCING_CODES = frozenset(
    {
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError._FENCED,
    }
)

#: Never ridden out, whatever librdkafka says: a fenced zombie, a principal
#: that is not allowed, a topic or partition that does not exist (the
#: callers that meet "unknown partition" just after a broker restart keep
#: their own bounded retry with a fresh client), a broken client state.
#: Errors with which Kafka refuses the client's principal (authentication,
#: or an ACL it lacks: DESIGN.md "Trust boundary", ``ledger acl plan``).
REFUSAL_CODES = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
    }
)

NEVER_RETRIED = (
    FENCING_CODES
    | REFUSAL_CODES
    | frozenset(
        {
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_TOPIC,
            KafkaError._UNKNOWN_PARTITION,
            KafkaError._FATAL,
            KafkaError._STATE,
            KafkaError._INCONSISTENT,
        }
    )
)

#: Retriable even where librdkafka does not flag the error so: the broker is
#: down or restarting, a coordinator or leader is moving, a request timed out.
RETRIABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
        KafkaError._RETRY,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.CONCURRENT_TRANSACTIONS,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.FETCH_SESSION_ID_NOT_FOUND,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.THROTTLING_QUOTA_EXCEEDED,
    }
)


def classify(err: KafkaError) -> ErrorClass:
    """How a stage treats a Kafka error (librdkafka's order: fatal, abortable, retriable).

    Args:
        err: the error (``KafkaException.args[0]``, a message's or a callback's).

    Returns:
        ``"fatal"`` for an error librdkafka flags fatal or one of
        :data:`NEVER_RETRIED` (fenced, not authorised, unknown topic ...),
        unless it is abortable; ``"abortable"`` when the open transaction must
        be aborted (``txn_requires_abort``); ``"retriable"`` when librdkafka
        flags it retriable or its code is one of :data:`RETRIABLE_CODES`;
        ``"fatal"`` otherwise (the caller's own handling).
    """
    if err.fatal():
        return "fatal"
    if err.txn_requires_abort():
        return "abortable"
    if err.code() in NEVER_RETRIED:
        return "fatal"
    if err.retriable() or err.code() in RETRIABLE_CODES:
        return "retriable"
    return "fatal"


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The Kafka error an exception carries (directly, or as the cause of a ledger error)."""
    seen: BaseException | None = exc
    for _ in range(3):
        if seen is None:
            return None
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = seen.__cause__
    return None


#: Builds a consumer from its librdkafka settings (``confluent_kafka.Consumer``).
ConsumerMaker = Callable[[dict[str, Any]], Consumer]


def make_consumer(
    settings: LedgerSettings,
    group_id: str,
    *,
    isolation: Isolation = "read_committed",
    extra: Mapping[str, Any] | None = None,
    new_consumer: ConsumerMaker | None = None,
) -> Consumer:
    """A ledger consumer of ``group_id`` (:func:`consumer_config`): the one place one is made.

    Args:
        settings: ledger settings (bootstrap, security).
        group_id: its group (``ledger.acl`` grants each tool its own).
        isolation: ``read_committed`` (default) or ``read_uncommitted`` (a
            high-watermark probe).
        extra: librdkafka settings on top.
        new_consumer: the constructor (default ``confluent_kafka.Consumer``;
            tests pass a double).

    Raises:
        KafkaException: librdkafka refuses the settings.
        LedgerError: the settings name a file that cannot be read.
    """
    make = new_consumer or Consumer
    return make(consumer_config(settings, group_id, isolation=isolation, extra=extra))
