"""The package as a user installs and imports it: every module imports on its own."""

from __future__ import annotations

import configparser
import os
import pkgutil
import re
import subprocess
import sys

import pytest

import syncjobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The integrations need their framework, which the plain suite may lack.
_NEEDS_FRAMEWORK = ("syncjobs.contrib.",)


def _modules() -> list[str]:
    names = ["syncjobs"]
    for info in pkgutil.walk_packages(syncjobs.__path__, "syncjobs."):
        # __main__ runs the command when imported: not a module to import.
        if not info.name.startswith(_NEEDS_FRAMEWORK) and info.name != "syncjobs.__main__":
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("module", _modules())
def test_every_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    # Imported first: what a circular import breaks only when this module
    # is the one a program (or `python -c`) reaches for before the others.
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


# -- dependencies: the lower bounds are what the code needs, and tox -e min tests them ---------------


def _requirements() -> list[str]:
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    lines = config["options"]["install_requires"].splitlines()
    for extra in config["options.extras_require"].values():
        lines += extra.splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def lower_bounds() -> dict[str, str]:
    """Each dependency's lower bound in setup.cfg, by normalised name."""
    bounds: dict[str, str] = {}
    for requirement in _requirements():
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?>=([0-9.]+)", requirement)
        assert found, f"setup.cfg: {requirement!r} needs a lower bound (name>=version), which tox -e min tests"
        bounds[_name(found.group(1))] = found.group(3)
    return bounds


def pinned_minimums() -> dict[str, str]:
    pins: dict[str, str] = {}
    with open(os.path.join(ROOT, "tests", "constraints-min.txt")) as lines:
        for text in lines:
            line = text.partition("#")[0].strip()
            if line:
                name, _, version = line.partition("==")
                pins[_name(name)] = version
    return pins


def _version(text: str) -> tuple[int, ...]:
    parts = [int(part) for part in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:  # 4.5 == 4.5.0
        parts.pop()
    return tuple(parts)


def test_the_min_env_pins_every_lower_bound_of_setup_cfg() -> None:
    bounds, pins = lower_bounds(), pinned_minimums()
    for name, bound in bounds.items():
        assert name in pins, f"tests/constraints-min.txt does not pin {name}"
        tested = pins[name]
        assert _version(tested) == _version(bound), f"{name}: setup.cfg says >={bound}, tox -e min tests {tested}"
    # psycopg[binary] installs psycopg-binary at the same version.
    assert pins["psycopg-binary"] == pins["psycopg"]


def test_psycopg_is_at_least_the_version_whose_notifies_the_listener_uses() -> None:
    # notifies(timeout=, stop_after=) is psycopg 3.2's; on 3.1 the listener
    # falls back to polling: pickup takes a poll interval, with a log line each time.
    assert _version(lower_bounds()["psycopg"]) >= (3, 2)


# -- the wheel: every file of the package, as setup.cfg tells setuptools to build it ---------------


def _in_the_wheel() -> set[str]:
    """The package's files that setuptools' build_py copies into the wheel, without building it."""
    from setuptools.dist import Distribution

    dist = Distribution({"script_name": "setup.py"})
    dist.parse_config_files([os.path.join(ROOT, "setup.cfg")])
    build_py = dist.get_command_obj("build_py")
    build_py.ensure_finalized()
    return {os.path.relpath(path, build_py.build_lib) for path in build_py.get_outputs(include_bytecode=False)}


def _in_the_checkout() -> set[str]:
    found = set()
    for directory, subdirectories, files in os.walk(os.path.join(ROOT, "syncjobs")):
        subdirectories[:] = [name for name in subdirectories if name != "__pycache__"]
        for name in files:
            if not name.endswith((".pyc", ".pyo")):
                found.add(os.path.relpath(os.path.join(directory, name), ROOT))
    return found


def test_the_wheel_holds_every_file_of_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite imports the checkout, where every file is there: a subpackage that setup.cfg's
    # find: misses (no __init__.py, or outside its include) or a data file its package_data
    # leaves out would be missing only from what users install.
    monkeypatch.chdir(ROOT)  # setuptools resolves the package directories from the working directory
    wheel = _in_the_wheel()
    missing = sorted(_in_the_checkout() - wheel)
    assert missing == [], f"setup.cfg leaves these out of the wheel: {missing}"
    assert os.path.join("syncjobs", "py.typed") in wheel  # PEP 561's marker: without it mypy ignores the types
