"""Runs every shell and Python block of the documentation, as a reader would.

The documents: ``README.md``, ``CONTRIBUTING.md`` and ``docs/*.md``. One test per fenced block
whose info string is ``bash``, ``sh``, ``shell`` or ``python`` (other fences, ``text``,
``console``, ``ini`` or none, are not run), named ``<file>:<line of the fence>``.

How a block runs (CONTRIBUTING.md, "The documentation's blocks", says the same for writers):

- The blocks of one file run in order, in one temporary directory of their own, so a tour's
  later block sees what an earlier one wrote. It is the working directory and ``$HOME``, and
  holds links to the checkout's ``examples/`` and ``benchmarks/``, so ``python
  examples/train_loop.py`` and ``python -m benchmarks.bench_core`` work as written.
- ``PATH`` starts with the test interpreter's ``bin`` folder (as if its venv were activated:
  ``python``, ``pip`` and ``async-tracker`` are the test venv's), ``PYTHONPATH`` is the
  checkout, ``$REPO`` is the checkout's path, and no ``TORCHX_*`` or ``ASYNC_TRACKER_*``
  variable is inherited.
- Shell blocks run with ``bash -e -o pipefail`` (a block fails at its first failing command);
  Python blocks are fed to ``python -``.
- A block fails on a non-zero exit status, on output containing ``Traceback``, or when it
  outlives its timeout (its whole process group is killed then, and after every block).
- Each test runs the blocks before its own that this process has not run yet (their
  failures are their own tests' to report), so the tests of one file may be split between
  pytest-xdist workers and still see what the earlier blocks made.

An HTML comment on the line before a fence (blank lines between them allowed) changes how the
block runs, ``<!-- doc-test: WORD ... -->``:

- ``skip (why)``: not run; the reason is required (a set-up command that installs packages,
  a server that runs until Ctrl-C, a benchmark that takes minutes).
- ``file=NAME``: the block's text is written to ``NAME`` in the file's directory instead of
  being run (any fence: a script a later block runs, a config file).
- ``cwd=repo``: runs in the checkout instead (for commands such as ``python -m pytest
  tests/...`` that need the project's configuration). Such a block must write nothing there.
- ``timeout=SECONDS``: instead of the default 120.

A block that would install packages (``pip install``, ``python -m venv``, ``--install``) must
carry ``skip``:
the test never changes the environment it runs in.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
DEFAULT_TIMEOUT_S = 120.0
OUTPUT_TAIL_CHARS = 4000
# Checkout folders linked into each file's directory, so that blocks name them as a reader in
# a checkout would.
LINKED = ("examples", "benchmarks")

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<words>.*?)\s*-->\s*$")
# Commands that install packages (pip, a new venv, a benchmark's --install of its peers).
INSTALLS = re.compile(r"\bpip3?\s+install\b|\bpython3?\s+-m\s+venv\b|\s--install\b")



@dataclasses.dataclass(frozen=True)
class Directive:
    """What a ``<!-- doc-test: ... -->`` comment says about the block after it."""

    skip: str | None = None  # the reason, when skipped
    file: str | None = None  # written there instead of run
    in_repo: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def parse(cls, words: str, where: str) -> Directive:
        """A word it does not know fails collection: a misspelt ``skip`` would otherwise run
        the block."""
        skip = re.fullmatch(r"skip\s*\((?P<why>.+)\)", words)
        if skip:
            return cls(skip=skip["why"].strip())
        directive = cls()
        for word in shlex.split(words):
            key, _, value = word.partition("=")
            if key == "file" and value:
                directive = dataclasses.replace(directive, file=value)
            elif key == "cwd" and value == "repo":
                directive = dataclasses.replace(directive, in_repo=True)
            elif key == "timeout" and value:
                directive = dataclasses.replace(directive, timeout_s=float(value))
            else:
                raise ValueError(
                    f"{where}: doc-test directive {word!r} not understood (skip (why), "
                    "file=NAME, cwd=repo, timeout=SECONDS)"
                )
        return directive


@dataclasses.dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the opening fence, 1-based
    language: str  # "shell", "python", or "" for a fence that is not run
    text: str
    directive: Directive

    @property
    def name(self) -> str:
        return f"{_shown(self.document)}:{self.line}"

    @property
    def skip(self) -> str | None:
        return self.directive.skip

    @property
    def file(self) -> str | None:
        return self.directive.file

    @property
    def in_repo(self) -> bool:
        return self.directive.in_repo

    @property
    def timeout_s(self) -> float:
        return self.directive.timeout_s

    @property
    def runs(self) -> bool:
        return self.skip is None and (self.file is not None or bool(self.language))


def _shown(document: Path) -> str:
    return str(document.relative_to(REPO) if document.is_relative_to(REPO) else document)


def parse(document: Path) -> list[Block]:
    """Every fenced block of ``document``, in order, with the directive before it."""
    blocks: list[Block] = []
    lines = document.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, info = opening["fence"], opening["info"].strip()
        start = index
        body: list[str] = []
        index += 1
        # A fence closes on a line of the same character, at least as long, with nothing after.
        while index < len(lines):
            closing = lines[index].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            body.append(lines[index])
            index += 1
        index += 1
        directive = Directive()
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        if before >= 0 and (comment := DIRECTIVE.match(lines[before])):
            where = f"{_shown(document)}:{before + 1}"
            directive = Directive.parse(comment["words"], where)
        language = RUN_LANGUAGES.get(info.split()[0].lower() if info else "", "")
        blocks.append(Block(document, start + 1, language, "\n".join(body) + "\n", directive))
    return blocks


@dataclasses.dataclass
class Tour:
    """One document's directory and how far this process got through its blocks."""

    directory: Path
    done: int = 0  # blocks run (or written) so far, in order
    failed: list[str] = dataclasses.field(default_factory=list)  # names of the blocks failed


_TOURS: dict[Path, Tour] = {}


def _environment(directory: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHX_", "ASYNC_TRACKER_", "PYTEST_", "VIRTUAL_ENV", "PYTHON"))
        and k not in {"COV_CORE_SOURCE", "COV_CORE_CONFIG", "COV_CORE_DATAFILE"}
    }
    # Not resolved: the venv's bin holds links to the base interpreter, and only the link's
    # location makes it the venv's python.
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(Path(venv_bin).parent)
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    env["REPO"] = str(REPO)
    env["HOME"] = str(directory)
    # matplotlib without a display, whatever the machine has.
    env["MPLBACKEND"] = "Agg"
    return env


def _execute(block: Block, tour: Tour) -> tuple[int | None, str]:
    """Runs one block; returns its exit status (None: timed out) and its output."""
    if block.file is not None:
        (tour.directory / block.file).write_text(block.text, encoding="utf-8")
        return 0, ""
    if block.language == "shell":
        command = ["bash", "-e", "-o", "pipefail", "-c", block.text]
        stdin = subprocess.DEVNULL
        data = None
    else:
        command = [str(Path(sys.executable).parent / "python"), "-"]
        stdin = subprocess.PIPE
        data = block.text
    env = _environment(tour.directory)
    # A session of its own: a timeout, or a server a block leaves in the background, is
    # ended with its whole process group.
    process = subprocess.Popen(
        command,
        cwd=REPO if block.in_repo else tour.directory,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    status: int | None
    try:
        output, _ = process.communicate(data, timeout=block.timeout_s)
        status = process.returncode
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        output, _ = process.communicate()
        status = None
    _kill_group(process.pid)
    return status, output


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _verdict(block: Block, status: int | None, output: str) -> str | None:
    """Why the block failed, or None."""
    if status is None:
        why = f"still running after {block.timeout_s:g} s (killed)"
    elif status != 0:
        why = f"exit status {status}"
    elif "Traceback" in output:
        why = "its output holds a Traceback"
    else:
        return None
    tail = output[-OUTPUT_TAIL_CHARS:]
    return f"{block.name}: {why}\n--- block ---\n{block.text}--- output (tail) ---\n{tail}"


def _tour(document: Path, tmp_root: Path) -> Tour:
    tour = _TOURS.get(document)
    if tour is None:
        directory = Path(tempfile.mkdtemp(prefix=f"{document.stem}-", dir=tmp_root))
        for name in LINKED:
            (directory / name).symlink_to(REPO / name, target_is_directory=True)
        tour = _TOURS[document] = Tour(directory)
    return tour


def _params() -> list[object]:
    params: list[object] = []
    for document in DOCUMENTS:
        if not document.exists():
            continue
        blocks = parse(document)
        for position, block in enumerate(blocks):
            if not block.runs:
                continue
            # Room for the earlier blocks this test may have to run first.
            earlier = sum(b.timeout_s for b in blocks[:position] if b.runs)
            params.append(
                pytest.param(
                    block,
                    position,
                    id=block.name,
                    marks=[pytest.mark.timeout(block.timeout_s + earlier + 30)],
                )
            )
    skipped = [
        pytest.param(block, -1, id=block.name, marks=pytest.mark.skip(reason=block.skip))
        for document in DOCUMENTS
        if document.exists()
        for block in parse(document)
        if block.skip is not None
    ]
    return params + skipped


@pytest.fixture(scope="session")
def tours_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("doc-blocks")


# The blocks are a reader's tours: mlflow, tensorboard, matplotlib, pandas, lightning and
# transformers among others ([all]); CI runs them with the whole suite, never in the '.[test]'
# venvs. The runner's own tests below need nothing more than [test].
@pytest.mark.server
@pytest.mark.parametrize(("block", "position"), _params())
def test_block(block: Block, position: int, tours_root: Path) -> None:
    if block.file is None and INSTALLS.search(block.text):
        pytest.fail(
            f"{block.name}: installs packages; mark it <!-- doc-test: skip (why) -->, the test "
            f"never changes the environment it runs in\n--- block ---\n{block.text}",
            pytrace=False,
        )
    tour = _tour(block.document, tours_root)
    blocks = parse(block.document)
    # The earlier blocks first, when another worker (or nothing yet) ran them.
    while tour.done < position:
        earlier = blocks[tour.done]
        if earlier.runs and not (earlier.file is None and INSTALLS.search(earlier.text)):
            status, output = _execute(earlier, tour)
            if _verdict(earlier, status, output) is not None:
                tour.failed.append(earlier.name)
        tour.done += 1
    if tour.done > position:
        # This process ran it already, as an earlier block of another test: run again, in
        # place, would see the later blocks' files, so say so rather than guess.
        pytest.fail(f"{block.name} ran out of order in this process")
    status, output = _execute(block, tour)
    tour.done += 1
    failure = _verdict(block, status, output)
    if failure is not None:
        if tour.failed:
            failure += f"\n(earlier blocks of this file failed: {', '.join(tour.failed)})"
        tour.failed.append(block.name)
        pytest.fail(failure, pytrace=False)


SAMPLE = """\
# A page

<!-- doc-test: file=job.py -->
```python
print("from the file")
```

```text
not run
```

<!-- doc-test: skip (serves until Ctrl-C) -->

```bash
tensorboard --logdir tb
```

~~~sh
python job.py > out.txt
~~~

<!-- doc-test: cwd=repo timeout=7 -->
```shell
test -f pyproject.toml
```
"""


def test_the_runner_reads_directives_and_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(SAMPLE, encoding="utf-8")
    blocks = parse(page)
    assert [(b.line, b.language, b.runs) for b in blocks] == [
        (4, "python", True),
        (8, "", False),
        (14, "shell", False),
        (18, "shell", True),
        (23, "shell", True),
    ]
    assert blocks[0].file == "job.py"
    assert blocks[2].skip == "serves until Ctrl-C"
    assert (blocks[4].in_repo, blocks[4].timeout_s) == (True, 7.0)
    assert blocks[3].timeout_s == DEFAULT_TIMEOUT_S and not blocks[3].in_repo
    # A file= block is written, not run; the next block runs it, in the same directory.
    tour = Tour(tmp_path / "tour")
    tour.directory.mkdir()
    for block in (blocks[0], blocks[3], blocks[4]):
        status, output = _execute(block, tour)
        assert _verdict(block, status, output) is None, output
    assert (tour.directory / "out.txt").read_text() == "from the file\n"


def test_the_runner_refuses_what_it_does_not_understand(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- doc-test: skipp -->\n```bash\ntrue\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'skipp' not understood"):
        parse(page)


def test_a_failing_block_says_why(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        # Exits 0, but a library printed a traceback it swallowed: a failure all the same.
        "```python\nimport traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
        "    traceback.print_exc()\n```\n"
        "<!-- doc-test: timeout=0.5 -->\n```bash\nsleep 30 &\nwait\n```\n"
        "```bash\necho ok; exit 3\n```\n",
        encoding="utf-8",
    )
    tour = Tour(tmp_path / "tour")
    tour.directory.mkdir()
    verdicts = [_verdict(b, *_execute(b, tour)) for b in parse(page)]
    assert "its output holds a Traceback" in str(verdicts[0])
    assert "ZeroDivisionError" in str(verdicts[0])
    assert "still running after 0.5 s" in str(verdicts[1])
    assert "exit status 3" in str(verdicts[2]) and "ok" in str(verdicts[2])
