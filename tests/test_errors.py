"""The error hierarchy: every deliberate error is a LedgerError, and retryable
only where trying again later can succeed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import ledger
import ledger.errors as errors
from ledger.errors import (
    BrokerError,
    BrokerUnavailableError,
    DecodeError,
    ForbiddenTransitionError,
    LedgerError,
    ParameterDriftError,
    ScenarioError,
    SchemaError,
    SchemaValidationError,
    TopicConfigError,
    UnknownSchemaError,
)

#: Every error class of ledger.errors -> retryable (trying again, unchanged,
#: can succeed). A new class must be added here, with a decision.
RETRYABLE: dict[type[LedgerError], bool] = {
    LedgerError: False,
    BrokerError: False,  # missing tools, busy ports, failed formats: fix first
    BrokerUnavailableError: True,  # no answer (yet): the broker may be restarting
    TopicConfigError: False,
    SchemaError: False,
    UnknownSchemaError: False,
    SchemaValidationError: False,
    DecodeError: False,
    ParameterDriftError: False,
    ForbiddenTransitionError: False,
    ScenarioError: False,
}


def _defined_in(module: object) -> set[type[BaseException]]:
    return {
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == getattr(module, "__name__", "")
    }


def test_every_error_in_ledger_errors_is_a_ledger_error_with_a_retryable_decision() -> None:
    defined = _defined_in(errors)

    assert defined == set(RETRYABLE), "add new error classes to RETRYABLE, with a decision"
    for cls in defined:
        assert issubclass(cls, LedgerError), cls
        assert isinstance(cls.retryable, bool), cls
        assert cls.retryable is RETRYABLE[cls], f"{cls.__name__}.retryable"  # type: ignore[index]
        assert cls.__doc__, f"{cls.__name__} needs a docstring"


def test_no_module_of_the_ledger_defines_an_error_outside_the_hierarchy() -> None:
    strays = []
    for package in (ledger,):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            strays += [
                f"{info.name}.{cls.__name__}"
                for cls in _defined_in(module)
                if not issubclass(cls, LedgerError)
            ]
    assert strays == [], "define errors in ledger/errors.py under LedgerError"


def test_scenario_error_keeps_its_old_home() -> None:
    from ledger.scenario import ScenarioError as FromScenario

    assert FromScenario is ScenarioError
