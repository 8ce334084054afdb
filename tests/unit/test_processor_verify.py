"""No verification is dispatched to a sink that cannot verify (consumers.processor).

A sink whose contract offers no postcondition query would answer a ``VERIFY``
with ``UNSUPPORTED``, which changes nothing: the processor leaves that
dispatch out of the outbox, while its state and journal stay the fold's, so
replay (the auditor's) decides exactly what the processor wrote.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.processor import Processor
from consumers.stage import Record
from ledger.contracts import PAYMENT_GATEWAY, EffectContract
from ledger.events import Dispatch, Event, JournalEntry, OperationState, decode_event
from ledger.fold import replay
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from sinks.registry import SinkEndpoint, save_sinks
from tests.helpers import admission, claim, intent, keyed, receipt


class Captured:
    """A writer that keeps what the processor writes."""

    observe = None  # no metrics

    def __init__(self) -> None:
        self.written: list[tuple[str, str, Event | None]] = []

    def write(self, topic: str, key: str, event: Event | None) -> None:
        self.written.append((topic, key, event))

    def write_raw(self, topic: str, key: str, value: bytes | None, **_: object) -> None:
        self.written.append((topic, key, decode_event(value) if topic == "journal" else None))

    def dispatches(self) -> list[Dispatch]:
        return [e for t, _, e in self.written if t == "dispatches" and isinstance(e, Dispatch)]

    def journal(self) -> list[JournalEntry]:
        return [e for t, _, e in self.written if t == "journal" and isinstance(e, JournalEntry)]


@pytest.fixture
def processor(tmp_path: Path) -> Processor:
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    save_sinks(
        settings.sinks_path(),
        {
            "payments": SinkEndpoint(url="http://payments.test", contract=PAYMENT_GATEWAY),
            "mailer": SinkEndpoint(url="http://mailer.test", contract=EffectContract()),
        },
    )
    return Processor(settings)


def _feed(processor: Processor, events: list[Event]) -> Captured:
    out = Captured()
    for n, event in enumerate(events):
        op = event.operation_id  # type: ignore[attr-defined]
        rec = Record("in", 0, n, op, event.to_bytes(), event)
        processor.handle([rec], out)  # type: ignore[arg-type]
        processor.after_commit()
    return out


def _to_committed(sink: str) -> list[Event]:
    op = f"x:{sink}:v1"
    i = intent(op, sink=sink)
    return [i, admission(i), receipt(op, f"{op}#1.1").model_copy(update={"sink": sink})]


@pytest.mark.parametrize(
    "sink, kinds", [("payments", ["EXECUTE", "VERIFY"]), ("mailer", ["EXECUTE"])]
)
def test_a_committed_effect_is_verified_only_where_the_sink_can_verify(
    processor: Processor, sink: str, kinds: list[str]
) -> None:
    out = _feed(processor, _to_committed(sink))
    assert [d.kind for d in out.dispatches()] == kinds
    state = processor.current(f"x:{sink}:v1")
    assert state is not None and state.state == S.EFFECT_COMMITTED
    # The journal is the fold's: its replay gives the state the processor holds.
    assert replay(out.journal()) == {state.operation_id: state}


def test_a_resumes_verification_is_written_even_where_the_sink_cannot_verify(
    processor: Processor,
) -> None:
    events = _to_committed("mailer")
    out = _feed(processor, events)
    state = processor.current("x:mailer:v1")
    assert isinstance(state, OperationState)
    again = _feed(processor, [claim(state.operation_id, "processor-9", state.version)])
    [verify] = again.dispatches()
    assert verify.kind == "VERIFY" and verify.on_resume
    assert out.dispatches()[-1].kind == "EXECUTE"


def _verify(sink: str, params_json: str = '{"account": "acct-1", "amount_minor": 5}') -> Dispatch:
    return Dispatch(
        dispatch_id=f"x:{sink}:v1#1.2",
        operation_id=f"x:{sink}:v1",
        kind="VERIFY",
        sink=sink,
        action="refund",
        params_json=params_json,
        parameter_digest="0" * 64,
        fencing_token=1,
        state_version=4,
    )


def test_what_the_registry_says_decides_and_doubt_sends(processor: Processor) -> None:
    assert processor.facts.verification_pointless(_verify("mailer"))
    assert not processor.facts.verification_pointless(_verify("payments"))
    # The query needs its subject (the account) among the parameters.
    assert processor.facts.verification_pointless(_verify("payments", '{"amount_minor": 5}'))
    assert not processor.facts.verification_pointless(
        _verify("mailer").model_copy(update={"kind": "EXECUTE"})
    )
    assert not processor.facts.verification_pointless(_verify("gone"))  # not registered
    assert not processor.facts.verification_pointless(_verify("mailer", "not json"))
    processor.registry.path.write_text("{ broken")
    assert not processor.facts.verification_pointless(_verify("mailer"))  # unreadable registry
