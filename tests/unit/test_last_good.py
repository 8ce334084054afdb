"""A running stage keeps the last good content of a corrupted local file (issue 11, item 8)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from consumers.localfiles import LastGood, LastGoodClock
from ledger.clock import ManualClock
from ledger.contracts import PAYMENT_GATEWAY
from ledger.errors import LocalFileError, SinkNotReachedError
from ledger.signing import ReviewerKey, load_trusted, trust
from sinks.registry import SinkEndpoint, load_sinks, save_sinks
from tests.helpers import keyed


def registry(tmp_path: Path) -> tuple[Path, LastGood[dict[str, SinkEndpoint]], list[str]]:
    path = tmp_path / "sinks.json"
    problems: list[str] = []
    file = LastGood(
        "sink registry",
        lambda: load_sinks(path),
        component="test",
        on_problem=lambda exc: problems.append(exc.message),
        retry_s=0,
    )
    return path, file, problems


def test_a_corrupted_registry_keeps_the_last_good_content_and_reports_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, file, problems = registry(tmp_path)
    good = {"payments": SinkEndpoint(url="http://127.0.0.1:9", contract=PAYMENT_GATEWAY)}
    save_sinks(path, good)
    assert file.read() == good and file.problem is None

    path.write_text('{"payments": {"url": 1')
    with caplog.at_level(logging.ERROR):
        assert file.read() == good
        assert file.read() == good
    assert len(problems) == 1 and "sink registry" in problems[0] and str(path) in problems[0]
    assert file.problem == problems[0]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "keeping the content last read well" in errors[0]

    path.write_text("[]")  # another problem: reported again
    assert file.read() == good and len(problems) == 2

    fixed = {"mailer": SinkEndpoint(url="http://127.0.0.1:10", contract=PAYMENT_GATEWAY)}
    save_sinks(path, fixed)
    assert file.read() == fixed and file.problem is None


def test_a_file_corrupted_before_any_good_read_raises_from_read(tmp_path: Path) -> None:
    path, file, problems = registry(tmp_path)
    path.write_text("{")
    with pytest.raises(LocalFileError, match="sink registry"):
        file.read()
    assert not file.loaded and len(problems) == 1


def test_at_start_a_stage_waits_for_the_file_instead_of_dying(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The loader fails twice (the file is being repaired), then reads well."""
    path = tmp_path / "trusted_keys.json"
    path.write_text("{garbage")
    key = ReviewerKey.generate("alice")
    attempts: list[int] = []

    def load() -> object:
        attempts.append(1)
        if len(attempts) == 3:  # the operator restores the file
            path.unlink()
            trust(path, key)
        return load_trusted(path)

    file = LastGood("trusted-keys file", load, component="test", retry_s=0)
    with caplog.at_level(logging.ERROR):
        keys = file.wait()
    assert len(attempts) == 3 and keys is not None and set(keys) == {"alice"}
    (logged,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "trusted-keys file" in logged and "ledger reviewer add" in logged
    assert "waiting for it" in logged


def test_a_wait_ends_when_the_stage_is_stopping(tmp_path: Path) -> None:
    path, file, _ = registry(tmp_path)
    path.write_text("{")
    asked: list[int] = []

    def stopping() -> bool:
        asked.append(1)
        return len(asked) >= 2

    assert file.wait(stopping) is None and len(asked) == 2


def test_the_clock_stands_at_its_last_good_time_and_never_goes_back(tmp_path: Path) -> None:
    manual = ManualClock(tmp_path / "clock")
    problems: list[LocalFileError] = []
    clock = LastGoodClock(manual, component="test", on_problem=problems.append)
    manual.advance(5)
    assert clock.now_ms() == 5000
    (tmp_path / "clock").write_text("five")
    assert clock.now_ms() == 5000 and len(problems) == 1
    manual.set_ms(3000)  # someone writes an earlier time
    assert clock.now_ms() == 5000
    manual.set_ms(9000)
    assert clock.now_ms() == 9000 and clock.file.problem is None


# --------------------------------------------------------------------- the relay


def test_the_relay_keeps_its_sinks_and_clock_through_a_corruption(tmp_path: Path) -> None:
    from consumers.relay import Relay
    from ledger.settings import LedgerSettings
    from tests.unit.test_relay_containment import _dispatch

    relay = Relay(keyed(LedgerSettings(run_dir=tmp_path, clock="manual")))
    endpoint = SinkEndpoint(url="http://127.0.0.1:9", contract=PAYMENT_GATEWAY)
    save_sinks(tmp_path / "sinks.json", {"payments": endpoint})
    ManualClock(tmp_path / "clock").set_ms(7000)
    relay.on_start()
    assert relay.sinks.endpoint("payments") == endpoint and relay.clock.now_ms() == 7000

    (tmp_path / "sinks.json").write_text("{")
    (tmp_path / "clock").write_text("later")
    assert relay.sinks.endpoint("payments") == endpoint
    assert relay.sinks.endpoint("mailer") is None  # not known before the corruption
    assert relay.clock.now_ms() == 7000
    assert sorted(e.kind for _, e in relay.notes.pending) == ["LOCAL_FILE", "LOCAL_FILE"]
    # A sink the last good registry does not name is not reached: the relay
    # parks the dispatch (retried with backoff), naming the registry's problem.
    with pytest.raises(SinkNotReachedError, match="unreadable"):
        relay.dispatcher.perform(
            _dispatch("EXECUTE").model_copy(update={"sink": "mailer"}), fresh=True
        )


def test_a_relay_stopped_while_waiting_for_its_registry_ends_without_an_error(
    tmp_path: Path,
) -> None:
    """It waits (see the wait test above) rather than raising; a stop ends the wait."""
    from consumers.relay import Relay
    from ledger.settings import LedgerSettings

    (tmp_path / "sinks.json").write_text("[")
    relay = Relay(keyed(LedgerSettings(run_dir=tmp_path)))
    relay.stopping = True  # SIGTERM arrived while it waited
    relay.on_start()
    assert not relay.sinks.last_good.loaded and relay.sinks.last_good.problem is not None
