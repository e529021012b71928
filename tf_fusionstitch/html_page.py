"""One self-contained HTML page: the vendored drawing library inlined, data as JSON.

TF-free. The pages of report_html.py and planner/plan_html.py draw with
Cytoscape.js and its dagre layout (tf_fusionstitch/static/README.md), inlined
so a page needs no network to be viewed.
"""

from __future__ import annotations

import html
import json
import pathlib
import re
from typing import Any, Sequence

STATIC = pathlib.Path(__file__).resolve().parent / "static"
LIBRARIES = ("cytoscape.min.js", "cytoscape-dagre.min.js")

BASE_CSS = """
body { font: 13px/1.35 system-ui, sans-serif; margin: 0; color: #222; }
header { padding: 8px 14px; background: #263238; color: #eceff1; }
header h1 { font-size: 16px; margin: 0 0 2px 0; }
header .sub { color: #b0bec5; white-space: pre-wrap; }
table { border-collapse: collapse; }
th, td { border-bottom: 1px solid #e0e0e0; padding: 3px 8px; text-align: left;
         vertical-align: top; }
th { background: #eceff1; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px;
          margin-right: 5px; vertical-align: -1px; }
"""


def script_text(text: str) -> str:
    """JavaScript `text` safe inside a <script> element (only `</script`
    would end it early; in JS it can only occur inside a string)."""
    return re.sub(r"</(script)", r"<\\/\1", text, flags=re.IGNORECASE)


def json_script(element_id: str, data: Any) -> str:
    """`data` as a JSON <script> block that the page's code parses ("<\\/"
    is JSON for "</", so no name in the data can end the block)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def page(title: str, body: str, script: str, css: str = "",
         libraries: Sequence[str] = LIBRARIES) -> str:
    """The whole page: `body` (HTML), then the libraries and `script` inlined."""
    inlined = "\n".join(f"<script>/* {name} */\n{script_text((STATIC / name).read_text('utf-8'))}"
                        "\n</script>" for name in libraries)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title>\n<style>{BASE_CSS}{css}</style></head>\n"
            f"<body>\n{body}\n{inlined}\n<script>\n{script_text(script)}\n</script>\n"
            f"</body></html>\n")


def write(path, text: str) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
