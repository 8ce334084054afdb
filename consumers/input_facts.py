"""What the processor observes for the fold beyond an operation's own state, and what it stamps.

The fold (:func:`ledger.fold.decide`) is pure: what it needs to know of the
world outside the operation is observed here and handed to it (and
journaled with the decision, so replay decides the same):

* whether an intent's sink is registered (:meth:`InputFacts.sink_problem`,
  from the sink registry, ``LEDGER_SINKS_FILE``, re-read when it changes);
* for an intent that ``compensates`` another operation, what the ledger
  knows of the original and of its other compensations
  (:meth:`InputFacts.compensation_facts`); for a tally request, the
  original's amount (:func:`consumers.compensations.observe_tally`).

On the way out, a dispatch the fold decided is stamped with its sink's
contract version and the schema versions (:meth:`InputFacts.stamped`), and
an ordinary verification its sink cannot perform is not written at all
(:meth:`InputFacts.verification_pointless`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from confluent_kafka import Message

from consumers.compensations import observe_compensation, observe_tally
from consumers.stage import Record
from ledger.contracts import postcondition_request
from ledger.errors import LedgerError, LocalFileError
from ledger.events import CompensationTally, Dispatch, Intent, OperationState
from ledger.fold import CompensationFacts
from ledger.upgrades import schema_versions
from sinks.registry import RegistryFile

# These lines are the processor's: operators filter its log by this name.
log = logging.getLogger("consumers.processor")

#: The schema versions a dispatch's records are written with (stamped on each dispatch).
SCHEMA_VERSIONS_JSON = json.dumps(schema_versions(), sort_keys=True, separators=(",", ":"))


#: Reads every partition of ``ledger.state`` into a loader (returns records read).
StateReader = Callable[[Callable[[Record | None, Message], None]], int]


class InputFacts:
    """The processor's observations for the fold, and the stamps on its dispatches.

    Args:
        registry: the sink registry file (re-read when it changes).
        read_state: reads every partition of ``ledger.state`` into a loader.
        mine: the processor's own state of an operation, open transaction
            included (``None``: not one of its operations).
        staged: the operations decided in the processor's open transaction.
    """

    def __init__(
        self,
        registry: RegistryFile,
        read_state: StateReader,
        mine: Callable[[str], OperationState | None],
        staged: Callable[[], list[str]],
    ) -> None:
        self.registry = registry
        self._read_state = read_state
        self._mine = mine
        self._staged = staged
        self._unchecked_logged = False

    def sink_problem(self, sink: str) -> str | None:
        """Why an intent's sink cannot be used, or ``None`` (registered, or no registry).

        Args:
            sink: the sink an intent names.

        Returns:
            ``None`` when the registry names the sink, or when there is no
            registry file to check against (logged once); otherwise the
            problem, naming the file (see :meth:`RegistryFile.problem`).
        """
        if not self.registry.exists():
            if not self._unchecked_logged:
                log.warning(
                    "processor: no sink registry at %s: intents are not checked against it",
                    self.registry.path,
                )
                self._unchecked_logged = True
            return None
        return self.registry.problem(sink)

    def compensation_facts(self, intent: Intent) -> CompensationFacts:
        """What the ledger knows of the original a compensation names, and of its compensations.

        Every partition of ``ledger.state`` is read, with this processor's
        own decisions (table and open transaction, ``mine``) laid over it; see
        :func:`consumers.compensations.observe_compensation`.

        Args:
            intent: an intent whose ``compensates`` is set.

        Returns:
            The observed :class:`CompensationFacts` (``tally`` true).
        """
        return observe_compensation(
            intent, self._read_state, self._mine, self._staged(), self.registry
        )

    def verification_pointless(self, dispatch: Dispatch) -> bool:
        """Whether a dispatch is an ordinary verification its sink cannot perform.

        The relay would answer such a ``VERIFY`` with an ``UNSUPPORTED``
        postcondition readback, which changes nothing for an ordinary
        verification (the fold notes it; the operation rests in
        EFFECT_COMMITTED). The sink registry as it is now says whether the
        contract offers a postcondition query for the dispatch's parameters
        (:func:`ledger.contracts.postcondition_request`). A resume's
        verification (``on_resume``), a sink the registry does not name, and
        a registry or parameters that cannot be read all count as worth
        sending: the relay then answers as before.

        Args:
            dispatch: a dispatch the fold decided.

        Returns:
            True when the dispatch need not be written.
        """
        if dispatch.kind != "VERIFY" or dispatch.on_resume:
            return False
        try:
            endpoint = self.registry.current().get(dispatch.sink)
            params = json.loads(dispatch.params_json)
        except (LedgerError, ValueError):
            return False
        if endpoint is None or not isinstance(params, dict):
            return False
        return not postcondition_request(endpoint.contract, params).offered

    def stamped(self, dispatch: Dispatch) -> Dispatch:
        """The dispatch with its sink's contract version and the schema versions it is written with.

        The fold decides the dispatch; the version comes from the sink
        registry as it is now (the relay checks a resume under another
        version against the release manifest, :mod:`ledger.upgrades`). A
        sink the registry does not name, or a registry that cannot be read,
        leaves ``contract_version`` unset (the relay reads it as version 1).

        Args:
            dispatch: a dispatch the fold decided.

        Returns:
            A copy with ``contract_version`` and ``schema_versions_json`` set.
        """
        try:
            endpoint = self.registry.current().get(dispatch.sink)
        except LocalFileError:
            endpoint = None
        return dispatch.model_copy(
            update={
                "contract_version": endpoint.contract_version if endpoint else None,
                "schema_versions_json": SCHEMA_VERSIONS_JSON,
            }
        )

    def observed(self, event: object, state: OperationState | None) -> CompensationFacts | None:
        """What the fold needs observed for a new compensation, or for a tally request.

        Args:
            event: the input about to be decided.
            state: the operation's state before it (``None``: a new operation).

        Returns:
            The observed :class:`CompensationFacts` for a new intent that
            compensates another operation (read from ``ledger.state``) or for
            a tally request (its original's amount); ``None`` for any other input.
        """
        if isinstance(event, Intent) and event.compensates is not None and state is None:
            return self.compensation_facts(event)
        if isinstance(event, CompensationTally) and event.kind == "REQUEST" and state is not None:
            return observe_tally(state, self.registry)
        return None
