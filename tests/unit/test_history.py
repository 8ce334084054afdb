"""One operation's history: causal order across topics and the five answers (pure)."""

from __future__ import annotations

import random

from ledger.events import ApprovalUse, Dispatch, EffectReceipt, Event, OperationState
from ledger.fold import decide, journal_entry
from ledger.history import NOT_RECORDED, HistoryRecord, build_history
from tests.helpers import admission, approval, claim, intent, readback, receipt

OP = "refund:c1:v1"


class Ledger:
    """Runs inputs through the fold and puts every record where the processor would."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.time_ms = 1_000
        self.records: list[HistoryRecord] = []
        self.state: OperationState | None = None
        self.dispatch: Dispatch | None = None

    def put(self, topic: str, key: str, event: Event, problem: str | None = None) -> HistoryRecord:
        offset = self.offsets.get(topic, 0)
        self.offsets[topic] = offset + 1
        self.time_ms += 10
        rec = HistoryRecord(topic, 0, offset, self.time_ms, key, event, problem)
        self.records.append(rec)
        return rec

    def input(self, topic: str, event: Event) -> None:
        rec = self.put(topic, OP, event)
        d = decide(self.state, event, f"{topic}:0:{rec.offset}")
        self.put("journal", OP, journal_entry(d, event, event.to_bytes(), topic, 0, rec.offset))
        if d.state is not None and d.outcome == "APPLIED":
            self.put("state", OP, d.state)
        for out in d.outputs:
            if out.event is not None:
                self.put(out.topic, out.key, out.event)
                if isinstance(out.event, Dispatch):
                    self.dispatch = out.event
        self.state = d.state or self.state

    def observed(self, event: EffectReceipt | Event) -> Event:
        """``event`` for the latest dispatch (its ID and fencing token)."""
        assert self.dispatch is not None
        return event.model_copy(
            update={
                "dispatch_id": self.dispatch.dispatch_id,
                "fencing_token": self.dispatch.fencing_token,
            }
        )


def resumed_ledger() -> Ledger:
    """Admitted, an ambiguous receipt, a claim, readback on resume, verified."""
    led = Ledger()
    led.put("approvals", "ap-1", approval())
    i = intent(OP)
    led.input("intents", i)
    led.put(
        "approval-uses",
        "ap-1",
        ApprovalUse(
            approval_id="ap-1",
            operation_id=OP,
            parameter_digest=i.parameter_digest,
            consumed_at_ms=1000,
            decided_by="authority-0",
        ),
    )
    led.input("admissions", admission(i))
    led.input("receipts", led.observed(receipt(OP, "x", "AMBIGUOUS")))
    assert led.state is not None
    led.input("claims", claim(OP, "resumer-1", led.state.version))
    led.input("readbacks", led.observed(readback(OP, "x", "COMMITTED", on_resume=True)))
    led.input(
        "readbacks",
        led.observed(readback(OP, "x", "MATCH", kind="POSTCONDITION", on_resume=True)),
    )
    assert led.state is not None and led.state.state == "OUTCOME_VERIFIED"
    return led


def test_records_in_any_order_come_back_in_causal_order() -> None:
    led = resumed_ledger()
    shuffled = list(led.records)
    random.Random(7).shuffle(shuffled)
    history = build_history(OP, shuffled)
    assert [e.record.position for e in history.entries] == [r.position for r in led.records]
    kinds = [e.kind for e in history.entries]
    assert kinds[:3] == ["Approval", "Intent", "JournalEntry"]
    assert kinds.index("ApprovalUse") < kinds.index("AdmissionDecision")
    assert kinds.index("Claim") < kinds.index("RecoveryReceipt")


def test_causal_order_does_not_follow_timestamps_across_producers() -> None:
    """A receipt stamped (by a skewed clock) before its dispatch still follows the journal."""
    led = resumed_ledger()
    skewed = [
        HistoryRecord(r.topic, r.partition, r.offset, 0, r.key, r.event)
        if r.topic == "receipts"
        else r
        for r in led.records
    ]
    history = build_history(OP, skewed)
    positions = [e.record.position for e in history.entries]
    assert positions.index(("receipts", 0, 0)) > positions.index(("dispatches", 0, 0))


def test_the_five_answers_of_a_resumed_operation() -> None:
    history = build_history(OP, resumed_ledger().records)
    assert all(a.recorded for a in history.answers), [a.answer for a in history.answers]
    assert "svc for subject customer-1" in history.answer("initiated").answer
    admitted = history.answer("admitted").answer
    assert "approval ap-1" in admitted and "parameter digest v2:" in admitted
    assert "receipt AMBIGUOUS" in history.answer("target").answer
    assert "readback EFFECT COMMITTED" in history.answer("target").answer
    assert history.answer("resume").answer.startswith("COMPLETE by resumer-1")
    outcome = history.answer("outcome")
    assert outcome.answer.startswith("OUTCOME_VERIFIED")
    assert "postcondition readback MATCH" in outcome.answer
    assert history.final_state is not None and history.final_state.state == "OUTCOME_VERIFIED"
    for a in history.answers:
        assert a.evidence, a.key


def test_what_the_evidence_does_not_give_is_not_recorded() -> None:
    led = Ledger()
    led.input("intents", intent(OP, approval=None))
    history = build_history(OP, led.records)
    assert history.answer("initiated").recorded
    for key in ("admitted", "target", "resume", "outcome"):
        a = history.answer(key)
        assert not a.recorded and a.answer.startswith(NOT_RECORDED), a


def test_unauthentic_records_are_listed_not_believed() -> None:
    led = resumed_ledger()
    forged = led.put(
        "receipts", OP, led.observed(receipt(OP, "x", "COMMITTED")), problem="no ledger-auth header"
    )
    history = build_history(OP, led.records)
    [entry] = [e for e in history.entries if e.record.position == forged.position]
    assert not entry.record.believed
    assert entry.summary.startswith("NOT BELIEVED (no ledger-auth header)")
    assert history.unbelieved == 1
    assert "receipt COMMITTED" not in history.answer("target").answer
    data = history.to_dict()
    assert data["counts"] == {"records": len(led.records), "unbelieved": 1}


def test_a_compacted_input_is_shown_from_the_journal_copy() -> None:
    led = resumed_ledger()
    kept = [r for r in led.records if r.topic != "intents"]
    history = build_history(OP, kept)
    [copy] = [e for e in history.entries if e.kind == "Intent"]
    assert copy.record.via_journal and copy.record.position == ("intents", 0, 0)
    assert history.answer("initiated").recorded


def test_json_shape() -> None:
    data = build_history(OP, resumed_ledger().records).to_dict()
    assert set(data) == {
        "operation_id",
        "final_state",
        "compensates",
        "compensated_by",
        "answers",
        "records",
        "counts",
        "forked_from",
        "forks",
    }
    assert [a["key"] for a in data["answers"]] == [
        "initiated",
        "admitted",
        "target",
        "resume",
        "outcome",
    ]
    rec = data["records"][0]
    assert set(rec) == {
        "topic",
        "partition",
        "offset",
        "time_ms",
        "time",
        "key",
        "kind",
        "summary",
        "believed",
        "problem",
        "via_journal",
        "event",
    }
    journal = next(r for r in data["records"] if r["kind"] == "JournalEntry")
    assert isinstance(journal["event"]["input_event"], str)  # bytes as hex
    assert data["final_state"]["state"] == "OUTCOME_VERIFIED"


def test_partition_for_matches_the_java_client() -> None:
    """Kafka's own murmur2 test vectors (``UtilsTest.testMurmur2``)."""
    from consumers.history import murmur2, partition_for

    vectors = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, expected in vectors.items():
        assert murmur2(data) == expected, data
    assert partition_for("21", 3) == (-973932308 & 0x7FFFFFFF) % 3


def test_history_page_shows_answers_and_records_escaped() -> None:
    from ledger.cli.history import history_lines, history_page

    led = resumed_ledger()
    led.put("operating-events", OP, led.observed(receipt(OP, "x")), problem="<forged>")
    history = build_history(OP, led.records)
    page = history_page(history, "ledger")
    assert "<h1>History of <code>refund:c1:v1</code></h1>" in page
    for a in history.answers:
        assert a.question in page
    assert page.count('<tr id="r-') == len(history.entries)
    assert "&lt;forged&gt;" in page and "<forged>" not in page
    assert 'class="unbelieved"' in page
    lines = history_lines(history)
    assert lines[0].startswith(f"history of {OP}: {len(history.entries)} records, 1 not believed")
    assert "Who initiated the case?" in lines


def test_history_file_names_are_safe_and_distinct() -> None:
    from ledger.cli.history import history_file_name

    a, b = history_file_name("refund:1/2:v1"), history_file_name("refund:1_2:v1")
    assert a != b and a.startswith("refund_1_2_v1-") and a.endswith(".html")
    assert "/" not in a and ":" not in a


def test_a_fork_shows_the_link_both_ways() -> None:
    from ledger.cli.history import history_lines

    led = Ledger()
    fork = intent().model_copy(update={"forked_from": "refund:c0:v1"})
    led.input("intents", fork)
    history = build_history(OP, led.records, forks=["refund:c1:v1-b"])
    assert history.forked_from == "refund:c0:v1" and history.forks == ("refund:c1:v1-b",)
    assert history.to_dict()["forked_from"] == "refund:c0:v1"
    lines = history_lines(history)
    assert "a fork of: refund:c0:v1" in lines and "forked as: refund:c1:v1-b" in lines
    assert any("a fork of refund:c0:v1" in e.summary for e in history.entries)
    plain = build_history(OP, resumed_ledger().records)
    assert plain.forked_from is None and plain.to_dict()["forks"] == []


def test_a_history_shows_both_sides_of_a_compensation_link() -> None:
    from ledger.cli.history import history_lines

    original = build_history(OP, resumed_ledger().records, compensated_by=["refund-reversal:c1:v1"])
    assert original.compensated_by == ("refund-reversal:c1:v1",)
    assert original.to_dict()["compensated_by"] == ["refund-reversal:c1:v1"]
    assert "compensated by: refund-reversal:c1:v1" in history_lines(original)
    led = Ledger()
    led.input("intents", intent().model_copy(update={"compensates": "refund:c0:v1"}))
    comp = build_history(OP, led.records)
    assert comp.to_dict()["compensates"] == "refund:c0:v1"
    assert "compensates: refund:c0:v1" in history_lines(comp)
    assert any("compensates refund:c0:v1" in e.summary for e in comp.entries)
    assert build_history(OP, resumed_ledger().records).compensated_by == ()


def test_an_outcome_verified_by_the_receipt_names_its_postcondition() -> None:
    """The relay read the postcondition right after the effect: the receipt is the evidence."""
    led = Ledger()
    i = intent(OP)
    led.input("intents", i)
    led.input("admissions", admission(i))
    checked = receipt(OP, "x").model_copy(
        update={
            "postcondition_status": "MATCH",
            "postcondition_source": "payments GET /accounts/acct-1",
            "postcondition_detail": "account acct-1 shows one credit",
            "postcondition_observed_at_ms": 2100,
        }
    )
    led.input("receipts", led.observed(checked))
    assert led.state is not None and led.state.state == "OUTCOME_VERIFIED"
    history = build_history(OP, led.records)
    outcome = history.answer("outcome")
    assert outcome.recorded and outcome.answer.startswith("OUTCOME_VERIFIED")
    assert "postcondition readback MATCH via payments GET /accounts/acct-1" in outcome.answer
    assert any(position.startswith("receipts:") for position in outcome.evidence)
