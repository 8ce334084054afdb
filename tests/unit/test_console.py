"""The operator console's routes without a broker: an in-memory ledger behind
:class:`ledger.console.ConsoleData`, driven by Starlette's TestClient.

What a real ledger does with a disposition is the browser test's
(tests/integration/test_console.py); here: what the pages show, how the forms
are validated, and that a form without the token or from another origin is
refused before anything is published.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from ledger.console import (
    LedgerData,
    StageHealth,
    allowed_hosts,
    create_app,
    operation_age_s,
)
from ledger.errors import LedgerError
from ledger.events import OperationState
from ledger.instants import clock_time
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.stranded import Evidence, Stranded, StrandedBounds, evaluate

with warnings.catch_warnings():  # starlette would rather have httpx2; httpx is what we ship
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

TOKEN = "console-test-token"
BASE = "http://127.0.0.1:8088"
SAME_ORIGIN = {"Origin": BASE}


def op_state(op: str, state: S, sink: str = "payments", observed_s: float | None = None) -> Any:
    return OperationState(
        operation_id=op,
        state=state,
        version=3,
        epoch=1,
        parameter_digest="v2:" + "0" * 64,
        sink=sink,
        action="refund",
        params_json="{}",
        actor="svc",
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
        amount_minor=5000,
        admitted_at_ms=1_000,
        observed_at_ms=None if observed_s is None else int(observed_s * 1000),
        reason=f"reason of {op}",
        observation_status="TIMEOUT" if state == S.UNKNOWN_OUTCOME else None,
        observation_source="relay" if state == S.UNKNOWN_OUTCOME else None,
    )


class FakeLedger:
    """Three operations, one held; dispositions recorded, not published."""

    def __init__(self) -> None:
        self.states = {
            st.operation_id: st
            for st in (
                op_state("refund:1:v1", S.OUTCOME_VERIFIED, observed_s=50),
                op_state("refund:2:v1", S.NEEDS_REAUTHORISATION),
                op_state("notify:<held>:v1", S.UNKNOWN_OUTCOME, sink="mailer", observed_s=10),
            )
        }
        self.disposed: list[tuple[str, str, str, str]] = []
        self.audits: list[bool] = []
        self.history_data: dict[str, Any] | None = None
        self.fail_dispose: LedgerError | None = None
        self.audit_report: dict[str, Any] | None = None
        self.stranded_ops: list[Stranded] = []
        self.read_backs: list[str] = []

    def now_ms(self) -> int:
        return 100_000

    def operations(self) -> list[OperationState]:
        return sorted(self.states.values(), key=lambda st: st.operation_id)

    def queue(self) -> list[OperationState]:
        return [st for st in self.operations() if st.state == S.UNKNOWN_OUTCOME]

    def history(self, operation_id: str) -> dict[str, Any] | None:
        return self.history_data

    def operators(self) -> list[str]:
        return ["alex"]

    def dispose(self, operation_id: str, decision: str, by: str, evidence: str) -> str:
        if self.fail_dispose is not None:
            raise self.fail_dispose
        self.disposed.append((operation_id, decision, by, evidence))
        self.states[operation_id] = self.states[operation_id].model_copy(
            update={"state": S.EFFECT_COMMITTED}
        )
        return f"APPLIED: {operation_id} UNKNOWN_OUTCOME -> EFFECT_COMMITTED"

    def audit(self, read_sinks: bool) -> dict[str, Any]:
        self.audits.append(read_sinks)
        if self.audit_report is not None:
            return self.audit_report
        return {
            "operations": 3,
            "journal_entries": 9,
            "checked": {"one_effect_per_operation": 3},
            "violations": [],
            "unauthenticated_records": [],
        }

    def stages(self) -> list[StageHealth]:
        return [StageHealth("ledger.processor", "consumer group", True, True, "STABLE: 1 member")]

    def stranded(self) -> list[Stranded]:
        return list(self.stranded_ops)

    def read_back(self, operation_id: str) -> str:
        self.read_backs.append(operation_id)
        return f"{operation_id}: verification MATCH (one credit)"


def strand(ledger: FakeLedger, op: str, state: S, age_s: float) -> Stranded:
    """Add ``op`` in ``state`` to the fake ledger, stranded for ``age_s`` seconds."""
    ledger.states[op] = op_state(op, state, observed_s=1)
    since = ledger.now_ms() - int(age_s * 1000)
    found = evaluate(op, str(state), "payments", Evidence(since), ledger.now_ms(), StrandedBounds())
    assert found is not None
    ledger.stranded_ops.append(found)
    return found


@pytest.fixture
def ledger() -> FakeLedger:
    return FakeLedger()


@pytest.fixture
def client(ledger: FakeLedger) -> TestClient:
    return TestClient(create_app(ledger, title="t1", token=TOKEN), base_url=BASE)


def dispose_form(**overrides: str) -> dict[str, str]:
    form = {
        "token": TOKEN,
        "operation_id": "notify:<held>:v1",
        "decision": "committed",
        "by": "alex",
        "evidence": "provider log shows delivery",
    }
    form.update(overrides)
    return {k: v for k, v in form.items() if v is not None}


def rows(html: str, table_id: str) -> list[str]:
    match = re.search(rf'<table id="{table_id}">(.*?)</table>', html, re.S)
    assert match is not None, f"no table {table_id!r}"
    return re.findall(r"<tr[ >].*?</tr>", match.group(1), re.S)[1:]


def test_operations_lists_every_operation_escaped(client: TestClient) -> None:
    page = client.get("/operations")
    assert page.status_code == 200
    assert len(rows(page.text, "operations")) == 3
    assert "notify:&lt;held&gt;:v1" in page.text and "<held>" not in page.text


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # problems first: reauthorisation pending before settled
        ({"q": "refund:"}, ["refund:2:v1", "refund:1:v1"]),
        ({"state": "UNKNOWN_OUTCOME"}, ["notify:&lt;held&gt;:v1"]),
        ({"sink": "payments", "q": "2"}, ["refund:2:v1"]),
        # ages at 100 s: refund:1 observed at 50 s, the held one at 10 s, refund:2 admitted at 1 s
        ({"min_age_s": "60"}, ["notify:&lt;held&gt;:v1", "refund:2:v1"]),
        ({"min_age_s": "95"}, ["refund:2:v1"]),
    ],
)
def test_operations_search_and_filters(
    client: TestClient, query: dict[str, str], expected: list[str]
) -> None:
    page = client.get("/operations", params=query)
    assert page.status_code == 200
    listed = [re.search(r">([^<]+)</a>", row).group(1) for row in rows(page.text, "operations")]  # type: ignore[union-attr]
    assert listed == expected


@pytest.mark.parametrize("bad", [{"min_age_s": "-1"}, {"min_age_s": "soon"}, {"state": "LOST"}])
def test_a_bad_filter_is_said_not_crashed(client: TestClient, bad: dict[str, str]) -> None:
    page = client.get("/operations", params=bad)
    assert page.status_code == 400
    assert 'id="error"' in page.text


def test_age_is_never_negative_and_unknown_without_evidence() -> None:
    held = op_state("a", S.UNKNOWN_OUTCOME, observed_s=10)
    assert operation_age_s(held, 4_000) == 0.0
    assert operation_age_s(held, 12_500) == 2.5
    assert operation_age_s(held.model_copy(update={"admitted_at_ms": None}), 0) == 0.0
    new = op_state("b", S.NOT_ADMITTED).model_copy(update={"admitted_at_ms": None})
    assert operation_age_s(new, 1_000) is None


def test_the_queue_offers_a_form_with_the_token_per_held_operation(client: TestClient) -> None:
    page = client.get("/queue")
    (row,) = rows(page.text, "queue")
    assert "notify:&lt;held&gt;:v1" in row
    assert f'name="token" value="{TOKEN}"' in row
    assert '<option value="alex">alex</option>' in row


def test_a_valid_disposition_is_published_and_leaves_the_queue(
    client: TestClient, ledger: FakeLedger
) -> None:
    reply = client.post(
        "/dispose", data=dispose_form(), headers=SAME_ORIGIN, follow_redirects=False
    )
    assert reply.status_code == 303
    assert ledger.disposed == [
        ("notify:<held>:v1", "committed", "alex", "provider log shows delivery")
    ]
    queue = client.get(reply.headers["location"])
    assert 'id="queue-empty"' in queue.text
    assert "UNKNOWN_OUTCOME -&gt; EFFECT_COMMITTED" in queue.text


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"decision": "maybe"}, "choose a decision"),
        ({"by": "mallory"}, "has no operator key on this host"),
        ({"by": ""}, "choose the operator"),
        ({"evidence": "   "}, "evidence"),
        ({"evidence": "x" * 2001}, "longer than 2000"),
        ({"operation_id": "refund:1:v1"}, "is not held"),
    ],
)
def test_an_invalid_disposition_is_refused_with_the_reason(
    client: TestClient, ledger: FakeLedger, overrides: dict[str, str], said: str
) -> None:
    reply = client.post("/dispose", data=dispose_form(**overrides), headers=SAME_ORIGIN)
    assert reply.status_code == 400
    assert said in reply.text
    assert ledger.disposed == []


@pytest.mark.parametrize(
    ("form", "headers"),
    [
        (dispose_form(token="forged"), SAME_ORIGIN),
        ({k: v for k, v in dispose_form().items() if k != "token"}, SAME_ORIGIN),
        (dispose_form(), {"Origin": "http://evil.example"}),
        (dispose_form(), {"Origin": "null"}),
        (dispose_form(), {"Referer": "http://127.0.0.1:9999/queue"}),
    ],
)
def test_a_cross_site_or_tokenless_post_is_refused(
    client: TestClient, ledger: FakeLedger, form: dict[str, str], headers: dict[str, str]
) -> None:
    reply = client.post("/dispose", data=form, headers=headers)
    assert reply.status_code == 403
    assert "refused" in reply.text
    assert ledger.disposed == []
    assert client.post("/audit", data={"token": "forged"}).status_code == 403
    assert ledger.audits == []


def test_a_foreign_host_header_is_refused(ledger: FakeLedger) -> None:
    rebound = TestClient(create_app(ledger, token=TOKEN), base_url="http://attacker.example")
    assert rebound.get("/queue").status_code == 400
    assert allowed_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "::1", "[::1]"]
    assert allowed_hosts("0.0.0.0") == ["*"]


def test_a_disposition_the_ledger_refuses_is_said(client: TestClient, ledger: FakeLedger) -> None:
    ledger.fail_dispose = LedgerError("'alex' has no signing key here")
    reply = client.post("/dispose", data=dispose_form(), headers=SAME_ORIGIN)
    assert reply.status_code == 503
    assert "not disposed: &#39;alex&#39; has no signing key here" in reply.text


def test_the_timeline_shows_the_history_or_says_it_has_none(
    client: TestClient, ledger: FakeLedger
) -> None:
    page = client.get("/operation", params={"id": "notify:<held>:v1"})
    assert page.status_code == 200
    assert 'id="no-history"' in page.text and "reason of notify" in page.text
    assert 'action="/dispose"' in page.text  # held: the form is on its page too
    ledger.history_data = {
        "operation_id": "notify:<held>:v1",
        "answers": [
            {
                "key": "initiated",
                "question": "Who initiated the case?",
                "recorded": True,
                "answer": "svc for customer-1",
                "evidence": ["intents:0:4"],
            },
        ],
        "records": [
            {
                "topic": "intents",
                "partition": 0,
                "offset": 4,
                "kind": "Intent",
                "time": None,
                "summary": "intent",
                "believed": True,
                "via_journal": False,
            },
            {
                "topic": "journal",
                "partition": 0,
                "offset": 7,
                "kind": "JournalEntry",
                "time": "2026-12-01T23:00:00.000+00:00",
                "summary": "<applied>",
                "believed": False,
                "via_journal": False,
            },
        ],
        "counts": {"records": 2, "unbelieved": 1},
    }
    page = client.get("/operation", params={"id": "notify:<held>:v1"})
    assert "svc for customer-1" in page.text
    intent, entry = rows(page.text, "timeline")
    assert "intents:0:4" in intent
    assert 'class="unbelieved"' in entry and "&lt;applied&gt;" in entry
    assert client.get("/operation", params={"id": "nope"}).status_code == 404


def test_the_audit_runs_on_demand_and_lists_open_items(
    client: TestClient, ledger: FakeLedger
) -> None:
    before = client.get("/audit")
    assert 'id="no-audit"' in before.text
    assert len(rows(before.text, "open-items")) == 2  # held + reauthorisation pending
    reply = client.post("/audit", data={"token": TOKEN}, headers=SAME_ORIGIN)
    assert reply.status_code == 200 and ledger.audits == [False]
    assert "CLEAN" in reply.text and "one_effect_per_operation" in reply.text
    assert "3 operation(s)" in reply.text and 'id="offsets"' not in reply.text


def test_stages_say_when_no_metrics_endpoint_is_configured(client: TestClient) -> None:
    page = client.get("/stages")
    assert 'id="no-metrics"' in page.text and "ledger.processor" in page.text


def test_the_ledgers_data_reads_operators_and_status_files(tmp_path: Any) -> None:
    settings = LedgerSettings(run_dir=tmp_path, topic_prefix="t")
    (tmp_path / "operators").mkdir()
    (tmp_path / "operators" / "alex.key").write_text("{}")
    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "relay-0.json").write_text('{"pid": 999999999, "ready": true}')
    (tmp_path / "status" / "broken.json").write_text("{")
    data = LedgerData(settings)
    assert data.operators() == ["alex"]
    relay, broken = sorted(data._status_files(), key=lambda r: r.name, reverse=True)
    assert (relay.name, relay.ok, relay.ready) == ("relay-0", False, False)
    assert broken.ok is None and "unreadable" in broken.detail


def test_a_stage_alive_but_silent_is_not_responding_on_the_stages_page(tmp_path: Any) -> None:
    """A process that runs but has not gone round its loop (SIGSTOP) is not shown healthy."""
    import os

    from consumers.twins import announce

    settings = LedgerSettings(run_dir=tmp_path, topic_prefix="t")
    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "relay-0.json").write_text(f'{{"pid": {os.getpid()}, "ready": true}}')
    beat = announce(tmp_path, "relay", "0")
    (row,) = LedgerData(settings)._status_files()
    assert (row.ok, row.ready) == (True, True) and "NOT RESPONDING" not in row.detail
    os.utime(beat, (0, 0))  # its loop last went round long ago
    (row,) = LedgerData(settings)._status_files()
    assert (row.ok, row.ready) == (False, False)
    assert "NOT RESPONDING" in row.detail and "do not start another" in row.detail


def test_stage_health_probes_the_metrics_endpoints_a_status_file_names(tmp_path: Any) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Probe(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Probe)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "status").mkdir()
        port = server.server_address[1]
        (tmp_path / "status" / "relay-0.json").write_text(
            f'{{"pid": 1, "ready": true, "metrics_port": {port}}}'
        )
        data = LedgerData(
            LedgerSettings(run_dir=tmp_path, topic_prefix="t"),
            metrics={"processor-0": "http://127.0.0.1:1"},  # nothing listens there
        )
        processor, relay = data._endpoints()
        assert (relay.name, relay.ok, relay.ready) == ("relay-0", True, False)
        assert "/healthz 200, /readyz 503" in relay.detail
        assert (processor.ok, processor.ready) == (None, None)
        assert "unreachable" in processor.detail
    finally:
        server.shutdown()
        server.server_close()


def test_audit_violations_link_to_their_operations(client: TestClient, ledger: FakeLedger) -> None:
    ledger.audit_report = {
        "operations": 3,
        "violations": [
            {"invariant": "one_effect", "operation_id": "refund:1:v1", "evidence": "2 effects"},
            {"invariant": "sealed", "operation_id": None, "evidence": "<forged>"},
        ],
    }
    page = client.post("/audit", data={"token": TOKEN, "read_sinks": "on"}, headers=SAME_ORIGIN)
    assert ledger.audits == [True]
    assert "VIOLATIONS" in page.text and "&lt;forged&gt;" in page.text
    linked, unlinked = rows(page.text, "violations")
    assert 'href="/operation?id=refund%3A1%3Av1"' in linked and "href" not in unlinked


def test_an_operations_instants_read_as_iso_utc_not_milliseconds(
    client: TestClient, ledger: FakeLedger
) -> None:
    at_ms = 1_796_646_378_123  # a wall-clock ledger instant
    op = "refund:1:v1"
    ledger.states[op] = ledger.states[op].model_copy(update={"admitted_at_ms": at_ms})
    page = client.get("/operation", params={"id": op})
    assert page.status_code == 200
    state = page.text.split('id="state"', 1)[1]
    assert str(at_ms) not in state
    assert clock_time(at_ms) in state and "admitted_at" in state


def test_operations_list_problems_first_stranded_then_held_then_in_flight_then_settled(
    client: TestClient, ledger: FakeLedger
) -> None:
    ledger.states["aaa:pending:v1"] = op_state("aaa:pending:v1", S.EFFECT_PENDING, observed_s=90)
    strand(ledger, "zzz:committed:v1", S.EFFECT_COMMITTED, 400)
    strand(ledger, "yyy:pending:v1", S.EFFECT_PENDING, 900)
    page = client.get("/operations")
    listed = [
        re.search(r'data-operation="([^"]+)"', r).group(1) for r in rows(page.text, "operations")
    ]  # type: ignore[union-attr]
    assert listed == [
        "yyy:pending:v1",  # stranded, the oldest first
        "zzz:committed:v1",
        "notify:&lt;held&gt;:v1",  # held for a person
        "refund:2:v1",
        "aaa:pending:v1",  # in flight within its bound
        "refund:1:v1",  # settled
    ]
    (first,) = [r for r in rows(page.text, "operations") if "yyy:pending" in r]
    assert "stranded (in_flight_without_owner)" in first


def test_the_navigation_counts_stranded_and_unknown_and_the_queue_lists_stranded_first(
    client: TestClient, ledger: FakeLedger
) -> None:
    quiet = client.get("/stages").text
    assert "(0 stranded, 1 unknown)" in quiet
    app_ledger = FakeLedger()
    strand(app_ledger, "refund:c:v1", S.EFFECT_COMMITTED, 400)
    strand(app_ledger, "refund:p:v1", S.EFFECT_PENDING, 500)
    fresh = TestClient(create_app(app_ledger, title="t1", token=TOKEN), base_url=BASE)
    page = fresh.get("/queue")
    assert "(2 stranded, 1 unknown)" in page.text and 'class="alarm"' in page.text
    assert page.text.index('id="stranded"') < page.text.index('id="queue"')
    committed, pending = (
        [r for r in rows(page.text, "stranded") if op in r] for op in ("refund:c:v1", "refund:p:v1")
    )
    # "Read back now" where a readback can move it (a verification), not for work in flight.
    assert 'action="/read-back"' in committed[0] and f'value="{TOKEN}"' in committed[0]
    assert 'action="/read-back"' not in pending[0] and "start the relay" in pending[0]
    (held,) = rows(page.text, "queue")
    assert 'action="/read-back"' in held and 'action="/dispose"' in held


def test_read_back_now_reads_back_an_offered_operation_and_refuses_others(
    client: TestClient, ledger: FakeLedger
) -> None:
    strand(ledger, "refund:c:v1", S.EFFECT_COMMITTED, 400)
    strand(ledger, "refund:p:v1", S.EFFECT_PENDING, 400)
    done = client.post(
        "/read-back",
        data={"token": TOKEN, "operation_id": "refund:c:v1"},
        headers=SAME_ORIGIN,
        follow_redirects=False,
    )
    assert done.status_code == 303 and "verification+MATCH" in done.headers["location"]
    held = client.post(
        "/read-back", data={"token": TOKEN, "operation_id": "notify:<held>:v1"}, headers=SAME_ORIGIN
    )
    assert held.status_code == 200 and ledger.read_backs == ["refund:c:v1", "notify:<held>:v1"]
    for op in ("refund:p:v1", "refund:1:v1"):  # in flight: the relay's; settled: nothing to do
        no = client.post(
            "/read-back", data={"token": TOKEN, "operation_id": op}, headers=SAME_ORIGIN
        )
        assert no.status_code == 400 and "not read back" in no.text
    tokenless = client.post("/read-back", data={"operation_id": "refund:c:v1"}, headers=SAME_ORIGIN)
    foreign = client.post(
        "/read-back",
        data={"token": TOKEN, "operation_id": "refund:c:v1"},
        headers={"Origin": "http://evil.example"},
    )
    assert tokenless.status_code == foreign.status_code == 403
    assert ledger.read_backs == ["refund:c:v1", "notify:<held>:v1"]


def test_the_audit_page_lists_stranded_operations_first_and_never_calls_them_clean(
    client: TestClient, ledger: FakeLedger
) -> None:
    found = strand(ledger, "refund:c:v1", S.EFFECT_COMMITTED, 400)
    ledger.audit_report = {
        "operations": 4,
        "verdict": "STRANDED: 1 operation not moving (ledger only, sink readback off)",
        "violations": [],
        "stranded": [found.to_dict()],
    }
    client.post("/audit", data={"token": TOKEN}, headers=SAME_ORIGIN)
    page = client.get("/audit").text
    assert '<span class="badge fail">STRANDED</span>' in page
    items = rows(page, "open-items")
    assert "refund:c:v1" in items[0] and "stranded (committed_unverified)" in items[0]
    assert "notify:&lt;held&gt;:v1" in items[1]
