"""The error hierarchy: every deliberate error is a LedgerError, and retryable
only where trying again later can succeed; the sink client translates
transport failures into it once and keeps its result values."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import click
import httpx
import pytest

import consumers
import ledger
import ledger.errors as errors
import producers
import sinks
import testbed
from ledger.errors import (
    AccessPlanError,
    BrokerError,
    BrokerUnavailableError,
    ConsumerStuckError,
    CredentialError,
    DecodeError,
    DeliveryUnknownError,
    ForbiddenTransitionError,
    InputBoundsError,
    InvalidInputError,
    InvalidStateError,
    LedgerError,
    LocalFileError,
    MissingExtraError,
    OperationEndedElsewhereError,
    OperationExistsError,
    ParameterDriftError,
    PublishError,
    SchemaError,
    SchemaValidationError,
    ScopeNotBoundError,
    SettingsError,
    SinkAuthError,
    SinkConfigError,
    SinkError,
    SinkNotReachedError,
    SinkProtocolError,
    SinkUnavailableError,
    TopicConfigError,
    UnknownSchemaError,
    WaitError,
    WaitTimeoutError,
)
from sinks.client import SinkClient
from testbed import errors as testbed_errors
from testbed.errors import ScenarioError, SinkStartError, SinkStoreError
from testbed.sinks.admin import ReferenceSinkClient

#: Every error class of ledger.errors -> retryable (trying again, unchanged,
#: can succeed). A new class must be added here, with a decision.
RETRYABLE: dict[type[LedgerError], bool] = {
    LedgerError: False,
    BrokerError: False,  # missing tools, busy ports, failed formats: fix first
    BrokerUnavailableError: True,  # no answer (yet): the broker may be restarting
    ConsumerStuckError: True,  # a new consumer asks afresh
    DeliveryUnknownError: True,  # publishing the same operation again is safe and tells
    TopicConfigError: False,
    SettingsError: False,  # change the setting first
    MissingExtraError: False,  # install the extra first
    SchemaError: False,
    UnknownSchemaError: False,
    SchemaValidationError: False,
    DecodeError: False,
    ParameterDriftError: False,
    LocalFileError: False,  # fix or remove the file first
    InputBoundsError: False,  # the same input is refused again: change it
    ForbiddenTransitionError: False,
    InvalidInputError: False,  # the same argument is refused again: change it
    OperationExistsError: False,  # choose another operation ID
    InvalidStateError: False,  # the state must change first (by the ledger or a person)
    CredentialError: False,  # make, trust or point at the right key first
    AccessPlanError: False,  # fix the mapping or the quota spec
    PublishError: False,  # the broker refused it: read its error (size, authorization)
    ScopeNotBoundError: False,  # bind the field, or open it on purpose
    SinkError: False,
    SinkConfigError: False,  # the registry entry is wrong: fix it, then it is used
    SinkUnavailableError: True,  # no answer: the sink may be down or restarting
    SinkProtocolError: False,  # the request or the URL is wrong
    SinkAuthError: False,  # the registry's token is not the sink's: fix it first
    SinkNotReachedError: True,  # the request never left: sending it again is safe
    WaitError: False,
    OperationEndedElsewhereError: False,  # it rests there until a person acts
    WaitTimeoutError: True,  # waiting again can see the state come
}

#: The testbed's own errors (testbed.errors), decided the same way.
TESTBED_RETRYABLE: dict[type[LedgerError], bool] = {
    ScenarioError: False,
    SinkStoreError: False,  # another sink's database, a newer schema
    SinkStartError: False,  # the message quotes the sink's log: read it first
}


def _defined_in(module: object) -> set[type[BaseException]]:
    return {
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == getattr(module, "__name__", "")
    }


@pytest.mark.parametrize(
    ("module", "decided"), [(errors, RETRYABLE), (testbed_errors, TESTBED_RETRYABLE)]
)
def test_every_error_class_is_a_ledger_error_with_a_retryable_decision(
    module: object, decided: dict[type[LedgerError], bool]
) -> None:
    defined = _defined_in(module)

    assert defined == set(decided), "add new error classes to RETRYABLE, with a decision"
    for cls in defined:
        assert issubclass(cls, LedgerError), cls
        assert isinstance(cls.retryable, bool), cls
        assert cls.retryable is decided[cls], f"{cls.__name__}.retryable"
        assert cls.__doc__, f"{cls.__name__} needs a docstring"


def test_no_module_of_the_ledger_or_the_sinks_defines_an_error_outside_the_hierarchy() -> None:
    strays = []
    for package in (ledger, consumers, producers, sinks, testbed):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name.endswith("__main__"):
                continue  # running it would start the command
            module = importlib.import_module(info.name)
            strays += [
                f"{info.name}.{cls.__name__}"
                for cls in _defined_in(module)
                # A CLI's way of saying a LedgerError is click's, not a new error.
                if not issubclass(cls, (LedgerError, click.ClickException))
            ]
    assert strays == [], (
        "define errors in ledger/errors.py (or testbed/errors.py) under LedgerError"
    )


def test_former_names_still_import() -> None:
    from sinks.client import SinkClientError, SinkUnreachableError
    from sinks.client import SinkProtocolError as FromClient
    from testbed.scenario import ScenarioError as FromScenario
    from testbed.sinks.process import SinkStartError as FromProcess
    from testbed.sinks.store import StoreError

    assert FromScenario is ScenarioError
    assert SinkClientError is SinkError
    assert SinkUnreachableError is SinkUnavailableError
    assert FromClient is SinkProtocolError
    assert FromProcess is SinkStartError
    assert StoreError is SinkStoreError


def _client(handler: httpx.MockTransport) -> SinkClient:
    return SinkClient("http://sink.test", timeout_s=0.5, transport=handler)


def _failing(exc: type[httpx.TransportError]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc("boom", request=request)

    return httpx.MockTransport(handler)


def test_no_answer_to_an_admin_call_is_a_retryable_sink_error_chained_to_httpx() -> None:
    admin = ReferenceSinkClient(
        "http://sink.test", timeout_s=0.5, transport=_failing(httpx.ConnectError)
    )
    with admin as client, pytest.raises(LedgerError) as caught:
        client.effects()

    assert isinstance(caught.value, SinkUnavailableError)
    assert caught.value.retryable
    assert caught.value.sink == "http://sink.test"
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert "is the sink running?" in caught.value.message


@pytest.mark.parametrize(
    ("exc", "status"),
    [(httpx.ConnectError, "unavailable"), (httpx.ReadTimeout, "ambiguous")],
)
def test_effect_calls_still_return_values_on_transport_failures(
    exc: type[httpx.TransportError], status: str
) -> None:
    with _client(_failing(exc)) as client:
        submitted = client.submit("refund:1", "d" * 64, {}, 1, "a1", use_key=True)
        read = client.readback("refund:1", 1)

    assert submitted.status == status
    assert read.status == "ambiguous"


@pytest.mark.parametrize("code", [400, 404, 413, 422])
def test_a_refusal_of_a_submit_is_a_definite_rejection(code: int) -> None:
    """A sink's 4xx on submit made no effect: a rejection, never an exception."""
    transport = httpx.MockTransport(lambda request: httpx.Response(code, text="no"))
    with _client(transport) as client:
        result = client.submit("refund:1", "", {}, 1, "a1", use_key=True)
    assert (result.status, result.http_status, result.detail) == ("rejected", code, "no")


def test_an_answer_outside_the_protocol_is_a_structured_protocol_error() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(302, text="moved"))
    with _client(transport) as client, pytest.raises(SinkProtocolError) as caught:
        client.submit("refund:1", "", {}, 1, "a1", use_key=True)

    error = caught.value
    assert (error.method, error.path, error.http_status, error.body) == (
        "POST",
        "/operations",
        302,
        "moved",
    )
    assert (error.sink, error.operation_id, error.observed) == ("http://sink.test", "refund:1", 302)
    assert not error.retryable


def test_every_call_carries_the_registry_token_as_a_bearer_token() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(404, json={"status": "absent"})

    transport = httpx.MockTransport(handler)
    with SinkClient("http://sink.test", token="s3cret-token-value", transport=transport) as c:
        c.readback("refund:1", 1)
        c.submit("refund:1", "d", {}, 1, "a1", use_key=True)
    with SinkClient("http://sink.test", transport=transport) as c:
        c.readback("refund:1", 1)
    assert seen == ["Bearer s3cret-token-value", "Bearer s3cret-token-value", None]


@pytest.mark.parametrize("code", [401, 403])
def test_a_refused_token_is_a_configuration_error_naming_the_sink_and_the_remedy(
    code: int,
) -> None:
    """Never a rejection of the operation: the sink did not look at the request."""
    transport = httpx.MockTransport(
        lambda request: httpx.Response(code, json={"error": "invalid_token"})
    )
    calls = {
        "submit": lambda c: c.submit("refund:1", "d", {}, 1, "a1", use_key=True),
        "readback": lambda c: c.readback("refund:1", 1),
        "account": lambda c: c.account("acct-1"),
        "admin": lambda c: c.effects(),
    }
    for name, call in calls.items():
        with (
            ReferenceSinkClient("http://sink.test", transport=transport) as client,
            pytest.raises(SinkAuthError) as caught,
        ):
            call(client)
        error = caught.value
        assert isinstance(error, SinkError) and not error.retryable, name
        assert error.http_status == code and error.sink == "http://sink.test"
        assert "sinks.json" in error.message and "token" in error.message
    assert caught.value.operation_id is None  # the admin call names none
