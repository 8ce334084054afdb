"""One far-future clock reading does not latch the authority kernel (issue 26, item 4).

The attack: write 2^62 ms into the manual ledger clock file while the kernel
runs. Before, the kernel kept the largest reading it had seen as "now", so
every later approval was refused as expired until it restarted, and nothing
mentioned the clock. Now the reading is refused (a ``CLOCK_REFUSED``
operating event, ``ledger_clock_readings_refused_total``), the kernel keeps
deciding with its last good time, and the next sane reading is accepted.
"""

from __future__ import annotations

import pytest

from consumers.reader import read_topic
from ledger.events import OperatingEvent
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher
from tests.integration.test_local_files import (
    _decisions,
    _kernel,
    _register_payments,
    _request,
)
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration

FAR_MS = 2**62


def test_a_far_future_reading_is_refused_reported_and_does_not_latch(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    _register_payments(settings)
    clock = settings.run_dir / "clock"
    clock.write_text("1000")
    pub = LedgerPublisher(settings)
    try:
        for approval in ("ap-before", "ap-glitch", "ap-after"):
            approve(pub, approval)  # each expires at 1,000,000 ms
        with _kernel(settings) as (kernel, thread):
            _request(settings, "ap-before", "refund:before:v1")
            assert _decisions(settings, 1, 60.0)["refund:before:v1"].admitted

            clock.write_text(str(FAR_MS))  # one far-future reading
            _request(settings, "ap-glitch", "refund:glitch:v1")
            glitch = _decisions(settings, 2, 60.0)["refund:glitch:v1"]
            assert (glitch.admitted, glitch.reason, glitch.evaluated_at_ms) == (
                True,
                "admitted",
                1000,
            ), glitch

            clock.write_text("2000")  # sane again: accepted, no restart
            _request(settings, "ap-after", "refund:after:v1")
            after = _decisions(settings, 3, 60.0)["refund:after:v1"]
            assert (after.admitted, after.reason, after.evaluated_at_ms) == (
                True,
                "admitted",
                2000,
            ), after
            assert thread.is_alive()
            refused = kernel.metrics.registry.get_sample_value(
                "ledger_clock_readings_refused_total", {"stage": "authority", "clock": "manual"}
            )
            assert refused is not None and refused >= 1
        reported = [
            r.event
            for r in read_topic(settings, "operating-events")
            if isinstance(r.event, OperatingEvent) and r.event.kind == "CLOCK_REFUSED"
        ]
        assert len(reported) == 1, reported
        assert str(FAR_MS) in reported[0].reason and "1000 ms" in reported[0].reason
    finally:
        pub.close()
