"""Reading the HTML pages that Report.save_html and Plan.save_html write (TF-free)."""

import html.parser
import json
import pathlib


class Page(html.parser.HTMLParser):
    """A page's tags with their attributes, the JSON of its "plan-data"
    block, and its visible text."""

    def __init__(self, path):
        super().__init__()
        self.tags, self.data, self.text = [], None, []
        self._in_data = False
        self.feed(pathlib.Path(path).read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        self._in_data = tag == "script" and attrs.get("id") == "plan-data"

    def handle_data(self, data):
        if self._in_data:
            self.data = json.loads(data)
            self._in_data = False
        else:
            self.text.append(data)

    def fetches(self):
        """What viewing the page would load: (tag, address) of every src,
        link or href that is not an anchor on the page itself."""
        out = []
        for tag, attrs in self.tags:
            for key in ("src", "href"):
                if key in attrs and not attrs[key].startswith("#"):
                    out.append((tag, attrs[key]))
            if tag == "link":
                out.append((tag, attrs.get("href", "")))
        return out
