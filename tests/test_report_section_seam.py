"""A section of the report's index page is one module of reports/sections/ with its template beside it: dropped in
beside the shipped ones (here from a temporary folder joined to the package's path, in a fresh interpreter), a real
site shows it in its place and in the nav where it applies (real headless Chromium), its Markdown part joins
summary.md in its place, and neither shows where it does not apply; nothing else was edited."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from report_fixtures import campaign_view
from test_report_page import console_messages, needs_chromium, render_in_chromium

from reports import index_sections
from reports.sections.best import Best

TOY = '''
"""A toy section: the slowest measured point, where the campaign has two or more."""
from reports.index_sections import Section, register
from reports.markdown_text import md_code


def measured(page):
    return [p for p in page.view.points if p.mean("tflops_per_gpu") is not None]


@register
class Slowest(Section):
    name = "toy"
    order = 85  # after "Where the time goes", before the environment
    nav = "Slowest point"
    summary_order = 85  # before the environment

    def summary(self, page):
        if not self.applies(page):
            return []
        return ["", "### Slowest point", "", f"- {md_code(self.context(page)['point'].point_id)}"]

    def applies(self, page):
        return len(measured(page)) > 1

    def context(self, page):
        slowest = min(measured(page), key=lambda p: p.mean("tflops_per_gpu"))
        return {"point": slowest, "campaign": page.view.name}
'''

TEMPLATE = """<section id="toy">
  <h2>Slowest point</h2>
  <p id="toy-slowest" data-point="{{ point.point_id }}">{{ point.point_id }} of {{ campaign }}</p>
</section>
"""

SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, "tests")
import reports.sections as sections
folder, out = sys.argv[1:]
sections.__path__.append(folder)
from report_fixtures import campaign_view, empty_view, hostile_view
from reports import index_sections
from reports.markdown import markdown_summary
from reports.site import write_site

view = hostile_view()
view.cells[1].state, view.cells[1].summary = "completed", view.cells[0].summary  # two measured points
pages = {name: str(write_site(v, Path(out) / name, None, {"summary.md": markdown_summary(v)})) for name, v in
         (("applies", campaign_view()), ("hostile", view), ("absent", empty_view()))}
print("RESULT:" + json.dumps({"names": [s.name for s in index_sections.sections()], "pages": pages}))
"""


def _site_with_the_toy(tmp_path: Path) -> dict[str, object]:
    folder = tmp_path / "more_sections"
    folder.mkdir()
    (folder / "toy.py").write_text(TOY)
    (folder / "toy.html.j2").write_text(TEMPLATE)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(tmp_path / "sites")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT:")] or [proc.stdout + proc.stderr]
    return json.loads(line.removeprefix("RESULT:"))


@needs_chromium
def test_a_new_section_is_one_module_shown_where_it_applies(tmp_path: Path) -> None:
    out = _site_with_the_toy(tmp_path)
    names = out["names"]
    assert isinstance(names, list) and names.index("toy") == names.index("fingerprint") - 1
    pages = {name: Path(page) for name, page in out["pages"].items()}  # type: ignore[union-attr]

    dom, stderr = render_in_chromium(pages["applies"], tmp_path / "p1")
    assert console_messages(stderr) == []
    ids = [n.attrs["id"] for n in dom.find_all("section") if "id" in n.attrs]
    assert ids[ids.index("plots") :] == ["plots", "toy", "fingerprint"]
    view = campaign_view()
    measured = [p for p in view.points if p.mean("tflops_per_gpu") is not None]
    slowest = min(measured, key=lambda p: p.mean("tflops_per_gpu") or 0.0)
    assert dom.by_id("toy-slowest").attrs["data-point"] == slowest.point_id
    nav = [a.attrs["href"] for a in dom.by_id("site-nav").find_all("a")]
    assert nav == ["#cells", "#rejected", "#plots", "#toy", "#fingerprint"]
    summary = (pages["applies"].parent / "summary.md").read_text()
    toy = f"\n\n### Slowest point\n\n- `{slowest.point_id}`\n\n### Environment\n"
    assert summary.index("### Points\n") < summary.index(toy)

    dom, stderr = render_in_chromium(pages["hostile"], tmp_path / "p2")
    assert console_messages(stderr) == [] and not dom.find_all("b") and not dom.find_all("a", href="x")
    assert dom.by_id("toy-slowest").text() == 'h<1> of camp<a href="x">aign</a>'  # user text as text

    dom, stderr = render_in_chromium(pages["absent"], tmp_path / "p3")
    assert console_messages(stderr) == []
    assert dom.by_id("toy") is None and dom.by_id("toy-slowest") is None
    assert "#toy" not in [a.attrs["href"] for a in dom.by_id("site-nav").find_all("a")]
    assert dom.by_id("fingerprint") is not None and dom.by_id("plots") is not None
    summary = (pages["absent"].parent / "summary.md").read_text()
    assert "Slowest" not in summary and "### Environment" in summary


def test_a_section_registers_only_from_its_own_module_and_not_as_a_shared_template() -> None:
    class Stray(Best):  # defined here, not in reports/sections/best.py
        pass

    with pytest.raises(RuntimeError, match=r"must be defined in reports\.sections\.best"):
        index_sections.register(Stray)

    class Frame(Best):
        name = "report"  # reports/templates/report.html.j2, the page's frame

    Frame.__module__ = "reports.sections.report"
    with pytest.raises(RuntimeError, match="has the name of a template"):
        index_sections.register(Frame)
    assert [s.name for s in index_sections.sections()] == ["header", "banners", "parity", "best", "trials",
                                                           "rejected", "cells", "plots", "profile", "fingerprint"]  # fmt: skip
