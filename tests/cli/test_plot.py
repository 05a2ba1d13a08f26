"""``plot``: PNG and SVG files that are valid images, runs overlaid, clear errors."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from async_tracker.cli.main import main
from tests.cli.conftest import CHILD_A, CHILD_B, EMPTY, PARENT, Store
from tests.conftest import needs_matplotlib

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"



@needs_matplotlib
def test_png(configured: Store, isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Three runs overlaid; grad_norm holds NaN and an infinity (drawn as gaps, no warning).
    assert main(["plot", PARENT, CHILD_A, CHILD_B, "-o", "curves.png"]) == 0
    data = (isolated / "curves.png").read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > len(PNG_MAGIC)
    assert "wrote curves.png: 3 metric(s), 3 run(s)" in capsys.readouterr().out


@needs_matplotlib
def test_svg_with_chosen_metrics(
    configured: Store, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = isolated / "sub" / "loss.SVG"
    out.parent.mkdir()
    argv = ["--json", "plot", PARENT, CHILD_A, "--metric", "loss", "--metric", "accuracy"]
    assert main([*argv, "-o", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "output": str(out),
        "runs": [PARENT, CHILD_A],
        "metrics": ["loss", "accuracy"],
    }
    assert out.stat().st_size > 0
    root = ET.parse(out).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"


@needs_matplotlib
def test_flags_instead_of_torchxconfig(store: Store, isolated: Path) -> None:
    argv = ["--tracker", "fsspec", "--config", str(store.config), "plot", PARENT, "-o", "a.png"]
    assert main(argv) == 0
    assert (isolated / "a.png").read_bytes().startswith(PNG_MAGIC)


@needs_matplotlib
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plot", PARENT, "-o", "curves.pdf"], "name it .png or .svg"),
        (["plot", PARENT, "--metric", "nope", "-o", "c.png"], "no metric 'nope'"),
        (["plot", EMPTY, "-o", "c.png"], "no metrics recorded"),
        (["plot", PARENT, "-o", "missing-dir/c.png"], "cannot write"),
    ],
)
def test_errors(
    configured: Store, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_without_matplotlib(
    configured: Store,
    isolated: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["plot", PARENT, "-o", "c.png"]) == 2
    assert "pip install 'async-tracker[plot]'" in capsys.readouterr().err
    assert not (isolated / "c.png").exists()
