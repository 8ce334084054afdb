"""Run one stage with armed fault hooks: ``python -m testbed.stage COMPONENT [--instance I]``.

The testbed's way to start a stage (the harness, game days, missions and the
demo use it): the same stage an operator runs with ``ledger COMPONENT``, but
given :class:`testbed.faults.ArmedFaults`, so hooks armed under
``{run_dir}/faults/`` SIGKILL it at their seam. ``ledger processor`` and its
siblings never fire a hook.
"""

from __future__ import annotations

import click

from consumers.stages import STAGES
from ledger.cli.stages import run_stage
from testbed.faults import ArmedFaults


@click.command(help=__doc__)
@click.argument("component", type=click.Choice(sorted(STAGES)))
@click.option("--instance", default="0", show_default=True, help="Instance name.")
def main(component: str, instance: str) -> None:
    """Run COMPONENT until SIGTERM, with the run folder's fault hooks armed."""
    run_stage(component, instance, hooks_for=ArmedFaults)


if __name__ == "__main__":
    main()
