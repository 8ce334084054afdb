"""Stable operation IDs and parameter digests.

An operation ID is chosen before the first attempt from deterministic case
state (``refund:{case_id}:v{decision_version}``), never from regenerated text.
It is bound to a digest of the operation's semantic parameters; reuse of the
ID with another digest is parameter drift (compare AWS's
``IdempotentParameterMismatch`` and Stripe's idempotency-key parameter check).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from json.encoder import encode_basestring
from typing import Any

from ledger.errors import InputBoundsError, InvalidInputError

#: Longest operation ID (characters); with the grammar below it fits every
#: sink protocol: an HTTP path segment, a header value, a file name.
OPERATION_ID_MAX_LEN = 200

#: Largest input record (bytes of the encoded value) a stage accepts. The
#: processor journals an input's bytes together with the state it derives, and
#: a state carries the intent's parameters again, so every output stays well
#: under the producer's 1,000,000-byte ``message.max.bytes``. A larger record
#: is dead-lettered by hash, size and position, never copied.
MAX_INPUT_BYTES = 256 * 1024

#: Largest record key (bytes) a stage copies into a dead letter; a longer key
#: is replaced by its SHA-256.
MAX_KEY_BYTES = 1024


#: The grammar of :func:`operation_id_problem` in one expression (the quick
#: yes; the function walks the ID only to say what is wrong).
_OPERATION_ID = re.compile(f"[!-~]{{1,{OPERATION_ID_MAX_LEN}}}")


def operation_id_problem(operation_id: str) -> str | None:
    """Why an operation ID is outside the grammar, or ``None`` when it is inside.

    The grammar: 1 to :data:`OPERATION_ID_MAX_LEN` characters of printable
    ASCII other than space (``!`` to ``~``, 0x21-0x7E). Such an ID can be
    carried by every sink protocol as it is: no control characters (a
    newline breaks an HTTP route), no non-ASCII (an HTTP header cannot carry
    it), no bidirectional overrides that make an ID read as another.

    Args:
        operation_id: the candidate ID.

    Returns:
        ``None``, or a reason naming the first offending character and its position.
    """
    if _OPERATION_ID.fullmatch(operation_id):
        return None
    if not operation_id:
        return "the operation ID is empty"
    if len(operation_id) > OPERATION_ID_MAX_LEN:
        return (
            f"the operation ID has {len(operation_id)} characters; at most "
            f"{OPERATION_ID_MAX_LEN} are allowed"
        )
    for position, char in enumerate(operation_id):
        if not "!" <= char <= "~":
            return (
                f"the operation ID has {char!r} (U+{ord(char):04X}) at position {position}; "
                "only printable ASCII without spaces (! to ~) is allowed"
            )
    return None


def check_operation_id(operation_id: str) -> str:
    """Return ``operation_id`` if it follows the grammar of :func:`operation_id_problem`.

    Raises:
        InputBoundsError: naming the problem and the remedy.
    """
    problem = operation_id_problem(operation_id)
    if problem is not None:
        raise InputBoundsError(
            f"{problem}; choose an ID like refund:1842:v3",
            operation_id=operation_id,
            expected="printable ASCII without spaces, 1 to 200 characters",
            observed=operation_id,
        )
    return operation_id


def canonical_json(value: Any, *, checked: bool = False) -> str:
    """Canonical JSON: sorted keys, no insignificant white space, UTF-8 text.

    Only JSON types are accepted (dict with str keys, list, str, int, bool,
    None, finite float); floats that are whole numbers stay floats, so ``1``
    and ``1.0`` differ, as they do to most payment APIs.

    Args:
        value: the value to encode.
        checked: the caller guarantees ``value`` holds only JSON types with
            string keys (it came from ``json.loads``), so the walk that checks
            it is skipped.

    Raises:
        LedgerError: for non-JSON values (sets, bytes, NaN, non-str keys).
    """
    if not checked:
        _check_json(value)
    return _CANONICAL.encode(value)


#: The encoder of :func:`canonical_json`, built once (``json.dumps`` with these
#: arguments builds a new one per call; the output is the same).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _check_json(value: Any) -> None:
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError("parameters must be finite numbers", observed=value)
        return
    if isinstance(value, list | tuple):
        for item in value:
            _check_json(item)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInputError("parameter keys must be strings", observed=key)
            _check_json(item)
        return
    raise InvalidInputError(
        f"parameters must be JSON values, not {type(value).__name__}", observed=repr(value)
    )


#: Version of the parameter digest that new intents carry. Version 2 binds
#: the sink as well; its digests are written ``v2:`` followed by 64 hex
#: characters. Version 1 (64 hex characters, no prefix) is what intents
#: published before the sink was bound carry; it stays valid for records
#: already in a ledger (the fold recomputes an intent's digest in the
#: version the digest names, see :func:`digest_version`).
DIGEST_VERSION = 2

#: Prefix of a version-2 digest.
_V2_PREFIX = "v2:"


def digest_version(digest: str) -> int:
    """The version a parameter digest was computed in, read from its text.

    Args:
        digest: a digest as carried by an intent, a state or a dispatch.

    Returns:
        2 for ``v2:<64 hex>``, else 1 (the unprefixed form of earlier
        releases; a malformed digest is reported as 1 and then fails to
        match its recomputation).
    """
    return 2 if digest.startswith(_V2_PREFIX) else 1


def parameter_digest(
    *,
    action: str,
    params: Mapping[str, Any],
    subject: str,
    purpose: str,
    decision_version: int,
    sink: str,
    version: int = DIGEST_VERSION,
    params_checked: bool = False,
) -> str:
    """SHA-256 (hex) of the canonical encoding of an operation's semantics.

    The digest binds sink, action, parameters, subject, purpose and decision
    version; the operation ID itself and the approval are deliberately not
    part of it (a new approval for the same operation is reauthorisation,
    not drift). Re-publishing an operation for another sink therefore
    changes its digest: parameter drift.

    Version 1 (``version=1``) is the digest of earlier releases, which did
    not bind the sink (``sink`` is then ignored); compute it only to check a
    record that carries a version-1 digest.

    Args:
        action: action name.
        params: semantic parameters (JSON values).
        subject: represented subject.
        purpose: declared purpose.
        decision_version: version of the business decision.
        sink: the sink's registered name (bound from version 2).
        version: the digest version (:data:`DIGEST_VERSION` for new records).
        params_checked: ``params`` came from ``json.loads`` (JSON types and
            string keys only; see :func:`canonical_json`).

    Returns:
        ``v2:`` and 64 lowercase hex characters for version 2; 64 lowercase
        hex characters for version 1.

    Raises:
        LedgerError: parameters that are not JSON values, or an unknown version.
        ValueError: non-finite numbers in parameters passed as checked.
    """
    if version not in (1, 2):
        raise InvalidInputError(f"unknown parameter digest version {version}", observed=version)
    texts = (action, purpose, subject, sink) if version == 2 else (action, purpose, subject)
    if all(type(t) is str for t in texts):
        # The canonical JSON of {action, decision_version, params, purpose,
        # [sink,] subject} written out in its sorted key order: the same
        # text as canonical_json of that object (a test compares them), with
        # only the parameters going through the encoder.
        quoted = encode_basestring
        body = "".join(
            (
                '{"action":',
                quoted(action),
                ',"decision_version":',
                int.__repr__(int(decision_version)),
                ',"params":',
                canonical_json(dict(params), checked=params_checked),
                ',"purpose":',
                quoted(purpose),
                *((',"sink":', quoted(sink)) if version == 2 else ()),
                ',"subject":',
                quoted(subject),
                "}",
            )
        )
    else:
        fields: dict[str, Any] = {
            "action": action,
            "decision_version": int(decision_version),
            "params": dict(params),
            "purpose": purpose,
            "subject": subject,
        }
        if version == 2:
            fields["sink"] = sink
        body = canonical_json(fields, checked=params_checked)
    hexdigest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return _V2_PREFIX + hexdigest if version == 2 else hexdigest


def operation_id(kind: str, case_id: str, decision_version: int) -> str:
    """Build a stable operation ID ``{kind}:{case_id}:v{decision_version}``.

    Raises:
        LedgerError: if a part is empty or contains ``:`` (which would make
            two different triples collide).
    """
    for part in (kind, case_id):
        if not part or ":" in part:
            raise InvalidInputError(
                "operation ID parts must be non-empty and contain no ':'", observed=part
            )
    return f"{kind}:{case_id}:v{int(decision_version)}"


def amount_of(params: Mapping[str, Any]) -> int:
    """The amount (minor units) in an operation's parameters; 0 when absent.

    Raises:
        InputBoundsError: if ``amount_minor`` is present but not a non-negative int.
    """
    amount = params.get("amount_minor", 0)
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        # The text is journaled in refusals: replay compares it, so it stays.
        raise InputBoundsError("amount_minor must be a non-negative integer", observed=amount)
    return amount
