"""A whole page (templates/document.html.j2 frames it): for pages with charts the
Vega, Vega-Lite and vega-embed libraries inlined once from vl-convert's bundle, so
a page loads nothing from the network."""

import functools

import markupsafe
import vl_convert

from serving_study.report.markup import render

# Only the export action: "source" and "compiled" write the spec's text (strings
# from config and logs) into a new window as HTML, "editor" posts it to the
# Vega Editor's site.
EMBED_OPTIONS = {
    "renderer": "svg",
    "actions": {"export": True, "source": False, "compiled": False, "editor": False},
}


def render_page(template: str, title: str, with_charts: bool, **values) -> str:
    """A complete HTML page from a template that extends document.html.j2."""
    bundle = vega_bundle() if with_charts else None
    return render(
        template, title=title, vega_bundle=bundle, embed_options=EMBED_OPTIONS, **values
    )


@functools.cache
def vega_bundle() -> markupsafe.Markup:
    """Vega, Vega-Lite and vega-embed as one script, with no network imports;
    our own code, so written as it is but for any closing tag inside it."""
    bundle = vl_convert.javascript_bundle().replace("</script", "<\\/script")
    return markupsafe.Markup(bundle)
