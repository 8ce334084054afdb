"""The testbed is a distribution of its own; the product's carries none of it.

``pyproject.toml`` (``kafka-recovery-ledger``) packages the product only and
names no testbed, in its packages, extras or entry points;
``testbed/pyproject.toml`` (``kafka-recovery-ledger-testbed``) packages every
``testbed`` subpackage with its data and adds its commands to ``ledger``
through the ``ledger.cli`` entry point. ``make wheel-check`` builds both
wheels and checks their contents (``.ci/wheel_contents.py``); these tests
check the configuration they are built from, and the check itself.
"""

from __future__ import annotations

import sys
import tomllib
import zipfile
from importlib.metadata import distribution
from pathlib import Path

from tests.helpers import PROJECT_ROOT

PRODUCT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
TESTBED = tomllib.loads((PROJECT_ROOT / "testbed" / "pyproject.toml").read_text())
TESTBED_DIR = PROJECT_ROOT / "testbed"

sys.path.insert(0, str(PROJECT_ROOT / ".ci"))
import wheel_contents  # noqa: E402  (a script of .ci/, not a package)


def _subpackages() -> list[str]:
    """Every ``testbed`` package on disk (folders with an ``__init__.py``)."""
    return sorted(
        ".".join(("testbed", *init.parent.relative_to(TESTBED_DIR).parts))
        for init in TESTBED_DIR.rglob("__init__.py")
        if "build" not in init.relative_to(TESTBED_DIR).parts
    )


def test_the_product_packages_no_testbed_and_offers_no_testbed_extra() -> None:
    include = PRODUCT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not [p for p in include if p.startswith("testbed")], include
    assert "testbed" not in PRODUCT["tool"]["setuptools"].get("package-data", {})
    extras = PRODUCT["project"]["optional-dependencies"]
    assert "testbed" not in extras
    every_requirement = [*PRODUCT["project"]["dependencies"], *sum(extras.values(), [])]
    assert not [r for r in every_requirement if "testbed" in r], "the product needs no testbed"
    assert "ledger.cli" not in PRODUCT["project"].get("entry-points", {})


def test_the_testbed_packages_every_subpackage_with_its_data() -> None:
    setuptools = TESTBED["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"testbed": "."}
    assert sorted(setuptools["packages"]) == _subpackages()
    for pattern in setuptools["package-data"]["testbed"]:
        assert list(TESTBED_DIR.glob(pattern)), f"package data {pattern} matches no file"


def test_the_testbed_depends_on_the_product_at_its_version_and_adds_its_commands() -> None:
    project = TESTBED["project"]
    pinned = f"=={PRODUCT['project']['version']}"
    (product,) = [d for d in project["dependencies"] if d.startswith("kafka-recovery-ledger[")]
    assert product.endswith(pinned), product
    assert project["entry-points"]["ledger.cli"] == {"testbed": "testbed.cli:COMMANDS"}
    installed = distribution("kafka-recovery-ledger-testbed").entry_points
    assert [e.value for e in installed if e.group == "ledger.cli"] == ["testbed.cli:COMMANDS"]
    assert not [
        e for e in distribution("kafka-recovery-ledger").entry_points if "testbed" in e.value
    ]


def _wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def test_the_wheel_check_refuses_a_product_wheel_with_testbed_modules(tmp_path: Path) -> None:
    good_testbed = {name: "" for name in wheel_contents.TESTBED_REQUIRED}
    good_testbed["t-0.1.0.dist-info/entry_points.txt"] = (
        "[ledger.cli]\ntestbed = testbed.cli:COMMANDS\n"
    )
    testbed = _wheel(tmp_path / "t.whl", good_testbed)
    clean = _wheel(tmp_path / "p.whl", {"ledger/__init__.py": ""})
    assert wheel_contents.faults(clean, testbed) == []
    dirty = _wheel(tmp_path / "d.whl", {"ledger/__init__.py": "", "testbed/demo.py": ""})
    (fault,) = wheel_contents.faults(dirty, testbed)
    assert "testbed/demo.py" in fault and "packages.find" in fault
    bare = _wheel(tmp_path / "b.whl", {"testbed/__init__.py": "", "ledger/fold.py": ""})
    found = wheel_contents.faults(clean, bare)
    assert any("testbed/kafka/pom.xml" in f for f in found)
    assert any("['ledger']" in f for f in found)
    assert any("entry point" in f for f in found)
