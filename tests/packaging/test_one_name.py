"""The code and the docs use the one import name, regent.*, never a part's bare name.

A bare `import controller` still works from a checkout's root (it is a folder there), but it
would load a second copy of every module beside regent.controller's, and isinstance checks
between the two copies fail.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import regent
import regent.controller

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())[
    "tool"]["setuptools"]["package-dir"]
PARTS = sorted(p for p in PACKAGE_DIR.values() if p != "regent")
CODE_FOLDERS = [*PARTS, "tests", "bench", "examples", "scripts"]


def _bare_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            else [])
        found += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names
                  if n.split(".")[0] in PARTS]
    return found


def test_no_python_file_imports_a_part_by_its_bare_name():
    files = [f for folder in CODE_FOLDERS if (REPO / folder).is_dir()
             for f in sorted((REPO / folder).rglob("*.py")) if "__pycache__" not in f.parts]
    assert files
    offenders = [hit for f in files for hit in _bare_imports(f)]
    assert not offenders, "import these as regent.<part>:\n" + "\n".join(offenders)


def test_the_docs_code_imports_from_regent():
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
            *sorted((REPO / "examples").rglob("README.md"))]
    bare = re.compile(rf"^\s*(from|import)\s+({'|'.join(PARTS)})\b", re.M)
    offenders = [f"{d.relative_to(REPO)}: {m.group(0).strip()}" for d in docs
                 for m in bare.finditer(d.read_text())]
    assert not offenders, offenders
    assert "from regent import Session" in (REPO / "README.md").read_text()


def test_every_part_is_a_symlink_in_regent_so_the_checkout_imports_it_as_installed():
    for part in PARTS:
        link = REPO / "regent" / part
        assert link.is_symlink() and link.resolve() == (REPO / part).resolve(), (
            f"regent/{part} must be a symlink to ../{part}: ln -s ../{part} regent/{part}")


def test_regent_exports_the_controllers_public_names_and_the_restart_policy():
    assert set(regent.controller.__all__) | {"RestartPolicy"} <= set(regent.__all__)
    for name in regent.__all__:
        assert getattr(regent, name) is not None
    assert regent.Session is regent.controller.Session


def test_a_worker_proc_import_loads_no_controller_and_no_bare_part():
    code = ("import sys, regent.worker.proc\n"
            f"bare = sorted({{m.split('.')[0] for m in sys.modules}} & {set(PARTS)!r})\n"
            "print(bare, 'regent.controller' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["[]", "False"]
