"""The bench's driver (bench/run.py): figures keep to their own scratch folders and rows, and a figure
that crashes fails the run (issue 34: figure 11 reused figure 8's project in ``--quick`` and crashed on
``AlreadyInitialized`` while the run still exited 0)."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import run as bench_run  # noqa: E402


def _figures_of(module: str) -> set[int]:
    return {number for number, (name, _title) in bench_run.FIGURES.items() if name == module}


def _scratch_and_rows(source: str) -> tuple[list[str], list[int]]:
    """Every name a figure gives a folder under ``ctx.scratch`` (the text before the first ``-`` of the
    literal part), and every figure number it puts on a row, a note or a not-available line."""
    folders, numbers = [], []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and ast.unparse(node.left) == "ctx.scratch":
            right = node.right
            text = right.value if isinstance(right, ast.Constant) else "".join(
                part.value for part in getattr(right, "values", []) if isinstance(part, ast.Constant))
            if isinstance(text, str) and text.startswith("fig"):
                folders.append(text.split("-")[0])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("row", "not_available") and node.args and isinstance(node.args[0], ast.Constant):
                numbers.append(node.args[0].value)
            if node.func.id == "add_note" and len(node.args) == 3 and isinstance(node.args[2], ast.Constant):
                numbers.append(node.args[2].value)
    return folders, numbers


@pytest.mark.parametrize("module", sorted({name for name, _title in bench_run.FIGURES.values()}))
def test_a_figure_keeps_to_its_own_scratch_folders_and_rows(module: str) -> None:
    figures = _figures_of(module)
    folders, numbers = _scratch_and_rows((BENCH / f"{module}.py").read_text())
    assert {folder for folder in folders if folder != "fig"} <= {f"fig{n}" for n in figures}, module
    assert set(numbers) <= figures, module


def _fake_figures(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, crash: bool) -> None:
    module = types.ModuleType("fig_fake_for_test")

    def run(ctx: object) -> tuple[list[dict[str, object]], dict[str, object]]:
        if crash:
            raise RuntimeError("broken on purpose")
        return [{"figure": 90, "name": "a measure", "unit": "ms", "value": 1.0}], {}

    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fig_fake_for_test", module)
    monkeypatch.setitem(bench_run.FIGURES, 90, ("fig_fake_for_test", "a fake figure"))
    monkeypatch.setitem(bench_run.RUNNERS, 90, "run")


@pytest.mark.parametrize("crash", [False, True], ids=["measured", "crashed"])
def test_a_crashed_figure_fails_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str], crash: bool) -> None:
    _fake_figures(monkeypatch, tmp_path, crash)
    assert bench_run.main(["--only", "90"]) == (1 if crash else 0)
    out = tmp_path / "result.json"
    assert bench_run.main(["--only", "90", "--out", str(out)]) == (1 if crash else 0)
    import json

    assert json.loads(out.read_text())["crashed"] == ([90] if crash else [])
    printed = capsys.readouterr()
    assert ("CRASHED" in printed.out) == crash and ("broken on purpose" in printed.err) == crash
