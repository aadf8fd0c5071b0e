"""The frame of every page: head, style, and for pages with charts the Vega,
Vega-Lite and vega-embed libraries inlined once from vl-convert's bundle, so a
page loads nothing from the network."""

import functools
import json

import vl_convert

from serving_study.report.markup import escape

# Only the export action: "source" and "compiled" write the spec's text (strings
# from config and logs) into a new window as HTML, "editor" posts it to the
# Vega Editor's site.
EMBED_OPTIONS = {
    "renderer": "svg",
    "actions": {"export": True, "source": False, "compiled": False, "editor": False},
}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 75em;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left;
         vertical-align: top; }
th { background: #f2f2f2; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
li.holds, tr.holds td.verdict { color: #1d6b2a; }
li.does-not-hold, tr.does-not-hold td.verdict { color: #a32020; }
li.cannot-tell, tr.cannot-tell td.verdict { color: #8a6d00; }
.verdicts li { margin-bottom: 0.3em; }
.note { color: #555; font-size: 0.9em; }
figure { margin: 1em 0 2em; }
"""


def html_document(title: str, body: str, with_charts: bool = False) -> str:
    """A complete HTML document; with charts, the inlined libraries and embedder."""
    head_script = ""
    embed_script = ""
    if with_charts:
        head_script = f'<script type="text/javascript">{vega_bundle()}</script>'
        embed_script = (
            f'<script type="text/javascript">{embed_charts_script()}</script>'
        )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n<style>{STYLE}</style>\n"
        f"{head_script}\n</head>\n<body>\n{body}\n{embed_script}\n</body>\n</html>\n"
    )


@functools.cache
def vega_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one script, with no network imports."""
    return vl_convert.javascript_bundle().replace("</script", "<\\/script")


def embed_charts_script() -> str:
    options = json.dumps(EMBED_OPTIONS)
    return (
        "document.querySelectorAll('script[data-chart]').forEach(function (node) {"
        f" vegaEmbed('#' + node.dataset.chart, JSON.parse(node.textContent), {options})"
        ".catch(console.error); });"
    )
