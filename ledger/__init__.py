"""Event-sourced recovery ledger on Apache Kafka: the core.

Public names of the pure core are re-exported here: the events, the state
machine, the fold, the authority decision, identity and settings.
"""

from ledger.authority import evaluate as evaluate_admission
from ledger.config import LedgerSettings
from ledger.errors import (
    DecodeError,
    ForbiddenTransitionError,
    LedgerError,
    ParameterDriftError,
    SchemaValidationError,
    TopicConfigError,
    UnknownSchemaError,
)
from ledger.events import (
    AdmissionDecision,
    AdmissionRequest,
    Approval,
    Claim,
    Dispatch,
    Disposition,
    EffectReceipt,
    Intent,
    JournalEntry,
    OperatingEvent,
    OperationState,
    PolicyChange,
    Readback,
    RecoveryReceipt,
    RecoveryState,
    decode_event,
)
from ledger.fold import Decision, decide, replay
from ledger.identity import canonical_json, operation_id, parameter_digest
from ledger.machine import TRANSITIONS

__all__ = [
    "TRANSITIONS",
    "AdmissionDecision",
    "AdmissionRequest",
    "Approval",
    "Claim",
    "Decision",
    "DecodeError",
    "Dispatch",
    "Disposition",
    "EffectReceipt",
    "ForbiddenTransitionError",
    "Intent",
    "JournalEntry",
    "LedgerError",
    "LedgerSettings",
    "OperatingEvent",
    "OperationState",
    "ParameterDriftError",
    "PolicyChange",
    "Readback",
    "RecoveryReceipt",
    "RecoveryState",
    "SchemaValidationError",
    "TopicConfigError",
    "UnknownSchemaError",
    "canonical_json",
    "decide",
    "decode_event",
    "evaluate_admission",
    "operation_id",
    "parameter_digest",
    "replay",
]
