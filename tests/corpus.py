"""The bad-input corpus: cases as data (pure, no Kafka).

Each :class:`Case` says what it writes and what it expects; the integration
test ``tests/integration/test_bad_input_corpus.py`` writes them all into one
running ledger and checks each. Kinds:

* ``malformed`` -- bad bytes on every input topic of every stage, sealed with
  the key a real writer of that topic holds, so the case tests decoding, not
  authentication (a tombstone on a table topic is left unsealed: there the
  point is its authenticity);
* ``unsealed`` -- a well-formed record with no seal, on every input topic
  that requires one;
* ``odd-id`` -- intents whose operation ID is outside the grammar;
* ``odd-params`` -- intents with odd parameters;
* ``forged`` -- what :mod:`testbed.forge` makes, each aimed where it would
  matter;
* ``local-file`` -- corrupted local files read by a CLI command (in the test
  module, not here).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ledger.identity import MAX_INPUT_BYTES, MAX_KEY_BYTES
from ledger.serde import MARKER

#: Input topics of each stage; tables are the compacted topics a stage follows.
STAGE_INPUTS: dict[str, str] = {
    "intents": "processor",
    "admissions": "processor",
    "receipts": "processor",  # the relay's receipts table reads it too (it only logs)
    "readbacks": "processor",
    "claims": "processor",
    "dispositions": "processor",
    "compensation-tally": "processor",  # requests, verdicts and releases of the tally
    "admission-requests": "authority",
    "approvals": "authority",  # table
    "approval-uses": "authority",  # table
    "policy": "authority",  # table
    "dispatches": "relay",
}

#: Topics the authority kernel reads as tables (a TableFollower, not its consumer group).
TABLES = frozenset({"approvals", "approval-uses", "policy"})

#: The variants of malformed input written on every topic of :data:`STAGE_INPUTS`.
MALFORMED = (
    "empty",  # a zero-length value
    "random",  # 64 random bytes
    "truncated",  # the first half of a valid record
    "fingerprint",  # the ledger's marker with a schema fingerprint nobody has
    "wrong-type",  # a valid, correctly sealed record of another event type
    "value-over",  # a value over MAX_INPUT_BYTES
    "key-over",  # a valid record under a key over MAX_KEY_BYTES
    "no-key",  # a valid record under an empty key
    "tombstone",  # a null value
)


@dataclass(frozen=True)
class Case:
    """One bad input and what the ledger must do about it.

    Attributes:
        id: the case's name (the test ID).
        kind: ``malformed``, ``unsealed``, ``odd-id``, ``odd-params`` or ``forged``.
        topic: the topic written (short name).
        variant: what is written (one of :data:`MALFORMED`, an odd-ID or
            params name, a forged record kind).
        writes: in words.
        expect: the operating event's kind (``BAD_INPUT``, ``UNAUTHENTICATED``,
            ``ADMISSION_REFUSED``) or ``None`` when the input is acceptable
            and must simply complete (see ``outcome``).
        stage: the component that must write that event.
        match: ``position`` (the event names the record's topic, partition,
            offset) or ``operation`` (it names the case's operation: an
            event about a record the case's input led to).
        operation: the operation the case concerns, if any.
        outcome: the state that operation must be in at the end (``None``:
            not checked), with ``effects`` effects at its sink (and, when
            ``extra`` has ``reason``, a state reason that contains it).
        effects: see ``outcome``.
        sealed: ``writer`` (the seal a real writer of the topic makes) or ``none``.
        extra: case-specific parameters (``params`` for odd params, ``target``
            for forged records).
    """

    id: str
    kind: str
    topic: str
    variant: str
    writes: str
    expect: str | None
    stage: str
    match: str = "position"
    operation: str | None = None
    outcome: str | None = None
    effects: int | None = None
    sealed: str = "writer"
    extra: dict[str, object] = field(default_factory=dict)


def garbage(case_id: str, n: int = 64) -> bytes:
    """``n`` random bytes, the same for the same case (seeded by its ID)."""
    return random.Random(case_id).randbytes(n)


def unknown_fingerprint(case_id: str) -> bytes:
    """The ledger's marker, a schema fingerprint no schema has, then a body."""
    return MARKER + b"\xde\xad\xbe\xef\x00\x00\x00\x00" + garbage(case_id, 24)


def over_value() -> bytes:
    """A value over the input bound (the marker, then zeros): never decoded, never copied."""
    return MARKER + bytes(MAX_INPUT_BYTES + 1024)


def over_key(case_id: str) -> bytes:
    """A key over the key bound."""
    return (f"corpus:{case_id}:".encode() + b"k" * MAX_KEY_BYTES)[: MAX_KEY_BYTES + 100]


def malformed_cases() -> list[Case]:
    """Every :data:`MALFORMED` variant on every topic of :data:`STAGE_INPUTS`."""
    cases = []
    for topic, stage in STAGE_INPUTS.items():
        for variant in MALFORMED:
            expect = "BAD_INPUT"
            sealed = "writer"
            writes = f"{variant} on {topic}, sealed as its writer would"
            if variant == "tombstone" and topic in TABLES:
                # A tombstone on a table is a deletion; whether it counts is a
                # question of who wrote it: an outsider's is refused.
                expect, sealed = "UNAUTHENTICATED", "none"
                writes = f"an unsealed tombstone on {topic}"
            if topic == "intents":
                sealed = "none"  # services publish intents unsealed
                writes = f"{variant} on intents (unsealed, as services publish)"
            cases.append(
                Case(
                    id=f"malformed-{topic}-{variant}",
                    kind="malformed",
                    topic=topic,
                    variant=variant,
                    writes=writes,
                    expect=expect,
                    stage=stage,
                    sealed=sealed,
                )
            )
    return cases


def unsealed_cases() -> list[Case]:
    """A well-formed record without a seal on every input topic that needs one."""
    return [
        Case(
            id=f"unsealed-{topic}",
            kind="unsealed",
            topic=topic,
            variant="valid",
            writes=f"a well-formed {topic} record with no ledger-auth header",
            expect="UNAUTHENTICATED",
            stage=stage,
            sealed="none",
        )
        for topic, stage in STAGE_INPUTS.items()
        if topic != "intents"
    ]


#: Operation IDs outside the grammar (:func:`ledger.identity.operation_id_problem`).
ODD_IDS: dict[str, str] = {
    "non-ascii": "refund:café:v1",
    "newline": "refund:a\nb:v1",
    "nul": "refund:a\x00b:v1",
    "too-long": "refund:" + "x" * 300,
    "empty": "",
    "space": "refund:a b:v1",
    "tab": "refund:a\tb:v1",
    "bidi-override": "refund:\u202eab:v1",
}


def odd_id_cases() -> list[Case]:
    """An intent, well-formed but for its operation ID, written raw to ``intents``."""
    return [
        Case(
            id=f"odd-id-{name}",
            kind="odd-id",
            topic="intents",
            variant=name,
            writes=f"an intent whose operation ID is {op[:40]!r}",
            expect="BAD_INPUT",
            stage="processor",
            extra={"operation_id": op},
        )
        for name, op in ODD_IDS.items()
    ]


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"n": value}
    return value


def odd_params_cases() -> list[Case]:
    """Intents with odd parameters, each with its own approval (so each reaches the sink)."""
    base = {"account": "acct-1", "currency": "GBP", "amount_minor": 100}

    def case(
        name: str,
        writes: str,
        params: object,
        expect: str | None,
        stage: str,
        match: str,
        outcome: str | None,
        effects: int | None,
        **extra: object,
    ) -> Case:
        return Case(
            id=f"odd-params-{name}",
            kind="odd-params",
            topic="intents",
            variant=name,
            writes=writes,
            expect=expect,
            stage=stage,
            match=match,
            operation=f"corpus:params:{name}",
            outcome=outcome,
            effects=effects,
            sealed="none",
            extra={"params": params, **extra},
        )

    return [
        # The gateway refuses these (4xx): a definite rejection, terminal, with its reason.
        case(
            "integer-account",
            "an intent whose account is an integer",
            {**base, "account": 12345},
            None,
            "processor",
            "operation",
            "ABANDONED",
            0,
            reason="payments rejected the request",
        ),
        case(
            "deep-nesting",
            "an intent whose params nest 200 levels deep",
            {**base, "meta": _nested(200)},
            None,
            "processor",
            "operation",
            "ABANDONED",
            0,
            reason="payments rejected the request",
        ),
        case(
            "huge-number",
            "an intent with a 101-digit number in its params",
            {**base, "reference": 10**100},
            None,
            "processor",
            "operation",
            "OUTCOME_VERIFIED",
            1,
        ),
        case(
            "huge-amount",
            "an intent for 2**63-1 minor units (over its approval)",
            {**base, "amount_minor": 2**63 - 1},
            "ADMISSION_REFUSED",
            "authority",
            "operation",
            "NEEDS_REAUTHORISATION",
            0,
        ),
        case(
            "200kb-string",
            "an intent with a 200 KB string in its params",
            {**base, "memo": "x" * 200_000},
            None,
            "processor",
            "operation",
            "OUTCOME_VERIFIED",
            1,
        ),
        case(
            "not-json",
            "an intent whose params_json is not JSON",
            "{not json",
            "BAD_INPUT",
            "processor",
            "position",
            None,
            0,
        ),
        case(
            "json-array",
            "an intent whose params_json is a JSON array",
            "[1, 2, 3]",
            "BAD_INPUT",
            "processor",
            "position",
            None,
            0,
        ),
        case(
            "digest-mismatch",
            "an intent whose parameter digest is not that of its params",
            base,
            "BAD_INPUT",
            "processor",
            "position",
            None,
            0,
            digest="0" * 64,
        ),
    ]


def forged_cases() -> list[Case]:
    """Every record :func:`testbed.forge.forge` makes, each at the operation it would serve.

    Targets (built by the test): ``held`` is an operation held in
    UNKNOWN_OUTCOME at an unsafe sink; ``base`` a verified operation;
    ``unapproved`` an intent whose approval does not exist; ``consumed`` the
    approval ``base`` consumed, followed by a second intent on it
    (``corpus:second``); ``good`` the approval of a good intent published
    afterwards (``corpus:good:0``); ``policy`` the policy in force.
    """

    def case(
        name: str,
        record: str,
        topic: str,
        stage: str,
        target: str,
        writes: str,
        operation: str | None = None,
        outcome: str | None = None,
        effects: int | None = None,
    ) -> Case:
        return Case(
            id=f"forged-{name}",
            kind="forged",
            topic=topic,
            variant=record,
            writes=writes,
            expect="UNAUTHENTICATED",
            stage=stage,
            sealed="forged",
            operation=operation,
            outcome=outcome,
            effects=effects,
            extra={"target": target},
        )

    held, unapproved = "corpus:held", "corpus:unapproved"
    return [
        case(
            "readback-absent-held",
            "readback",
            "readbacks",
            "processor",
            "held",
            "a readback ABSENT for an operation held in UNKNOWN_OUTCOME (would re-dispatch)",
            held,
            "UNKNOWN_OUTCOME",
            1,
        ),
        case(
            "disposition-absent-held",
            "disposition",
            "dispositions",
            "processor",
            "held",
            "a disposition ABSENT by ops-oncall for the held operation",
            held,
            "UNKNOWN_OUTCOME",
            1,
        ),
        case(
            "tombstone-readbacks-held",
            "tombstone",
            "readbacks",
            "processor",
            "held",
            "a tombstone on the held operation's readbacks",
            held,
            "UNKNOWN_OUTCOME",
            1,
        ),
        case(
            "admission-unapproved",
            "admission",
            "admissions",
            "processor",
            "unapproved",
            "an admission for an intent whose approval does not exist",
            unapproved,
            "NEEDS_REAUTHORISATION",
            0,
        ),
        case(
            "dispatch-unapproved",
            "dispatch",
            "dispatches",
            "relay",
            "unapproved",
            "a dispatch EXECUTE for the unapproved intent",
            unapproved,
            "NEEDS_REAUTHORISATION",
            0,
        ),
        case(
            "dispatch-verified",
            "dispatch",
            "dispatches",
            "relay",
            "base",
            "a second dispatch EXECUTE for a verified operation",
            "corpus:base:2",
            "OUTCOME_VERIFIED",
            1,
        ),
        case(
            "tombstone-dispatches",
            "tombstone",
            "dispatches",
            "relay",
            "base",
            "a tombstone on a verified operation's dispatch",
            "corpus:base:3",
            "OUTCOME_VERIFIED",
            1,
        ),
        case(
            "use-consumed-approval",
            "approval_use",
            "approval-uses",
            "authority",
            "consumed",
            "a use of a consumed approval naming a second operation (corpus:second)",
            "corpus:second",
            "NEEDS_REAUTHORISATION",
            0,
        ),
        case(
            "tombstone-approval-uses",
            "tombstone",
            "approval-uses",
            "authority",
            "consumed",
            "a tombstone erasing the use of a consumed approval",
            "corpus:second",
            "NEEDS_REAUTHORISATION",
            0,
        ),
        case(
            "revocation-live",
            "revocation",
            "approvals",
            "authority",
            "good",
            "a revocation of the approval a good intent will use",
            "corpus:good:0",
            "OUTCOME_VERIFIED",
            1,
        ),
        case(
            "tombstone-approvals",
            "tombstone",
            "approvals",
            "authority",
            "good",
            "a tombstone erasing the approval a good intent will use",
            "corpus:good:1",
            "OUTCOME_VERIFIED",
            1,
        ),
        case(
            "policy-next-version",
            "policy",
            "policy",
            "authority",
            "policy",
            "a policy change to the next version (every approval would go stale)",
            "corpus:good:2",
            "OUTCOME_VERIFIED",
            1,
        ),
        case(
            "tombstone-policy",
            "tombstone",
            "policy",
            "authority",
            "policy",
            "a tombstone on the policy in force",
            "corpus:good:3",
            "OUTCOME_VERIFIED",
            1,
        ),
        case(
            "state-verified",
            "state",
            "state",
            "processor",
            "base",
            "an in-flight state for a verified operation (read by a restarted processor)",
            "corpus:base:2",
            "OUTCOME_VERIFIED",
            1,
        ),
        case(
            "tombstone-state",
            "tombstone",
            "state",
            "processor",
            "base",
            "a tombstone on a verified operation's state (read by a restarted processor)",
            "corpus:base:3",
            "OUTCOME_VERIFIED",
            1,
        ),
    ]


def kafka_cases() -> list[Case]:
    """Every case written to the running ledger."""
    return (
        malformed_cases() + unsealed_cases() + odd_id_cases() + odd_params_cases() + forged_cases()
    )
