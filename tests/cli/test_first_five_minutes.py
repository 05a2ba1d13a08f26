"""The README's "first five minutes", run exactly as written: its code blocks, in order, in an
empty folder (``python train.py`` with the README's ``train.py``, then each command)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, child_env
from tests.conftest import needs_matplotlib

SECTION = "## The first five minutes"
# Not run by the test: the install (the suite runs in an installed checkout) and the server.
NOT_RUN = ("pip ", "tensorboard ")


def blocks() -> list[tuple[str, str]]:
    """``(language, code)`` of each fenced block of the section, in order."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return re.findall(r"```(\w+)\n(.*?)```", text[start:end], flags=re.S)


def run(line: str, cwd: Path) -> str:
    argv = shlex.split(line)
    if argv[0] == "python":
        argv[0] = sys.executable
    elif argv[0] == "async-tracker":  # the console script may not be on PATH here
        argv[:1] = [sys.executable, "-m", "async_tracker"]
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, env=child_env(), timeout=120
    )
    assert done.returncode == 0, (line, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


@needs_matplotlib
def test_the_readme_steps_work_as_written(isolated: Path) -> None:
    pytest.importorskip("tensorboard")
    code = blocks()
    assert [lang for lang, _ in code] == ["bash", "python", "bash", "bash"]
    (isolated / "train.py").write_text(code[1][1], encoding="utf-8")
    outputs = {}
    for lang, block in code:
        if lang != "bash":
            continue
        for line in block.splitlines():
            if line.strip() and not line.startswith(NOT_RUN):
                outputs[line.split()[1] if line.startswith("async-tracker") else line] = run(
                    line, isolated
                )
    assert set(outputs) == {"python train.py", "list", "compare", "plot", "export"}

    # list jobs: both runs, finished, with their params and last loss.
    table = outputs["list"].splitlines()
    assert table[0].startswith("RUN ID")
    rows = {line.split()[0]: line for line in table[2:]}
    assert len(rows) == 2
    fast = next(r for i, r in rows.items() if i.startswith("mnist/lr-0.1-"))
    slow = next(r for i, r in rows.items() if i.startswith("mnist/lr-0.01-"))
    for row in (fast, slow):
        # PARAMS shows the params that differ between the runs listed: lr, not epochs.
        assert "finished" in row and "epochs=" not in row
    assert "lr=0.1 " in fast and f"loss={0.9**100:.6g}" in fast
    assert "lr=0.01 " in slow and f"loss={0.99**100:.6g}" in slow

    # compare: lr differs (epochs does not), and the loss side by side.
    lines = [line.split() for line in outputs["compare"].splitlines()[2:]]
    assert lines[0] == ["lr", "0.1", "0.01"]
    assert ["loss", "max", f"{0.9:.6g}", f"{0.99:.6g}"] in lines
    assert not any(line[0] == "epochs" for line in lines)

    # plot: a PNG; export: one TensorBoard folder per run, with an event file.
    assert (isolated / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for run_id in rows:
        folder = isolated / "tb_logs" / run_id
        assert any(p.name.startswith("events.out.tfevents.") for p in folder.iterdir())
    assert "tensorboard --logdir tb_logs" in outputs["export"]
