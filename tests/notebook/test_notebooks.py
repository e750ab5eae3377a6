"""Every notebook in notebooks/ runs top to bottom headless, as nbclient and papermill run it
(approvals get the headless decision, deny)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output:
            parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


def test_there_are_notebooks() -> None:
    assert [path.name for path in NOTEBOOKS] == ["tour.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_runs_headless(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
    errors = [output for cell in notebook.cells for output in cell.get("outputs", [])
              if output.output_type == "error"]
    assert errors == []
    images = [output for cell in notebook.cells for output in cell.get("outputs", [])
              if "image/png" in output.get("data", {})]
    assert path.name != "tour.ipynb" or images, "the tour's plot did not arrive as a PNG"
    if path.name != "tour.ipynb":
        return
    text = "\n".join(_text(cell) for cell in notebook.cells if cell.cell_type == "code")
    assert "{'lines': 3, 'total': 31, 'largest': 9}" in text  # variables in and out
    assert "refused: [Errno 13] read of" in text and "private/diary.txt denied" in text
    assert "not written:" in text and "the headless decision (deny)" in text
    assert "Sandboxes see only what the policy grants." in text  # fetched through the proxy
    assert "refused: 403 domain example.com is not in the allowlist" in text
    assert "session ended: Memory limit exceeded" in text
    assert "(3.875, 8)" in text  # a session keeps state: the second cell used the first's
    assert "region" in text  # a DataFrame (its plain form; the page shows its HTML)
    charts = [output.data["text/html"] for cell in notebook.cells
              for output in cell.get("outputs", []) if "Plotly.newPlot" in
              output.get("data", {}).get("text/html", "")]
    assert len(charts) == 1 and "sandbox-output" in charts[0]  # plotly, in its frame
    assert "no answer: input() in a sandboxed cell cannot be answered here" in text
    assert "read_file" in text  # the in-kernel toolset
