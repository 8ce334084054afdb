"""Verification: the postcondition query a sink's contract declares, judged by the core.

Two uses: a ``VERIFY`` dispatch, and (``LEDGER_RELAY_INLINE_VERIFY``, default
on) the query asked right after a committed execution, whose verdict rides in
the ``COMMITTED`` receipt itself so that the processor verifies without a
``VERIFY`` round trip. The verdict is :func:`ledger.contracts.judge_postcondition`'s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from consumers.relay.records import Output, Recorder
from ledger.contracts import EffectContract, judge_postcondition, postcondition_request
from ledger.errors import SinkNotReachedError
from ledger.events import Dispatch, EffectReceipt
from sinks.client import postcondition_source
from sinks.port import SinkPort

log = logging.getLogger("consumers.relay")


class Postconditions:
    """Asks postcondition queries and records the core's verdicts.

    Args:
        recorder: builds the readbacks.
        seam: the fault hooks' seam (``(name, operation_id)``).
        now_ms: the relay's clock (ms).
        inline: read the postcondition right after a committed execution
            (``relay_inline_verify``).
    """

    def __init__(
        self,
        recorder: Recorder,
        seam: Callable[[str, str], None],
        now_ms: Callable[[], int],
        *,
        inline: bool,
    ) -> None:
        self.recorder = recorder
        self.seam = seam
        self.now_ms = now_ms
        self.inline = inline

    def verify(self, d: Dispatch, client: SinkPort, contract: EffectContract, now: int) -> Output:
        """Ask the postcondition query the contract declares; the core judges the answer.

        Raises:
            SinkNotReachedError: the query was not sent (parked for another try).
        """
        params: dict[str, Any] = json.loads(d.params_json)
        ask = postcondition_request(contract, params)
        source = f"{d.sink} {postcondition_source(ask.query, ask.subject)}"
        observation = client.postcondition(ask.query, ask.subject) if ask.offered else None
        if observation is not None and not observation.sent:
            raise SinkNotReachedError(
                observation.detail,
                kind="SINK_UNREACHABLE",
                request="postcondition",
                on_resume=d.on_resume,
            )
        status, detail = judge_postcondition(contract, params, observation, d.operation_id)
        return self.recorder.observation(
            d, "POSTCONDITION", status, source, detail, now, on_resume=d.on_resume
        )

    def read_at_once(
        self, d: Dispatch, client: SinkPort, contract: EffectContract, outcome: Output
    ) -> Output:
        """Read the postcondition right after an effect commits, into its receipt.

        Where :attr:`inline` is on and the sink's contract offers a
        postcondition query, a ``COMMITTED`` receipt of this execution takes
        the verdict of that query (``MATCH`` or ``MISMATCH``, with source,
        detail and time), so that the receipt and the readback commit in one
        record of one transaction and the processor verifies without a
        ``VERIFY`` dispatch (see :class:`~ledger.events.EffectReceipt`).

        Anything else leaves ``outcome`` as it is and the ``VERIFY`` path
        verifies, as when this is off: no postcondition query offered, an
        answer that is no verdict (``UNKNOWN``), and a query that failed
        (not reached, token refused, outside the protocol). The failure is
        logged; the ``VERIFY`` that follows asks again and records it as
        that path does. Only a Kafka error passes through.

        Args:
            d: the execution dispatch.
            client: the sink's client.
            contract: the sink's contract.
            outcome: the output the execution produced.

        Returns:
            ``outcome``, its receipt carrying the postcondition verdict when
            one was read.

        Raises:
            KafkaException: passed through for the stage loop.
        """
        topic, key, receipt = outcome
        if (
            not self.inline
            or not isinstance(receipt, EffectReceipt)
            or receipt.status != "COMMITTED"
        ):
            return outcome
        params: dict[str, Any] = json.loads(d.params_json)
        ask = postcondition_request(contract, params)
        if not ask.offered:
            return outcome
        self.seam("after_commit_before_verification", d.operation_id)
        source = f"{d.sink} {postcondition_source(ask.query, ask.subject)}"
        try:
            observation = client.postcondition(ask.query, ask.subject)
            if not observation.sent:
                raise SinkNotReachedError(
                    observation.detail, kind="SINK_UNREACHABLE", request="postcondition"
                )
            status, detail = judge_postcondition(contract, params, observation, d.operation_id)
        except KafkaException:
            raise
        except Exception as exc:
            log.warning(
                "relay: postcondition of %s right after its effect not read (%s: %s); "
                "it is verified by a VERIFY dispatch",
                d.dispatch_id,
                type(exc).__name__,
                exc,
            )
            return outcome
        if status not in ("MATCH", "MISMATCH"):
            return outcome
        checked = receipt.model_copy(
            update={
                "postcondition_status": status,
                "postcondition_source": source,
                "postcondition_detail": detail,
                "postcondition_observed_at_ms": self.now_ms(),
            }
        )
        return (topic, key, checked)
