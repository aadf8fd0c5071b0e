"""How the report writes HTML: Jinja templates (templates/) that autoescape every
value they print, with JSON in a <script> written by ``tojson``, which escapes
<, > and & so that no string can close the tag; and the table record their
table macro draws."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Self

import jinja2
import markupsafe
import pandas as pd

from serving_study.analysis.numbers import format_number
from serving_study.report.formatting import text

TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("serving_study.report"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
TEMPLATES.filters["text"] = text
# A spec with NaN would not parse in a browser: refuse it. Keys keep their order.
TEMPLATES.policies["json.dumps_kwargs"] = {"allow_nan": False}


def render(template: str, **values) -> markupsafe.Markup:
    """A template's HTML, marked safe to embed in another template."""
    return markupsafe.Markup(TEMPLATES.get_template(template).render(**values))


@dataclass(frozen=True)
class Table:
    """A table of text cells as table.html.j2 draws it: columns from
    `numeric_from` on are numbers, `verdict_column` takes its color from the
    row's class; `notes` stand above it, `folded` is the summary it is folded
    under, and `when_empty` is said instead of a table without rows."""

    header: Sequence[str]
    rows: Sequence[Sequence]
    numeric_from: int | None = None
    verdict_column: int | None = None
    row_classes: Sequence[str] = ()
    notes: Sequence[str] = ()
    folded: str = ""
    when_empty: str = ""

    @classmethod
    def of_frame(
        cls, frame: pd.DataFrame, columns: Mapping[str, str], figures=(), **layout
    ) -> Self:
        """`frame`'s columns as a table, `columns` mapping each heading to its
        column; those named in `figures` are written as numbers are."""
        rows = [
            [
                format_number(row[c]) if c in figures else row[c]
                for c in columns.values()
            ]
            for row in frame.to_dict("records")
        ]
        return cls(list(columns), rows, **layout)

    @classmethod
    def of_rows(cls, rows: Sequence[Mapping[str, object]], **layout) -> Self:
        """A table of rows that each map the same headings to their cells."""
        header = list(rows[0]) if rows else []
        return cls(header, [list(row.values()) for row in rows], **layout)

    def row_class(self, index: int) -> str:
        return self.row_classes[index] if self.row_classes else ""

    def column_class(self, index: int) -> str:
        classes = []
        if self.numeric_from is not None and index >= self.numeric_from:
            classes.append("number")
        if index == self.verdict_column:
            classes.append("verdict")
        return " ".join(classes)
