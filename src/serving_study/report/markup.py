"""HTML built from strings that may come from a config, a host description or a
log: every cell escaped, and JSON that cannot close the script tag it sits in."""

import html
import json

from serving_study.report.formatting import text


def escape(value) -> str:
    return html.escape(text(value), quote=True)


def script_json(value) -> str:
    """JSON that is safe inside a <script> element: no tag can be closed."""
    return (
        json.dumps(value, allow_nan=False)
        .replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
    )


def html_table(
    header: list[str],
    rows: list[list],
    numeric_from: int | None = None,
    row_classes: list[str] | None = None,
    verdict_column: int | None = None,
) -> str:
    """A table whose every cell is escaped text."""
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    body = []
    for index, row in enumerate(rows):
        cells = []
        for column, cell in enumerate(row):
            classes = []
            if numeric_from is not None and column >= numeric_from:
                classes.append("number")
            if column == verdict_column:
                classes.append("verdict")
            attribute = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{attribute}>{escape(cell)}</td>")
        css = row_classes[index] if row_classes else ""
        attribute = f' class="{css}"' if css else ""
        body.append(f"<tr{attribute}>{''.join(cells)}</tr>")
    return (
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )
