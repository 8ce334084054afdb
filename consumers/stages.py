"""The stages an operator runs, by component name (``ledger processor`` ...)."""

from __future__ import annotations

from consumers.authority import AuthorityKernel
from consumers.processor import Processor
from consumers.relay import Relay
from consumers.stage import Stage

#: component name -> stage class; each runs as its own process.
STAGES: dict[str, type[Stage]] = {
    "processor": Processor,
    "authority": AuthorityKernel,
    "relay": Relay,
}
