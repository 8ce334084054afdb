"""Authenticated records: a seal in a record header, checked by every reader.

DESIGN.md "Trust boundary": a record is believed because it is authentic,
not because of the topic it was found on. Every record a ledger component
writes carries one Kafka record header, ``ledger-auth``, whose value is::

    <scheme>;<key ID>;<base64 tag>

over the bytes of :func:`sealed_message` -- the ledger's identity
(``LEDGER_ID``, by default the topic prefix), the topic's short name, the
record key and the value (or the absence of one: a tombstone is sealed too),
each length-prefixed, so a seal cannot be moved to another ledger, topic,
key or value. Two schemes:

* ``ed25519`` (RFC 8032, via ``cryptography``): a signature by a key whose
  public half is trusted under a *role*. Each stage role signs with its own
  key: ``processor`` (dispatches, states, journal entries, recovery
  receipts ...), ``relay`` (receipts, readbacks), ``reconciler``
  (readbacks), ``resumer`` (claims, ``ledger claim``), ``authority``
  (admission decisions and approval uses, by the authority kernel) and
  ``outcome`` (the outcomes the processor publishes for services); people
  sign as ``reviewer`` (review grants and revocations) or ``operator``
  (policy changes, dispositions, revocations). Signatures, not a shared
  MAC: a reader of a role's records holds only its public half, so a
  compromised relay host can verify the processor's records but not forge
  them (issue 29, per-role keys).
* ``hmac-sha256`` (RFC 2104 HMAC with SHA-256): the *legacy* deployment key
  that every stage shared in earlier releases (role ``stage``). It is kept
  as a verifier only, for records written before the cut-over; see
  "Retired keys" below.

Retired keys. A key (a rotated role key, or the legacy deployment key) has a
*not-after* time, ``not_after_ms`` in ledger time (Unix milliseconds); a
record it seals is believed only if it was appended at or before that time.
"When" is the record's Kafka timestamp, and only where the broker set it:
every topic a stage role seals is created with
``message.timestamp.type=LogAppendTime`` (:func:`ledger.topics.topic_config`),
so a holder of a retired key cannot backdate a forgery (a producer's own
``CreateTime`` is overwritten by the broker at append). A record whose
timestamp is ``CreateTime`` was appended before its topic was switched to
broker time, which is the cut-over of the release that brought per-role keys
and so earlier than any retirement; it is believed. A record with no
timestamp (a reader that does not pass one) is not believed under a retired
key: a reader that cannot tell when fails closed.

Which roles may write a topic is part of the topic layout
(:attr:`ledger.topology.TopicSpec.auth`). A review grant is the exception:
it carries its reviewer's signature over all its fields in the record
itself (:mod:`ledger.signing`), which is what authenticates it. Records that
name their writer (a revocation's ``revoked_by``, a policy change's
``set_by``, a disposition's ``by``) must be signed by the key of that name:
a trusted operator cannot sign in another's name.

A reader tells two kinds of refusal apart (:func:`unverifiable`): a record
whose seal names a key the reader does not hold *cannot be verified* -- it
may be authentic evidence made with a key this host lost or never had --
and a reader must never read it as absent (the authority kernel holds what
it covers, the auditor reports it); a record that is misplaced, unsealed,
sealed for another topic, role or ledger, or whose tag does not match a key
the reader holds is *not authentic* and is refused as if it were not there.

This module is pure (no files, no clock): keys are loaded by
:mod:`ledger.credentials`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ledger.events import Approval, Disposition, Event, PolicyChange
from ledger.signing import GRANT_UNKNOWN_KEY
from ledger.signing import verify as verify_grant
from ledger.topology import MISPLACED, TOPIC_BY_NAME, Topic, misplaced

#: A record's headers as the Kafka client gives them (a list of pairs, or a mapping).
Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None

#: Name of the record header that carries a record's seal.
AUTH_HEADER = "ledger-auth"

#: Roles a key can be trusted under.
#: The legacy deployment MAC every stage shared before per-role keys (verifier only).
ROLE_STAGE = "stage"
ROLE_AUTHORITY = "authority"
ROLE_OPERATOR = "operator"
ROLE_REVIEWER = "reviewer"
#: The processor's outcome key: it signs ``outcomes`` records, which services
#: verify with its public half (they hold no secret).
ROLE_OUTCOME = "outcome"
#: The stage roles that sign with a key of their own (``{role}.key``, :mod:`ledger.rolekeys`).
ROLE_PROCESSOR = "processor"
ROLE_RELAY = "relay"
ROLE_RECONCILER = "reconciler"
ROLE_RESUMER = "resumer"
STAGE_KEY_ROLES = (ROLE_PROCESSOR, ROLE_RELAY, ROLE_RECONCILER, ROLE_RESUMER)
ROLES = (
    ROLE_STAGE,
    ROLE_AUTHORITY,
    ROLE_OPERATOR,
    ROLE_REVIEWER,
    ROLE_OUTCOME,
    *STAGE_KEY_ROLES,
)

#: Kafka timestamp types, as a consumed record's ``timestamp()`` gives them
#: (librdkafka's values; this module imports no Kafka client).
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

#: A record's ``(timestamp type, milliseconds)`` as consumed.
Timestamp = tuple[int, int] | None

SCHEME_MAC = "hmac-sha256"
SCHEME_ED25519 = "ed25519"

#: Domain separation: the first field of every sealed message. Version 2
#: added the ledger identity (records sealed as ``ledger-record/v1`` name no
#: ledger and are not accepted).
_DOMAIN = b"ledger-record/v2"
_LENGTH = struct.Struct(">I").pack
_DOMAIN_FIELD = _LENGTH(len(_DOMAIN)) + _DOMAIN
_TOMBSTONE_FIELD = _LENGTH(1) + b"\x00"

#: The ledger identity of a keyring or key made without one (unit tests and
#: the default deployment, whose topic prefix is ``ledger``).
DEFAULT_LEDGER_ID = "ledger"

#: How :meth:`Keyring.check` starts the reason for a seal that names a key
#: the reader does not hold: see :func:`unverifiable`.
UNKNOWN_KEY = "sealed by unknown key"

#: Key IDs of the authority kernel's signing keys start with this
#: (``authority-kernel-`` and 12 hex digits of the public key's SHA-256).
AUTHORITY_KEY_PREFIX = "authority-kernel"


def authority_key_id(public_raw: bytes) -> str:
    """The key ID of an authority kernel's key: its public key's fingerprint.

    A kernel key made anew (lost keys, a hand-made key) has another ID, so a
    record signed by the old one names a key nobody holds -- *unverifiable*,
    never mistaken for a forgery and dropped (:func:`unverifiable`).

    Args:
        public_raw: the 32 raw bytes of the Ed25519 public key.

    Returns:
        ``authority-kernel-`` followed by 12 hex digits.
    """
    return f"{AUTHORITY_KEY_PREFIX}-{hashlib.sha256(public_raw).hexdigest()[:12]}"


#: Key IDs of the processor's outcome keys start with this (then 12 hex digits
#: of the public key's SHA-256, as :func:`authority_key_id`).
OUTCOME_KEY_PREFIX = "outcome"


def outcome_key_id(public_raw: bytes) -> str:
    """The key ID of the processor's outcome key: ``outcome-`` and its fingerprint.

    Args:
        public_raw: the 32 raw bytes of the Ed25519 public key.

    Returns:
        ``outcome-`` followed by 12 hex digits.
    """
    return f"{OUTCOME_KEY_PREFIX}-{hashlib.sha256(public_raw).hexdigest()[:12]}"


def role_key_id(role: str, public_raw: bytes) -> str:
    """The key ID of a stage role's key: the role and the public key's fingerprint.

    Args:
        role: one of :data:`STAGE_KEY_ROLES`.
        public_raw: the 32 raw bytes of the Ed25519 public key.

    Returns:
        ``{role}-`` followed by 12 hex digits of the public key's SHA-256.
    """
    return f"{role}-{hashlib.sha256(public_raw).hexdigest()[:12]}"


def appended_by(not_after_ms: int | None, timestamp: Timestamp) -> str | None:
    """Why a record sealed by a key retired at ``not_after_ms`` is not believed, or ``None``.

    Args:
        not_after_ms: the key's not-after time (ledger time, Unix ms);
            ``None`` for a key in service.
        timestamp: the record's ``(type, ms)`` as consumed, or ``None``.

    Returns:
        ``None`` when the key is in service, the timestamp is ``CreateTime``
        (appended before the topic kept broker time: before any retirement,
        module docstring), or the broker appended it at or before
        ``not_after_ms``; else the reason.
    """
    if not_after_ms is None:
        return None
    if timestamp is None or timestamp[0] not in (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME):
        return f"{RETIRED_KEY}: its not-after is {not_after_ms} ms and the record has no timestamp"
    kind, at_ms = timestamp
    if kind == TIMESTAMP_CREATE_TIME or at_ms <= not_after_ms:
        return None
    return (
        f"{RETIRED_KEY}: appended at {at_ms} ms (broker time), after the key's "
        f"not-after {not_after_ms} ms"
    )


#: How the reason for a record sealed by a key after its not-after time begins.
RETIRED_KEY = "sealed by a retired key"


def unverifiable(problem: str | None) -> bool:
    """Whether a refusal means "cannot be verified here" rather than "not authentic".

    Args:
        problem: what :meth:`Keyring.check` returned.

    Returns:
        True when the record's seal (or a grant's signature) names a key
        this reader does not hold: the record may be authentic evidence made
        with a key this host lost or never had, so it must not be read as
        absent (DESIGN.md "Trust boundary"; issue: lost keys fail open).
    """
    return problem is not None and problem.startswith((UNKNOWN_KEY, GRANT_UNKNOWN_KEY))


def sealed_message(
    topic: str, key: bytes, value: bytes | None, ledger_id: str = DEFAULT_LEDGER_ID
) -> bytes:
    """The bytes a seal covers.

    Args:
        topic: the topic's short name (``dispatches``), not the prefixed one.
        key: the record key as written.
        value: the record value, or ``None`` for a tombstone.
        ledger_id: the ledger's identity (``LEDGER_ID``, by default its
            topic prefix): a record sealed for one ledger does not verify in
            another, even where both hold the same keys.

    Returns:
        ``domain | ledger | topic | key | value``, each preceded by its
        length (4 bytes, big-endian); a tombstone's value field is the single
        byte 0, a value's is 1 followed by the value, so the two cannot
        collide.
    """
    name = topic.encode("utf-8")
    ledger = ledger_id.encode("utf-8")
    head = (
        _DOMAIN_FIELD,
        _LENGTH(len(ledger)),
        ledger,
        _LENGTH(len(name)),
        name,
        _LENGTH(len(key)),
        key,
    )
    if value is None:
        return b"".join((*head, _TOMBSTONE_FIELD))
    return b"".join((*head, _LENGTH(len(value) + 1), b"\x01", value))


@dataclass(frozen=True)
class Seal:
    """A parsed ``ledger-auth`` header.

    Attributes:
        scheme: ``hmac-sha256`` or ``ed25519``.
        key_id: the key it claims to be made with.
        tag: the MAC or signature bytes.
    """

    scheme: str
    key_id: str
    tag: bytes

    def encode(self) -> bytes:
        """The header value: ``scheme;key_id;base64(tag)`` (ASCII)."""
        return f"{self.scheme};{self.key_id};{base64.b64encode(self.tag).decode()}".encode()

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Seal:
        """Parse a header value.

        Raises:
            ValueError: not of the form ``scheme;key_id;base64``.
        """
        if raw is None:
            raise ValueError("the header is empty")
        text = raw.decode("ascii") if isinstance(raw, bytes) else raw
        scheme, key_id, tag = text.split(";")
        if scheme not in (SCHEME_MAC, SCHEME_ED25519) or not key_id:
            raise ValueError(f"unknown scheme {scheme!r}")
        return cls(scheme, key_id, base64.b64decode(tag, validate=True))


@dataclass(frozen=True)
class MacKey:
    """The stages' shared deployment key of earlier releases (HMAC-SHA256; a verifier now).

    Attributes:
        secret: 32 random bytes.
        role: always ``stage``.
        ledger_id: the ledger its seals are made for.
    """

    secret: bytes
    role: str = ROLE_STAGE
    ledger_id: str = DEFAULT_LEDGER_ID

    @cached_property
    def key_id(self) -> str:
        """``deployment-`` and the first 12 hex digits of the secret's SHA-256."""
        return "deployment-" + hashlib.sha256(self.secret).hexdigest()[:12]

    @cached_property
    def _prefix(self) -> bytes:
        return f"{SCHEME_MAC};{self.key_id};".encode()

    def seal(self, topic: str, key: bytes, value: bytes | None) -> bytes:
        """The ``ledger-auth`` header value for one record (as :meth:`Seal.encode` gives it)."""
        tag = hmac.digest(self.secret, sealed_message(topic, key, value, self.ledger_id), "sha256")
        return self._prefix + binascii.b2a_base64(tag, newline=False)


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key trusted under a role and a name.

    Attributes:
        key_id: the name (a reviewer's or operator's name, or the kernel's ID).
        private: the private key.
        role: ``reviewer``, ``operator`` or ``authority``.
        ledger_id: the ledger its seals are made for.
    """

    key_id: str
    private: Ed25519PrivateKey
    role: str
    ledger_id: str = DEFAULT_LEDGER_ID

    def public_b64(self) -> str:
        """The raw public key, base64."""
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def seal(self, topic: str, key: bytes, value: bytes | None) -> bytes:
        """The ``ledger-auth`` header value for one record."""
        tag = self.private.sign(sealed_message(topic, key, value, self.ledger_id))
        return Seal(SCHEME_ED25519, self.key_id, tag).encode()


Sealer = MacKey | SigningKey


@dataclass(frozen=True)
class TrustedKey:
    """A public key, the role it is trusted under, and when it retires.

    Attributes:
        role: the role (:data:`ROLES`).
        public: the Ed25519 public key.
        not_after_ms: ledger time (Unix ms) after which records it seals are
            not believed (a rotated key, :mod:`ledger.rolekeys`); ``None``
            while it is in service.
    """

    role: str
    public: Ed25519PublicKey
    not_after_ms: int | None = None


def claimed_writer(event: Event | None) -> tuple[str, tuple[str, ...]] | None:
    """The writer a record names, and the roles that name may sign under.

    Returns:
        ``(name, roles)`` for records that name who wrote them: a grant its
        ``key_id`` (reviewer), a revocation its ``revoked_by`` (reviewer or
        operator), a policy change its ``set_by`` and a disposition its ``by``
        (operator); ``None`` for any other record.
    """
    if isinstance(event, Approval):
        if event.status == "REVOKED":
            return (event.revoked_by or "", (ROLE_REVIEWER, ROLE_OPERATOR))
        return (event.key_id or event.reviewer, (ROLE_REVIEWER,))
    if isinstance(event, PolicyChange):
        return (event.set_by, (ROLE_OPERATOR,))
    if isinstance(event, Disposition):
        return (event.by, (ROLE_OPERATOR,))
    return None


def header_value(headers: Headers) -> bytes | None:
    """The ``ledger-auth`` header's value in a record's headers (the last one wins)."""
    found: bytes | None = None
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name == AUTH_HEADER:
            found = value.encode() if isinstance(value, str) else value
    return found


@dataclass
class Keyring:
    """The keys a reader checks seals against.

    Attributes:
        macs: legacy deployment keys by key ID (verifiers of records sealed
            before the cut-over to per-role keys).
        mac_not_after: the not-after time (Unix ms) of each legacy key that
            has one (:func:`appended_by`).
        trusted: public keys by key ID, each with its role and not-after time.
        reload: called to read the key files again when a seal names an
            unknown key, so a reviewer or operator added while a stage runs
            is trusted without a restart; returns the fresh keyring, or
            ``None`` to keep the current one (the loader limits how often it
            reads, :func:`ledger.credentials.load_keyring`).
        partitions: the operation-keyed topics' partition count
            (``LEDGER_PARTITIONS``): a record read from a partition its key
            does not name is refused (:func:`ledger.topology.misplaced`);
            0 checks no placement.
        ledger_id: the ledger this reader belongs to: a seal or grant made
            for another ledger does not verify.
    """

    macs: dict[str, bytes] = field(default_factory=dict)
    mac_not_after: dict[str, int] = field(default_factory=dict)
    trusted: dict[str, TrustedKey] = field(default_factory=dict)
    reload: Callable[[], Keyring | None] | None = None
    unsigned_grants_ok: bool = False
    partitions: int = 0
    ledger_id: str = DEFAULT_LEDGER_ID

    def add_mac(self, key: MacKey, not_after_ms: int | None = None) -> None:
        """Accept seals of the legacy key ``key`` (appended by ``not_after_ms``, if given)."""
        self.macs[key.key_id] = key.secret
        if not_after_ms is None:
            self.mac_not_after.pop(key.key_id, None)
        else:
            self.mac_not_after[key.key_id] = not_after_ms

    def add_public(
        self, key_id: str, role: str, public: Ed25519PublicKey, not_after_ms: int | None = None
    ) -> None:
        """Trust ``public`` under ``role`` as ``key_id`` (until ``not_after_ms``, if given)."""
        self.trusted[key_id] = TrustedKey(role, public, not_after_ms)

    def _refresh(self) -> bool:
        if self.reload is None:
            return False
        fresh = self.reload()
        if fresh is None:
            return False
        self.macs, self.mac_not_after, self.trusted = fresh.macs, fresh.mac_not_after, fresh.trusted
        return True

    def check(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        headers: Headers,
        event: Event | None = None,
        partition: int | None = None,
        timestamp: Timestamp = None,
    ) -> str | None:
        """Why a record is not authentic, or ``None`` when it is.

        Args:
            topic: short topic name; its writer roles come from
                :data:`ledger.topology.TOPIC_BY_NAME` (a topic with no roles,
                ``intents``, is not checked).
            key: record key bytes.
            value: value bytes (``None``: a tombstone).
            headers: the record's headers as consumed.
            event: the decoded value, when there is one: a record that names
                its writer must be signed by that writer's key.
            partition: the partition it was read from: with
                :attr:`partitions` set, a record found on a partition its key
                does not name is refused whatever its seal (the seal does not
                cover the partition), on every topic, ``intents`` included.
            timestamp: the record's ``(type, ms)`` as consumed
                (``msg.timestamp()``): a record sealed by a retired key is
                believed only if the broker appended it by the key's
                not-after time (:func:`appended_by`).

        Returns:
            ``None`` or a reason such as ``no ledger-auth header``,
            ``sealed by unknown key K``, ``key K is trusted as relay; this
            topic is written by processor``, ``sealed by a retired key: ...``
            or ``the seal does not match the record``.
        """
        if self.partitions and partition is not None:
            where = misplaced(topic, key, partition, self.partitions)
            if where is not None:
                return where
        spec = TOPIC_BY_NAME.get(topic)
        accept = spec.auth if spec is not None else (ROLE_STAGE,)
        if not accept:
            return None
        if topic == Topic.APPROVALS and isinstance(event, Approval) and event.status == "GRANTED":
            return self._check_grant(event)
        raw = header_value(headers)
        if raw is None:
            return f"no {AUTH_HEADER} header"
        try:
            seal = Seal.parse(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return f"malformed {AUTH_HEADER} header ({exc})"
        message = sealed_message(topic, key, value, self.ledger_id)
        problem = self._verify(seal, message, accept, timestamp)
        if unverifiable(problem) and self._refresh():
            problem = self._verify(seal, message, accept, timestamp)
        if problem is not None:
            return problem
        named = claimed_writer(event)
        if named is not None:
            name, roles = named
            role = self.trusted[seal.key_id].role if seal.key_id in self.trusted else ROLE_STAGE
            if seal.key_id != name or role not in roles:
                return (
                    f"the record names {name!r} as its writer but is signed by "
                    f"{seal.key_id!r} ({role})"
                )
        return None

    @staticmethod
    def refuses(problem: str | None, require_authenticated: bool) -> bool:
        """Whether a reader refuses a record :meth:`check` found ``problem`` with.

        Args:
            problem: what :meth:`check` returned.
            require_authenticated: ``LEDGER_REQUIRE_AUTHENTICATED_RECORDS``.

        Returns:
            True for any problem while authentication is required; with it
            off, still True for a misplaced record (placement is ownership,
            not a seal: no setting lets a stage decide about another's key).
        """
        if problem is None:
            return False
        return require_authenticated or problem.startswith(MISPLACED)

    def _check_grant(self, grant: Approval) -> str | None:
        """A review grant is authenticated by its own signature (:mod:`ledger.signing`).

        The signature covers every field of the grant, so the record needs
        no seal besides it; revocations and every other status do.
        """
        if grant.signature is None and self.unsigned_grants_ok:
            return None
        problem: str | None = None
        for attempt in (0, 1):
            reviewers = {k: t.public for k, t in self.trusted.items() if t.role == ROLE_REVIEWER}
            problem = verify_grant(grant, reviewers, self.ledger_id)
            if not unverifiable(problem) or attempt or not self._refresh():
                return problem
        return problem

    def _verify(
        self, seal: Seal, message: bytes, accept: tuple[str, ...], timestamp: Timestamp
    ) -> str | None:
        if seal.scheme == SCHEME_MAC:
            secret = self.macs.get(seal.key_id)
            if secret is None:
                return f"{UNKNOWN_KEY} {seal.key_id}"
            if not legacy_accepted(accept):
                return (
                    "sealed by a stage key (the legacy deployment key); this topic is "
                    "written by "
                    f"{', '.join(accept)}"
                )
            expected = hmac.digest(secret, message, "sha256")
            if not hmac.compare_digest(expected, seal.tag):
                return "the seal does not match the record (forged or altered)"
            return appended_by(self.mac_not_after.get(seal.key_id), timestamp)
        trusted = self.trusted.get(seal.key_id)
        if trusted is None:
            return f"{UNKNOWN_KEY} {seal.key_id}"
        if trusted.role not in accept:
            return (
                f"key {seal.key_id} is trusted as {trusted.role}; "
                f"this topic is written by {', '.join(accept)}"
            )
        try:
            trusted.public.verify(seal.tag, message)
        except InvalidSignature:
            return "the seal does not match the record (forged or altered)"
        return appended_by(trusted.not_after_ms, timestamp)

    def writer(self, headers: Headers) -> tuple[str, str] | None:
        """``(key ID, role)`` a record's seal names, without checking it (for reports)."""
        raw = header_value(headers)
        try:
            seal = Seal.parse(raw)
        except (ValueError, UnicodeDecodeError):
            return None
        if seal.scheme == SCHEME_MAC:
            return (seal.key_id, ROLE_STAGE)
        trusted = self.trusted.get(seal.key_id)
        return (seal.key_id, trusted.role if trusted else "unknown")


def legacy_accepted(accept: tuple[str, ...]) -> bool:
    """Whether the legacy deployment key sealed this topic's records in earlier releases.

    Args:
        accept: the topic's writer key roles (:attr:`ledger.topology.TopicSpec.auth`).

    Returns:
        True for topics a stage role writes (every stage shared the key
        then), and for topics that still name the legacy role.
    """
    return ROLE_STAGE in accept or any(role in STAGE_KEY_ROLES for role in accept)


def seal_headers(
    sealer: Sealer | None, topic: str, key: bytes, value: bytes | None
) -> list[tuple[str, str | bytes | None]] | None:
    """The headers that carry a record's seal (``None`` when there is no sealer)."""
    if sealer is None:
        return None
    return [(AUTH_HEADER, sealer.seal(topic, key, value))]


def keyring_of(
    macs: Iterable[MacKey] = (),
    signers: Iterable[SigningKey] = (),
    ledger_id: str = DEFAULT_LEDGER_ID,
) -> Keyring:
    """A keyring trusting the given keys (tests and single-process tools)."""
    ring = Keyring(ledger_id=ledger_id)
    for mac in macs:
        ring.add_mac(mac)
    for signer in signers:
        ring.add_public(signer.key_id, signer.role, signer.private.public_key())
    return ring
