"""Run one stage with armed fault hooks: ``python -m testbed.stage COMPONENT [--instance I]``.

The testbed's way to start a stage (the harness, game days, missions and the
demo use it): the same stage an operator runs with ``ledger COMPONENT``, but
given :class:`testbed.faults.ArmedFaults`, so hooks armed under
``{run_dir}/faults/`` SIGKILL it at their seam (or, a pause hook naming this
process, ``{component}-{instance}``, SIGSTOP it there), and its ledger clock
reads shifted by the component's skew, if a game day set one. ``ledger processor`` and its
siblings never fire a hook.

It runs in a testbed, and says so: it sets ``LEDGER_TESTBED=true``, so the
stage accepts the manual ledger clock (``LEDGER_CLOCK=manual``) that demos,
game days and missions move by hand; ``ledger COMPONENT`` refuses that clock
unless the operator sets ``LEDGER_TESTBED=true`` themselves.
"""

from __future__ import annotations

import os

import click

from consumers.stages import STAGES
from ledger.cli.stages import INSTANCE_HELP, run_stage
from testbed.faults import ArmedFaults


@click.command(help=__doc__)
@click.argument("component", type=click.Choice(sorted(STAGES)))
@click.option("--instance", default=None, help=INSTANCE_HELP)
def main(component: str, instance: str | None) -> None:
    """Run COMPONENT until SIGTERM, with the run folder's fault hooks armed."""
    os.environ["LEDGER_TESTBED"] = "true"
    process = f"{component}-{instance}" if instance is not None else None
    run_stage(
        component,
        instance,
        hooks_for=lambda run_dir: ArmedFaults(run_dir, process, component),
    )


if __name__ == "__main__":
    main()
