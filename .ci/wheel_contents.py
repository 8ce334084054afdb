"""Check what the two wheels carry: the product none of the testbed, the testbed itself whole.

Run by ``make wheel-check`` after it builds both wheels::

    python .ci/wheel_contents.py PRODUCT.whl TESTBED.whl

The product's wheel (``kafka-recovery-ledger``) must hold no ``testbed``
module: a service that only publishes intents installs none of it. The
testbed's wheel (``kafka-recovery-ledger-testbed``) must hold the ``testbed``
package with its package data (the broker's Maven file, the report
templates), the ``ledger.cli`` entry point that adds its commands, and none
of the product's packages (it depends on the product instead).

Exits 0 when both are right; otherwise 1, after one line per fault naming it.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

#: Top-level packages of the product; the testbed's wheel must carry none.
PRODUCT_PACKAGES = ("ledger", "consumers", "producers", "sinks", "schemas")

#: Files the testbed's wheel cannot work without (data files included).
TESTBED_REQUIRED = (
    "testbed/__init__.py",
    "testbed/cli.py",
    "testbed/mission/report.py",
    "testbed/kafka/pom.xml",
    "testbed/templates/mission.html.j2",
)


def faults(product: Path, testbed: Path) -> list[str]:
    """What is wrong with the two wheels, one sentence each (empty: nothing).

    Args:
        product: the product's wheel file.
        testbed: the testbed's wheel file.

    Returns:
        One message per fault, naming the file and what to change.
    """
    found: list[str] = []
    product_names = zipfile.ZipFile(product).namelist()
    carried = sorted(n for n in product_names if n.split("/", 1)[0] == "testbed")
    if carried:
        found.append(
            f"{product.name} carries testbed files ({', '.join(carried[:3])}, ...): "
            "leave testbed* out of pyproject.toml's [tool.setuptools.packages.find]"
        )
    testbed_names = zipfile.ZipFile(testbed).namelist()
    for name in TESTBED_REQUIRED:
        if name not in testbed_names:
            found.append(f"{testbed.name} lacks {name}: see testbed/pyproject.toml")
    foreign = sorted({n.split("/", 1)[0] for n in testbed_names} & set(PRODUCT_PACKAGES))
    if foreign:
        found.append(f"{testbed.name} carries product packages {foreign}: it must depend on them")
    entry_points = [n for n in testbed_names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(testbed).read(entry_points[0]).decode() if entry_points else ""
    if "[ledger.cli]" not in text or "testbed.cli:COMMANDS" not in text:
        found.append(f"{testbed.name} lacks its ledger.cli entry point (testbed.cli:COMMANDS)")
    return found


def main(argv: list[str]) -> int:
    """Check the wheels named on the command line; say each fault on stderr."""
    if len(argv) != 2:
        print("usage: python .ci/wheel_contents.py PRODUCT.whl TESTBED.whl", file=sys.stderr)
        return 2
    found = faults(Path(argv[0]), Path(argv[1]))
    for message in found:
        print(f"wheel check: {message}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
