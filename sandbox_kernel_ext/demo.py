"""The main job: run the tour notebook headless, as nbclient and papermill run notebooks, and
print what each cell showed.

`python -m sandbox_kernel_ext.demo [--save PATH]`. Approvals get the headless decision (deny),
and the cells say so; opened in JupyterLab (the command it prints at its end) the same
notebook asks with buttons instead.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

# Beside the package in an installed wheel; in the repository's notebooks/ in a checkout.
_HERE = Path(__file__).resolve().parent
TOUR = next((path for path in (_HERE / "notebooks" / "tour.ipynb",
                               _HERE.parent / "notebooks" / "tour.ipynb") if path.exists()),
            _HERE.parent / "notebooks" / "tour.ipynb")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _outputs(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] == "error":
            parts.append(f"{output['ename']}: {output['evalue']}\n")
        elif "data" in output:
            data = output["data"]
            if "image/png" in data:
                parts.append(f"[a PNG image, {len(data['image/png']) * 3 // 4:,} bytes] ")
            elif "text/html" in data and "sandbox-output" in data["text/html"]:
                parts.append("[HTML, shown in an isolated frame] ")
            parts.append(data.get("text/plain", "") + "\n")
    return _ANSI.sub("", "".join(parts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", metavar="PATH", help="where to write the executed notebook "
                        "(default: a new temporary folder)")
    parser.add_argument("--notebook", default=str(TOUR), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        import nbformat
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError
    except ImportError:
        print("the tour needs nbclient: pip install 'sandbox_kernel_ext[tour]'", file=sys.stderr)
        return 2
    notebook = nbformat.read(args.notebook, as_version=4)
    started = time.monotonic()
    failed = None
    try:
        NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
    except CellExecutionError as exc:
        failed = exc
    number = 0
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            title = next((line for line in cell.source.splitlines() if line.startswith("#")), "")
            if title:
                print(f"\n{title.lstrip('# ').upper()}")
            continue
        number += 1
        print(f"\n[{number}] " + "\n    ".join(cell.source.splitlines()))
        shown = _outputs(cell).rstrip("\n")
        if shown:
            print("\n".join("  | " + line for line in shown.splitlines()))
    save = Path(args.save) if args.save else Path(tempfile.mkdtemp(prefix="sandbox-tour-")) / "tour.ipynb"
    nbformat.write(notebook, save)
    lab = [str(Path(sys.executable).with_name("jupyter")), "lab", str(save)]
    if os.geteuid() == 0:
        lab.append("--allow-root")  # JupyterLab refuses root without it
    print(f"\nRan {number} cells in {time.monotonic() - started:.1f} s; the executed notebook is "
          f"{save}.\nTo try it with approval buttons, open it in JupyterLab and run it again: "
          f"{shlex.join(lab)}")
    if failed is not None:
        print(f"\nthe tour stopped at an error:\n{failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
