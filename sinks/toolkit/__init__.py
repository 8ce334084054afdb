"""A server-side toolkit: put a conformant ``http`` sink in front of your own API.

The ledger's ``http`` adapter (:class:`sinks.client.SinkClient`) speaks the
protocol described by ``sinks/openapi.json`` (``ledger sink openapi`` prints
it). This package serves that protocol so a team writes only the business
half, a *backend*::

    from sinks.toolkit import Committed, create_sink_app, fence, replay

    class Payments:
        def submit(self, request):          # a SubmitRequest, already checked
            ...                              # fence, key, effect: one transaction
            return Committed(effect_id, committed_ms)

    app = create_sink_app(Payments(), name="payments", token=TOKEN, contract=CONTRACT)
    # serve `app` with any ASGI server (uvicorn); install with the [sink-toolkit] extra

The split of the work:

* The toolkit (:func:`create_sink_app`): the bearer token (constant time),
  body size and JSON depth limits, types, the operation ID grammar, the
  ``Idempotency-Key`` and fencing token the contract promises, the parameter
  digest recomputed for this sink's name, 501 for the parts the contract does
  not declare, and every response body and status.
* The backend (:mod:`sinks.toolkit.backend`): the effect, and the storage of
  the operation's highest fencing token and of its idempotency keys -- in the
  same transaction as the effect, which only the backend can do -- deciding
  with the toolkit's pure rules :func:`fence` and :func:`replay`. It answers
  typed outcomes (:class:`Committed`, :class:`StaleToken`,
  :class:`OutcomeUnknown` ...), never HTTP.

The reference gateway of the testbed is one such backend with an admin API
of its own added.
"""

from ledger.extras import require_extra

require_extra("sink-toolkit", "sinks.toolkit")  # Starlette: the [sink-toolkit] extra

from sinks.toolkit.app import create_sink_app, render  # noqa: E402
from sinks.toolkit.backend import (  # noqa: E402
    MAX_TOKEN,
    MAX_TOKEN_STEP,
    Absent,
    AccountOutcome,
    Committed,
    FenceVerdict,
    HoldOutcome,
    HoldState,
    KeyReused,
    OperationFound,
    OutcomeUnknown,
    PostconditionBackend,
    ReadbackBackend,
    ReadbackOutcome,
    Rejected,
    ReservationBackend,
    ReserveOutcome,
    SinkBackend,
    StaleToken,
    SubmitOutcome,
    SubmitRequest,
    TokenOutOfRange,
    Unavailable,
    fence,
    replay,
)
from sinks.toolkit.wire import (  # noqa: E402
    IDEMPOTENCY_HEADER,
    MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    MIN_TOKEN_LEN,
    authorised,
    read_json_object,
)

__all__ = [
    "IDEMPOTENCY_HEADER",
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_TOKEN",
    "MAX_TOKEN_STEP",
    "MIN_TOKEN_LEN",
    "Absent",
    "AccountOutcome",
    "Committed",
    "FenceVerdict",
    "HoldOutcome",
    "HoldState",
    "KeyReused",
    "OperationFound",
    "OutcomeUnknown",
    "PostconditionBackend",
    "ReadbackBackend",
    "ReadbackOutcome",
    "Rejected",
    "ReservationBackend",
    "ReserveOutcome",
    "SinkBackend",
    "StaleToken",
    "SubmitOutcome",
    "SubmitRequest",
    "TokenOutOfRange",
    "Unavailable",
    "authorised",
    "create_sink_app",
    "fence",
    "read_json_object",
    "render",
    "replay",
]
