"""The distribution's package list maps every source folder, and the client side pulls no dependency.

The folders ``watchdog/`` and ``trainer/`` install as ``gpu_triage`` and ``ft_trainer`` (PyPI owns the
import names ``watchdog`` and ``trainer``); setuptools cannot discover remapped packages, so
``pyproject.toml`` lists them and this test keeps the list whole - but for the dev-only helpers
(``ft_trainer.devtools``: tests, benchmarks and ``make demo`` use them from a checkout), which stay out
of the wheel.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Package folders the wheel leaves out: helpers for tests, benchmarks and `make demo`, run from a checkout.
DEV_ONLY = {"ft_trainer.devtools"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed() -> None:
    tool = _pyproject()["tool"]["setuptools"]
    mapping = tool["package-dir"]
    expected = set()
    for import_name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            expected.add(".".join((import_name, *rel.parts)))
    assert expected >= DEV_ONLY, "a dev-only folder moved: update DEV_ONLY"
    assert set(tool["packages"]) == expected - DEV_ONLY


def test_what_the_wheel_needs_does_not_import_the_dev_helpers() -> None:
    """No packaged module imports a dev-only one (the wheel would install a module that cannot import),
    and the demo's simulated job ships with the daemon (``make run`` starts it from an installed wheel)."""
    tool = _pyproject()["tool"]["setuptools"]
    offenders = []
    for import_name, folder in tool["package-dir"].items():
        for source in sorted((ROOT / folder).rglob("*.py")):
            rel = source.relative_to(ROOT / folder)
            package = ".".join((import_name, *rel.parent.parts))
            if package in DEV_ONLY:
                continue
            text = source.read_text()
            offenders += [f"{rel} imports {dev}" for dev in DEV_ONLY if dev in text]
    assert offenders == []
    assert "gpu_triage.demo" in tool["packages"]
    assert (ROOT / "watchdog" / "demo" / "simjob.py").is_file()


def test_no_folder_name_is_an_import_name() -> None:
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert "watchdog" not in mapping and "trainer" not in mapping
    assert set(mapping.values()) == {"watchdog", "trainer"}


def test_base_install_pulls_nothing() -> None:
    project = _pyproject()["project"]
    assert project["dependencies"] == []
    assert "py-spy>=0.3.14" in project["optional-dependencies"]["daemon"]


def test_both_commands_report_the_distributions_version() -> None:
    from ft_trainer import __version__ as trainer_version
    from ft_trainer.cli import build_parser as trainer_parser
    from gpu_triage import __version__ as watchdog_version
    from gpu_triage.cli.main import build_parser as watchdog_parser

    version = _pyproject()["project"]["version"]
    assert watchdog_version == trainer_version == version
    for parser, prog in ((watchdog_parser(), "gpu-watchdog"), (trainer_parser(), "ft-trainer")):
        (action,) = [a for a in parser._actions if "--version" in a.option_strings]
        assert action.version == f"{prog} {version}"


def test_make_dist_builds_offline() -> None:
    """`make dist` must not need the index: no build isolation (which downloads setuptools), and the
    backend it then uses comes with the [dev] extra that `make` installs."""
    import re

    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^dist:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None
    assert "-m build --no-isolation" in recipe.group(1)
    backend = {r.split(">")[0].split("=")[0] for r in _pyproject()["build-system"]["requires"]}
    dev = {r.split(">")[0].split("=")[0] for r in _pyproject()["project"]["optional-dependencies"]["dev"]}
    assert backend <= dev and "wheel" in dev


def test_no_doc_teaches_an_install_from_pypi() -> None:
    """gpu-triage is not on PyPI: the docs install the wheel that `make dist` builds."""
    import re

    docs = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    wrong = re.compile(r"pip install ['\"]?gpu-triage\b")
    assert [str(p.relative_to(ROOT)) for p in docs if wrong.search(p.read_text())] == []
