"""The read side's layering: the dashboard (``ui/``), the CLI (``cli/``) and ``Store``
(``store/api.py``) read every store through the reader interface (``store/``) and import
no backend module. A backend imported to WRITE (an export into TensorBoard files) is an
exception, listed here by module and name, each with its reason. And the read conformance
suite, shipped in the package, is the one module that needs pytest.

Read from the source with ``ast``: ``import``, ``from ... import`` (relative ones
resolved), and ``importlib.import_module("...")`` / ``__import__("...")`` with a literal
name, wherever they are (a function's lazy import included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import async_tracker

PACKAGE = Path(async_tracker.__file__).resolve().parent
BACKEND = "async_tracker.backend"
# What must read stores through store/ alone.
READ_SIDE = [*sorted((PACKAGE / "ui").rglob("*.py")), *sorted((PACKAGE / "cli").rglob("*.py")),
             PACKAGE / "store" / "api.py"]  # fmt: skip

# (module, imported name): why it may. Each must still be there (see the last test).
WRITE_SIDE = {
    ("async_tracker.cli.export", "async_tracker.backend.tensorboard"): (
        "`export tensorboard` writes the runs it exports as event files, lazily imported "
        "(the extra is optional)"
    ),
}


def module_name(path: Path) -> str:
    parts = list(path.resolve().relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(
    source: str, module: str, is_package: bool = False
) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of every module ``source`` (the text of ``module``) imports,
    and for ``from X import y`` also ``X.y`` (which may be a module)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and _callee(node.func) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _callee(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def backend_imports(path: Path) -> set[tuple[str, str, int]]:
    """``(module, backend module imported, line)`` of each import of a backend in ``path``."""
    module = module_name(path)
    names = imported_names(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
    found: dict[int, str] = {}
    for line, name in names:
        if name == BACKEND or name.startswith(BACKEND + "."):
            # The first name of the line: ``from async_tracker.backend.x import y`` is x.
            found.setdefault(line, name)
    return {(module, name, line) for line, name in found.items()}


def test_ui_cli_and_store_api_import_no_backend() -> None:
    found = {hit for path in READ_SIDE for hit in backend_imports(path)}
    unexpected = sorted(
        f"{module}:{line} imports {name}"
        for module, name, line in found
        if (module, name) not in WRITE_SIDE
    )
    assert not unexpected, (
        "the read side imports a backend; read through async_tracker.store (open_reader, "
        "RunReader), or list a write-side import in WRITE_SIDE with its reason:\n"
        + "\n".join(unexpected)
    )


def test_every_write_side_exception_is_still_needed() -> None:
    found = {(module, name) for path in READ_SIDE for module, name, _ in backend_imports(path)}
    stale = sorted(set(WRITE_SIDE) - found)
    assert not stale, f"no longer imported, remove from WRITE_SIDE: {stale}"


def test_the_check_sees_every_form_of_import() -> None:
    source = '''
import async_tracker.backend.mlflow
from async_tracker.backend.fsspec import AsyncFsspecTracker
from async_tracker import backend
from ..backend import memory

def lazy():
    import importlib
    importlib.import_module("async_tracker.backend.tensorboard")
    __import__("async_tracker.backend")

import async_tracker.store.reader
from async_tracker.store.open import open_reader
from . import common
'''
    names = [n for _, n in imported_names(source, "async_tracker.cli.demo")]
    hits = {n for n in names if n == BACKEND or n.startswith(BACKEND + ".")}
    assert hits == {
        "async_tracker.backend.mlflow",
        "async_tracker.backend.fsspec",
        "async_tracker.backend.fsspec.AsyncFsspecTracker",
        "async_tracker.backend",
        "async_tracker.backend.memory",
        "async_tracker.backend.tensorboard",
    }
    assert "async_tracker.cli.common" in names and "async_tracker.store.open" in names


def test_the_package_imports_without_pytest_and_the_suite_needs_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['pytest'] = None  # as if it were not installed\n"
        "import async_tracker, async_tracker.store.open, async_tracker.store.api\n"
        "import async_tracker.store.reader, async_tracker.store.sync_reader\n"
        "import async_tracker.cli.main, async_tracker.backend.memory\n"
        "try:\n"
        "    import async_tracker.store.conformance\n"
        "except ImportError:\n"
        "    print('suite needs pytest')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        cwd=PACKAGE.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "suite needs pytest"
