"""The tables `%sandbox status`, `list`, `log` and `examples` show: HTML in a notebook,
aligned text anywhere else. Every value is escaped: some come from a sandbox."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Table"]


@dataclass
class Table:
    """A small table that shows as HTML in a notebook and as aligned text anywhere else."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        widths = [max([len(c), *(len(r[i]) for r in self.rows)])
                  for i, c in enumerate(self.columns)]
        widths[-1] = len(self.columns[-1])  # the last column runs on, unpadded
        line = "  ".join
        out = [self.title, line(c.ljust(w) for c, w in zip(self.columns, widths)),
               line("-" * w for w in widths)]
        out += [line(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in self.rows]
        if not self.rows:
            out.append("(none)")
        return "\n".join([*out, *self.notes])

    def html(self) -> str:
        def cell(tag: str, value: str) -> str:
            return f"<{tag} style='text-align:left'>{html.escape(value)}</{tag}>"

        head = "".join(cell("th", c) for c in self.columns)
        body = "".join("<tr>" + "".join(cell("td", v) for v in row) + "</tr>" for row in self.rows)
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in self.notes)
        return (f"<p><b>{html.escape(self.title)}</b></p><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>{notes}")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}

    def __repr__(self) -> str:
        return self.text()
