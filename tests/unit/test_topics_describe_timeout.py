"""Reading topic configs that get no answer in time (a failover) is a retriable error."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from consumers.retry import is_retriable
from ledger.errors import BrokerUnavailableError
from ledger.topics.admin import read_configs


class SilentAdmin:
    """An admin client whose config reads never complete."""

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Any]:
        return {r: Future() for r in resources}


def test_a_config_read_without_an_answer_is_a_retriable_broker_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("ledger.topics.admin.ADMIN_TIMEOUT_S", 0.01)
    with pytest.raises(BrokerUnavailableError, match="no answer") as caught:
        read_configs(SilentAdmin(), ["p.intents"])  # type: ignore[arg-type]
    assert is_retriable(caught.value)
