"""Riding out retriable Kafka errors and broker outages: one classification, one policy.

Every stage, table follower and topic reader sends its Kafka calls that can
meet a broker outage or a failover (``committed``, ``get_watermark_offsets``,
``list_topics``, ``init_transactions``, ``commit_transaction``,
``send_offsets_to_transaction``, the start-up topic check) through a
:class:`KafkaRetry`, which

* classifies the error once (:func:`ledger.kafka.classify`): **retriable** (the broker or a
  coordinator is away or moving: ``_TRANSPORT``, ``_ALL_BROKERS_DOWN``,
  ``_TIMED_OUT``, ``NOT_COORDINATOR``, ``COORDINATOR_LOAD_IN_PROGRESS``,
  ``LEADER_NOT_AVAILABLE``, ``NOT_LEADER_FOR_PARTITION``,
  ``REQUEST_TIMED_OUT`` ... or anything librdkafka flags retriable),
  **abortable** (the open transaction must be aborted and the batch redone
  from the committed position) or **fatal** (fenced, not authorised, unknown
  topic, a fatal producer error, anything else: the caller's own handling);
* retries a retriable error with exponential backoff and full jitter
  (``tenacity``), bounded between tries (:attr:`RetryPolicy.max_wait_s`),
  for as long as the policy allows: a stage waits indefinitely (until it is
  told to stop), a command for at least ``LEDGER_TAKEOVER_WAIT_S``;
* logs one WARNING when an outage begins and one line when Kafka answers
  again (with how long it took), and tells the stage (``on_change``) so its
  status file shows it waiting.

Errors a call raises that are not retriable pass through unchanged, at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import KafkaException
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    stop_never,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from ledger.errors import BrokerError, BrokerUnavailableError, LedgerError
from ledger.kafka import classify, kafka_error
from ledger.settings import LedgerSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a read may see no progress before it checks that Kafka answers
#: (waiting out an outage) and replaces its client, which can stay stuck after
#: a broker restart.
STALL_S = 10.0


def is_retriable(exc: BaseException) -> bool:
    """True when ``exc`` is worth riding out: a retriable Kafka error, or Kafka not answering.

    A :class:`~ledger.errors.BrokerUnavailableError` (no answer to the
    start-up check) and a ``TimeoutError`` (an admin request's future not
    answered in time) are retriable; so is a :class:`~ledger.errors.BrokerError`
    caused by a retriable Kafka error. A ``KafkaException`` is retriable when
    :func:`classify` says so. Anything else is not.
    """
    if isinstance(exc, BrokerUnavailableError | TimeoutError):
        # TimeoutError: an admin request's future not answered in time (the
        # start-up topic check while the broker restarts).
        return True
    if not isinstance(exc, KafkaException | BrokerError):
        return False
    err = kafka_error(exc)
    return err is not None and classify(err) == "retriable"


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff between tries of a retriable call, and how long to keep trying.

    The n-th wait is uniform in ``[0, min(max_wait_s, first_wait_s * 2**n)]``
    (exponential backoff with full jitter).

    Attributes:
        first_wait_s: scale of the first wait (seconds).
        max_wait_s: longest wait between two tries (seconds).
        give_up_after_s: stop retrying once this many seconds have passed
            since the first failure and re-raise the last error; ``None``:
            never (a stage rides out any outage; it stops only when told to).
    """

    first_wait_s: float = 0.25
    max_wait_s: float = 5.0
    give_up_after_s: float | None = None


def policy_for(settings: LedgerSettings, *, indefinitely: bool) -> RetryPolicy:
    """The retry policy of a stage (``indefinitely``) or of a command.

    Args:
        settings: uses ``takeover_wait_s``.
        indefinitely: a stage's policy (never give up); else give up after
            ``LEDGER_TAKEOVER_WAIT_S`` seconds (at least 1).

    Returns:
        The policy.
    """
    if indefinitely:
        return RetryPolicy()
    return RetryPolicy(give_up_after_s=max(1.0, float(settings.takeover_wait_s)))


class _stop_if(stop_base):
    def __init__(self, predicate: Callable[[], bool]) -> None:
        self.predicate = predicate

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.predicate()


class KafkaRetry:
    """One component's way through retriable errors: backoff, one warning per outage.

    Args:
        name: who waits, for the log (``relay-0``, ``ledger.approvals reader``).
        policy: backoff and give-up time.
        should_stop: polled between tries; when true the wait ends, raising
            the last error (a stage that got SIGTERM: it checks its own flag).
        on_change: called with :attr:`waiting` whenever an outage begins or
            ends (a stage rewrites its status file).
        sleep: how to wait (tests pass a fake).

    Attributes:
        waited_s: seconds spent in calls that met a retriable error, from the
            call to its end (callers with deadlines do not count this time
            against them).
        outages: outages seen so far.
    """

    def __init__(
        self,
        name: str,
        policy: RetryPolicy,
        *,
        should_stop: Callable[[], bool] = lambda: False,
        on_change: Callable[[dict[str, Any] | None], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = name
        self.policy = policy
        self.should_stop = should_stop
        self.on_change = on_change
        self._sleep = sleep
        self.waited_s = 0.0
        self.outages = 0
        self._since: float | None = None
        self._since_wall: float | None = None
        self._what = ""
        self._error = ""

    @property
    def down(self) -> bool:
        """True while an outage is in progress (a retriable error not yet followed by success)."""
        return self._since is not None

    @property
    def waiting(self) -> dict[str, Any] | None:
        """What the component waits for, or ``None``.

        Returns:
            ``{"for": what, "error": text, "since": unix time (s)}`` during an
            outage.
        """
        if self._since is None:
            return None
        return {"for": self._what, "error": self._error, "since": self._since_wall}

    def failed(self, what: str, err: object) -> None:
        """Note a retriable failure: the first of an outage is logged at WARNING.

        Args:
            what: the call or activity that failed (``committed offsets``).
            err: the error (its text goes into the log and the status).
        """
        if self._since is not None:
            log.debug("%s: still waiting for Kafka (%s): %s", self.name, what, err)
            return
        self._since = time.monotonic()
        self._since_wall = time.time()
        self._what, self._error = what, str(err)
        self.outages += 1
        give_up = self.policy.give_up_after_s
        log.warning(
            "%s: Kafka unreachable or busy (%s: %s); waiting for it with backoff "
            "(at most %.0f s between tries, %s)",
            self.name,
            what,
            err,
            self.policy.max_wait_s,
            "until it answers" if give_up is None else f"for {give_up:.0f} s",
        )
        if self.on_change is not None:
            self.on_change(self.waiting)

    def recovered(self) -> None:
        """Note a success: an outage in progress ends, with one log line."""
        if self._since is None:
            return
        took = time.monotonic() - self._since
        log.info(
            "%s: Kafka answers again after %.1f s (%s); carrying on", self.name, took, self._what
        )
        self._since = None
        self._since_wall = None
        if self.on_change is not None:
            self.on_change(None)

    def no_answer(self, what: str, exc: BaseException) -> LedgerError:
        """The error to raise when this policy gave up on a Kafka that does not answer.

        Args:
            what: what could not be read or done (a topic, a call).
            exc: the last retriable error.

        Returns:
            A :class:`~ledger.errors.LedgerError` naming the wait and the error.
        """
        err = kafka_error(exc) or exc
        limit = self.policy.give_up_after_s or 0.0
        return LedgerError(
            f"{what}: Kafka did not answer for {limit:.0f} s ({err}); is the broker up?",
            observed=str(err),
        )

    def call(
        self,
        fn: Callable[[], T],
        what: str,
        *,
        give_up_after_s: float | None = None,
        between: Callable[[int], None] | None = None,
    ) -> T:
        """Call ``fn``, riding out retriable errors (see :func:`is_retriable`).

        Args:
            fn: the Kafka call (no arguments; bind them with a lambda).
            what: what it does, for the log and the status.
            give_up_after_s: overrides the policy's give-up time for this call.
            between: called with the number of failed tries before each wait
                (e.g. to replace a client that may be stuck).

        Returns:
            What ``fn`` returns.

        Raises:
            Exception: a non-retriable error of ``fn`` at once; the last
                retriable one once the give-up time has passed or
                ``should_stop`` said to stop.
        """
        limit = self.policy.give_up_after_s if give_up_after_s is None else give_up_after_s
        failures: list[bool] = []

        def before_sleep(retry_state: RetryCallState) -> None:
            outcome = retry_state.outcome
            err = outcome.exception() if outcome is not None else None
            failures.append(True)
            self.failed(what, (kafka_error(err) or err) if err is not None else None)
            if between is not None:
                between(retry_state.attempt_number)

        retrying = Retrying(
            retry=retry_if_exception(is_retriable),
            wait=wait_random_exponential(
                multiplier=self.policy.first_wait_s, max=self.policy.max_wait_s
            ),
            stop=(stop_never if limit is None else stop_after_delay(limit))
            | _stop_if(self.should_stop),
            before_sleep=before_sleep,
            sleep=self._sleep,
            reraise=True,
        )
        started = time.monotonic()
        try:
            result = retrying(fn)
        except KafkaException as exc:
            if not is_retriable(exc):
                # Kafka answered (with a refusal): the outage is over, whatever
                # the caller makes of the answer. Left open, ``waiting`` would
                # stay in the status file and keep the fetch-stall check off.
                self.recovered()
            raise
        finally:
            if failures:
                self.waited_s += time.monotonic() - started
        self.recovered()
        return result
