"""The HTML report page: structure and escaping from the written file, and rendering in a real headless Chromium."""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from report_fixtures import HOSTILE, campaign_view, empty_view, hostile_view, mismatched_view

from reports.page import PLOTLY_ASSET, render_report, write_report
from reports.site_format import fmt_number
from reports.views import CampaignView

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)"
)


# ---------------------------------------------------------------- a small DOM built with the stdlib parser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        out = list(self.parts)
        for child in self.children:
            out.append(child.text())
        return "".join(out)

    def iter(self):
        yield self
        for child in self.children:
            yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        found = []
        for node in self.iter():
            if tag is not None and node.tag != tag:
                continue
            if cls is not None and cls not in node.classes:
                continue
            if any(node.attrs.get(k.replace("_", "-")) != v for k, v in attrs.items()):
                continue
            found.append(node)
        return found

    def by_id(self, node_id: str) -> Node | None:
        hits = [n for n in self.iter() if n.attrs.get("id") == node_id]
        assert len(hits) <= 1, f"duplicate id {node_id}"
        return hits[0] if hits else None


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].parts.append(data)


def parse(html: str) -> Node:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root


# ---------------------------------------------------------------- headless Chromium from disk, offline


def render_in_chromium(page: Path, profile: Path) -> tuple[Node, str]:
    """Load the page from file:// with every network request sent to a dead proxy; the DOM after scripts ran."""
    assert CHROMIUM is not None
    profile.mkdir(parents=True, exist_ok=True)
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        # No network: any http(s) fetch goes to a closed port and no name resolves.
        "--proxy-server=127.0.0.1:9",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,2000",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return parse(done.stdout), done.stderr


def console_messages(stderr: str) -> list[str]:
    """Page console output (messages and uncaught errors) that Chromium logs with --enable-logging."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _summary_rows(dom: Node) -> dict[str, Node]:
    table = dom.by_id("summary")
    assert table is not None
    rows = [r for r in table.find_all("tr") if "data-cell" in r.attrs]
    return {r.attrs["data-cell"]: r for r in rows}


def _td(row: Node, col: str) -> Node:
    hits = row.find_all("td", data_col=col)
    assert len(hits) == 1, col
    return hits[0]


def _check_table(dom: Node, view: CampaignView) -> None:
    rows = _summary_rows(dom)
    assert list(rows) == [c.cell_id for c in view.cells]
    for cell in view.cells:
        row = rows[cell.cell_id]
        assert row.attrs["data-verdict"] == (cell.gate.verdict if cell.gate else "none")
        assert row.attrs["data-state"] == cell.state
        s = cell.summary
        tflops = _td(row, "tflops_per_gpu")
        if s is None or s.tflops_per_gpu is None:
            assert tflops.text().strip() == "—"
            assert "data-value" not in tflops.attrs
        else:
            assert tflops.text().strip() == fmt_number(s.tflops_per_gpu, 1)
            assert math.isclose(float(tflops.attrs["data-value"]), s.tflops_per_gpu, rel_tol=1e-12)
            assert _td(row, "step_time_ms").text().strip() == fmt_number(s.step_time_ms, 1)
            assert _td(row, "peak_alloc_gib").text().strip() == fmt_number(s.peak_alloc_gib, 2)
            assert _td(row, "nan_iterations").text().strip() == str(s.nan_iterations)
        failed = [li.text() for li in _td(row, "verdict").find_all("li", cls="failed")]
        assert failed == [c.message for c in (cell.gate.failed if cell.gate else [])]


# ---------------------------------------------------------------- tests without a browser

# The index's figures of campaign_view(): heatmap, Pareto, TFLOP/s per axis, per-step curves.
FIGURES = ["fig-heatmap", "fig-pareto", "fig-axis-0", "fig-axis-1", "fig-step-time", "fig-loss", "fig-grad-norm",
           "fig-tflops", "fig-memory"]  # fmt: skip


def _scripts_are_ours(dom: Node) -> None:
    """Every <script> is ours: site.js (which loads plotly) from assets/, and JSON data (figures, heatmap)."""
    scripts = dom.find_all("script")
    srcs = [(s.attrs["src"], s.attrs.get("data-plotly")) for s in scripts if "src" in s.attrs]
    assert srcs == [("assets/site.js", PLOTLY_ASSET)]
    data = [s for s in scripts if "src" not in s.attrs]
    assert all(s.attrs.get("type") == "application/json" for s in data)
    assert len(data) == len(dom.find_all("div", cls="figure"))


def test_page_written_with_local_plotly(tmp_path: Path) -> None:
    page = write_report(campaign_view(), tmp_path / "report")
    assert page == tmp_path / "report" / "index.html"
    asset = tmp_path / "report" / PLOTLY_ASSET
    assert asset.stat().st_size > 1_000_000
    dom = parse(page.read_text(encoding="utf-8"))
    scripts = [s for s in dom.find_all("script") if "src" in s.attrs]
    srcs = [s.attrs["src"] for s in scripts] + [s.attrs["data-plotly"] for s in scripts]
    assert srcs == [
        "assets/site.js",
        PLOTLY_ASSET,
    ]  # relative, no CDN; site.js loads plotly once the page has loaded
    assert (tmp_path / "report" / "assets" / "site.js").is_file()
    hrefs = [n.attrs.get("href", "") for n in dom.find_all("link")]
    assert hrefs == ["assets/site.css"]
    assert not [u for u in srcs + hrefs if u.startswith(("http:", "https:", "//"))]


def test_table_rows_verdicts_and_best(tmp_path: Path) -> None:
    view = campaign_view()
    dom = parse(write_report(view, tmp_path).read_text(encoding="utf-8"))
    _check_table(dom, view)
    best = view.best_point()
    assert best is not None and best.repeats[0].cell_id == "c2b0"  # c3c0 is faster but fails its memory gate
    marked = [r.attrs["data-cell"] for r in _summary_rows(dom).values() if r.attrs.get("data-best") == "true"]
    assert marked == ["c2b0"]
    best_line = dom.by_id("best-cell")
    assert best_line is not None and best_line.attrs["data-cell"] == "c2b0"
    failure = _td(_summary_rows(dom)["c5e0"], "failure").text()
    assert "oom" in failure and "CUDA out of memory on rank 3" in failure
    assert dom.by_id("fingerprint-warning") is None
    assert dom.by_id("no-completed") is None
    gates = {n.attrs["data-gate"] for n in dom.find_all("code", cls="gate")}
    assert gates == {"tflops_per_gpu_min", "peak_alloc_gib_max", "loss_finite"}
    header = dom.by_id("header")
    assert header is not None
    for text in ("moe-dispatch", "campaigns/moe-dispatch.yaml", "2026-12-02T12:00:00Z", "last 10 steps"):
        assert text in header.text()
    figure_ids = [n.attrs["id"] for n in dom.find_all("div", cls="figure")]
    assert figure_ids == FIGURES


def test_fingerprint_mismatch_warns(tmp_path: Path) -> None:
    dom = parse(write_report(mismatched_view(), tmp_path).read_text(encoding="utf-8"))
    warning = dom.by_id("fingerprint-warning")
    assert warning is not None
    named = [c.text() for c in warning.find_all("code")]
    assert named == ["driver", "torch"]  # hostname differs too, but is not an environment key
    table = dom.by_id("fingerprint-table")
    assert table is not None
    differs = [r.attrs["data-key"] for r in table.find_all("tr", cls="differs")]
    assert differs == ["driver", "torch"]
    assert "c2b0" in table.find_all("tr", data_key="cells")[0].text()


def test_user_values_are_escaped(tmp_path: Path) -> None:
    view = hostile_view()
    html = write_report(view, tmp_path).read_text(encoding="utf-8")
    assert "<script>alert" not in html
    assert '<a href="x">' not in html
    assert "<b>bold</b>" not in html
    dom = parse(html)
    name = dom.by_id("campaign-name")
    assert name is not None and name.text() == view.name and not name.children
    description = dom.by_id("campaign-description")
    assert description is not None and description.text() == HOSTILE and not description.children
    rows = _summary_rows(dom)
    assert list(rows) == ["h<1>", "h&2"]
    assert _td(rows["h<1>"], "param").text() == HOSTILE
    assert HOSTILE in _td(rows["h&2"], "failure").text()
    _scripts_are_ours(dom)


def test_zero_completed_cells(tmp_path: Path) -> None:
    view = empty_view()
    dom = parse(write_report(view, tmp_path).read_text(encoding="utf-8"))
    assert dom.by_id("no-completed") is not None
    best_line = dom.by_id("best-cell")
    assert best_line is not None and "data-cell" not in best_line.attrs
    _check_table(dom, view)
    assert dom.by_id("gates") is not None and "none configured" in dom.by_id("gates").text()


def test_nothing_measured_at_all(tmp_path: Path) -> None:
    view = empty_view()
    for cell in view.cells:
        cell.rows, cell.summary, cell.fingerprint = [], None, None
    view.axes = []
    dom = parse(write_report(view, tmp_path).read_text(encoding="utf-8"))
    assert dom.by_id("no-axis-figures") is not None
    assert dom.by_id("no-curves") is not None
    assert not dom.find_all("div", cls="figure")


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=_text, description=_text, labels=st.lists(_text, min_size=1, max_size=3), reason=_text)
def test_any_user_text_stays_text(name: str, description: str, labels: list[str], reason: str) -> None:
    view = campaign_view()
    view.name, view.description = name, description
    for cell, label in zip(view.cells, labels, strict=False):
        cell.label, cell.cell_id = label, f"{label}#{cell.cell_id}"
        cell.params[view.axes[0]] = label
    view.cells[-2].reason = reason
    dom = parse(render_report(view))
    heading = dom.by_id("campaign-name")
    assert heading is not None and heading.text() == name
    assert heading is not None and not heading.children
    assert list(_summary_rows(dom)) == [c.cell_id for c in view.cells]
    _scripts_are_ours(dom)


# ---------------------------------------------------------------- in a real browser


LEGENDS = {
    "c1a0": "capacity_factor=1.0, dispatcher_sms=16",
    "c1a1": "capacity_factor=1.0, dispatcher_sms=16 (repeat 1)",
    "c2b0": "capacity_factor=1.25, dispatcher_sms=24",
    "c3c0": "capacity_factor=1.5, dispatcher_sms=24",
    "c4d0": "capacity_factor=1.5, dispatcher_sms=32",
    "c5e0": "capacity_factor=2.0, dispatcher_sms=32",
}


@needs_chromium
def test_page_renders_offline_in_chromium(tmp_path: Path) -> None:
    view = campaign_view()
    page = write_report(view, tmp_path / "report")
    dom, stderr = render_in_chromium(page, tmp_path / "profile")
    assert console_messages(stderr) == []
    figures = dom.find_all("div", cls="figure")
    assert [f.attrs["id"] for f in figures] == FIGURES
    for fig in figures:
        assert "js-plotly-plot" in fig.classes, f"{fig.attrs['id']} was not plotted"
        assert fig.find_all("svg", cls="main-svg"), fig.attrs["id"]
        assert not fig.find_all(cls="plot-error")
    with_rows = [c for c in view.cells if c.rows]
    loss = dom.by_id("fig-loss")
    assert loss is not None
    assert len(loss.find_all("g", cls="trace")) == len(with_rows)
    legend = [t.text() for t in loss.find_all("text", cls="legendtext")]
    assert legend == [LEGENDS[c.cell_id] for c in with_rows]  # by knob values, not ids
    axis0 = dom.by_id("fig-axis-0")
    assert axis0 is not None
    points = axis0.find_all("path", cls="point")
    measured = [c for c in view.cells if c.summary and c.summary.tflops_per_gpu is not None]
    assert len(points) == len(measured) + 1  # one marker per cell (repeats apart), plus the best star
    _check_table(dom, view)
    marked = [r for r in _summary_rows(dom).values() if r.attrs.get("data-best") == "true"]
    assert [r.attrs["data-cell"] for r in marked] == ["c2b0"]
    assert dom.by_id("fingerprint-warning") is None


@needs_chromium
def test_fingerprint_warning_and_escaping_in_chromium(tmp_path: Path) -> None:
    dom, stderr = render_in_chromium(write_report(mismatched_view(), tmp_path / "a"), tmp_path / "p1")
    assert console_messages(stderr) == []
    warning = dom.by_id("fingerprint-warning")
    assert warning is not None and "driver" in warning.text() and "torch" in warning.text()

    view = hostile_view()
    dom, stderr = render_in_chromium(write_report(view, tmp_path / "b"), tmp_path / "p2")
    assert console_messages(stderr) == []
    name = dom.by_id("campaign-name")
    assert name is not None and name.text() == view.name and not name.children
    description = dom.by_id("campaign-description")
    assert description is not None and description.text() == HOSTILE and not description.children
    # plotly renders a few HTML tags in labels; user text must show literally there too
    axis0 = dom.by_id("fig-axis-0")
    assert axis0 is not None and "js-plotly-plot" in axis0.classes
    ticks = [t.text() for t in axis0.find_all("text") if HOSTILE in t.text()]
    assert ticks, "the hostile category label is shown literally"
    assert not [n for n in axis0.find_all("b")] + [n for n in axis0.find_all("a")]


@needs_chromium
def test_damaged_files_are_named_in_chromium(tmp_path: Path) -> None:
    """A cell whose run-dir files are damaged keeps its stored figures; the banner and its row name the files."""
    view = campaign_view()
    cell = next(c for c in view.cells if c.summary is not None)
    cell.damaged = [
        f"/runs/{cell.cell_id}/1/metrics.jsonl:2: not a JSON object: b'<b>x</b>' (the file is corrupt)"
    ]
    dom, stderr = render_in_chromium(write_report(view, tmp_path / "report"), tmp_path / "profile")
    assert console_messages(stderr) == []
    banner = dom.by_id("damaged-warning")
    assert banner is not None and cell.cell_id in banner.text()
    row = _summary_rows(dom)[cell.cell_id]
    notes = [li.text() for li in _td(row, "failure").find_all("li", cls="damaged")]
    assert notes == [f"damaged: {cell.damaged[0]}"]
    _check_table(dom, view)  # the stored figures are still shown
