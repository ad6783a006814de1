"""The dashboard page: one document, its style, script and source filled in once."""

from __future__ import annotations

import json
import re

from infer.dashboard.page import render_page


def test_the_page_inlines_its_style_and_script_from_the_package() -> None:
    html = render_page("infer", {"live": "/dashboard/stream"})
    assert "{{" not in html and "/*{{" not in html
    assert "class Panel" in html and "#panels" in html  # dashboard.js, dashboard.css
    assert "<script src" not in html and "<link" not in html  # nothing fetched


def test_what_is_filled_in_is_not_read_as_a_slot_and_cannot_end_the_script() -> None:
    source = {"replay": [{"name": "</script><b>{{title}}", "frames": []}]}
    html = render_page("<i>{{source}}</i>", source)
    assert "<title>&lt;i&gt;{{source}}&lt;/i&gt;</title>" in html
    found = re.search(r'<script type="application/json" id="source">(.*?)</script>', html, re.S)
    assert found is not None and json.loads(found.group(1)) == source
