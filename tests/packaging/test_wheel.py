"""The built wheel installs one top-level package, regent, and it imports from a fresh venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
DIST_INFO = f"regent-{PYPROJECT['project']['version']}.dist-info"


def _without_pythonpath() -> dict[str, str]:
    """pip's environment: a checkout on PYTHONPATH holds regent.egg-info (an editable install),
    and pip would take regent for installed already."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of what it is made of (setuptools writes build/ beside it)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in set(PACKAGE_DIR.values()):
        shutil.copytree(REPO / folder, src / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=120, env=_without_pythonpath(),
    )
    assert done.returncode == 0, f"pip wheel failed (needs setuptools>=70.1 here):\n{done.stderr}"
    (built,) = out.glob("regent-*.whl")
    return built


def test_the_wheel_holds_regent_and_its_metadata_and_nothing_else(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"regent", DIST_INFO}
    top_level = zipfile.ZipFile(wheel).read(f"{DIST_INFO}/top_level.txt").decode().split()
    assert top_level == ["regent"]
    record = zipfile.ZipFile(wheel).read(f"{DIST_INFO}/RECORD").decode().splitlines()
    assert {line.split("/")[0] for line in record} == {"regent", DIST_INFO}


def test_every_module_of_every_part_is_in_the_wheel_under_regent(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {"regent/__init__.py"}
    for package, folder in PACKAGE_DIR.items():
        if package == "regent":
            continue
        inside = package.removeprefix("regent.").replace(".", "/")
        want |= {f"regent/{inside}/{p.relative_to(REPO / folder).as_posix()}"
                 for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(want - names)
    assert not missing, f"not in the wheel (list the subpackage in pyproject.toml): {missing}"


def test_a_fresh_venv_with_the_wheel_imports_regent_and_no_bare_part(wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=120,
                   env=_without_pythonpath())
    # The dependencies (torch, pyzmq, ...) come from this interpreter's site-packages, listed in
    # a .pth after the venv's own: their .pth files (an editable regent among them) do not run.
    purelib = next((venv / "lib").glob("python3*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (purelib / "zz_regent_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    code = (
        "import importlib.util, regent\n"
        "from regent import Session, Actor, endpoint, RestartPolicy\n"
        "import regent.hipcore, regent.journal, regent.worker.proc, regent.chaos\n"
        "assert Session.__module__ == 'regent.controller.session', Session.__module__\n"
        "bare = [n for n in ('controller', 'worker', 'journal', 'hipcore', 'chaos')\n"
        "        if importlib.util.find_spec(n) is not None]\n"
        "assert not bare, bare\n"
        "print(regent.__file__)\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    done = subprocess.run([str(py), "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(venv), done.stdout
    cli = subprocess.run([str(venv / "bin" / "regent"), "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "journal" in cli.stdout, cli.stderr
