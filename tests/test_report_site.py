"""The report site: index, a page per cell, the comparison page; figures (heatmap of two axes, Pareto frontier,
per-step curves with knob-value legends), RSS on CPU runs, baseline deltas, estimates, rejected points, the
Markdown summary in a PR's shape; a real CPU campaign through `mbx report`; real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from report_fixtures import HOSTILE, campaign_view, hostile_view, step_rows
from test_report_page import CHROMIUM, Node, console_messages, needs_chromium, parse, render_in_chromium

from reports.gates import GateSpec, evaluate
from reports.markdown import markdown_summary, md_description
from reports.sections.cells import EAGER_ROWS
from reports.site import write_site
from reports.site_data import SiteExtras, cell_file
from reports.site_figures import axis_kind, frontier, heatmap_data
from reports.site_format import fmt_param
from reports.views import CampaignView, CellView
from reports.window import summarize

ARTIFACTS = Path(os.environ.get("MBX_TEST_ARTIFACTS", Path(tempfile.gettempdir()) / "mbx-test-artifacts"))


def _extras(view: CampaignView) -> SiteExtras:
    """Extras with known numbers: c1a0's baseline 10% slower, estimates for two points, one rejected point."""
    base = summarize(step_rows(tflops=372.7272, step_time_ms=902.0), 10)
    return SiteExtras(
        rejected=[
            {"point_id": "c3c0", "label": HOSTILE, "why": "gate fail: peak_alloc_gib_max", "kind": "gate"}
        ],
        winner="c2b0",
        how="best TFLOP/s/GPU: the runner-up differs by +11.2% [+9%, +13%] (DIFFERENT, p=0.001)",
        baselines={"c1a0": base},
        estimates=[
            {
                "point_id": "c1a0",
                "label": "a",
                "params": {},
                "estimate_gib": 48.0,
                "gpu": "H200",
                "gpu_gib": 139.8,
                "feasible": True,
                "reason": None,
            },
            {
                "point_id": "zz9",
                "label": "tp=3",
                "params": {},
                "estimate_gib": 300.0,
                "gpu": "H200",
                "gpu_gib": 139.8,
                "feasible": False,
                "reason": "estimate 300 GiB exceeds the H200's 139.8 GiB",
            },
        ],  # fmt: skip
        trials=[{"trial": 0, "method": "halving", "rung": 1, "point_id": "c1a0", "value": 410.0}],
        gpu_hours=12.5,
        gpu_hours_note="7 attempt(s)",
        compare_href="compare/index.html",
    )


def _rows(dom: Node) -> dict[str, Node]:
    table = dom.by_id("summary")
    assert table is not None
    return {r.attrs["data-point"]: r for r in table.find_all("tr") if "data-point" in r.attrs}


def _td(row: Node, col: str) -> str:
    (cell,) = row.find_all("td", data_col=col)
    return cell.text().strip()


def cpu_view() -> CampaignView:
    """Two CPU cells: GPU memory figures are 0, the rows carry the peak RSS."""
    cells = []
    for i, (top_k, rss) in enumerate(((1, 0.75), (2, 1.5))):
        rows = step_rows(steps=12, tflops=0.012 * top_k, alloc=0.0, reserved=0.0)
        for row in rows:
            row.update(mem_allocated_gib=0.0, rss_gib=rss * row["step"] / 12, eval_loss=row["loss"] + 0.1,
                       tokens_dropped_frac=0.01 * top_k)  # fmt: skip
        summary = summarize(rows, 5)
        cells.append(CellView(cell_id=f"cpu{i}-r0", point_id=f"cpu{i}", repeat=0, label=f"top_k={top_k}",
                              params={"model.moe.top_k": top_k}, state="completed", attempt=1, summary=summary,
                              rows=rows, gate=evaluate(GateSpec(), summary, "completed", None)))  # fmt: skip
    return CampaignView(name="cpu", description="", axes=["model.moe.top_k"], cells=cells, gates={}, window=5)


# ---------------------------------------------------------------- pure parts


def test_discrete_knobs_are_categories_in_numeric_order() -> None:
    assert axis_kind([16, 32, 24, 16]) == (True, [16, 24, 32])
    assert axis_kind([True, False]) == (True, [True, False])
    assert axis_kind(["b", "a", "b"]) == (True, ["b", "a"])
    assert axis_kind([1.0, 1.25, 2.0]) == (True, [1.0, 1.25, 2.0])  # few values: categories
    many = [0.1 * i + 0.05 for i in range(20)]
    assert axis_kind(many) == (False, [])  # many distinct real numbers: a linear axis


def test_pareto_frontier() -> None:
    # (memory, TFLOP/s): 1 and 3 dominate 0 and 2; 4 uses the most memory for the most throughput
    pairs = [(50.0, 400.0), (40.0, 420.0), (60.0, 410.0), (55.0, 450.0), (80.0, 470.0)]
    assert frontier(pairs) == [1, 3, 4]


def test_heatmap_grid_of_two_axes() -> None:
    view = campaign_view()
    heat = heatmap_data(view.points, view.axes, fmt_param)
    assert heat is not None and list(heat["pairs"]) == ["0|1"]
    pair = heat["pairs"]["0|1"]
    assert pair["x"] == ["1.0", "1.25", "1.5"]  # c5e0 (2.0) failed: not a completed point
    assert pair["y"] == ["16", "24", "32"]
    z = {(x, y): pair["z"][j][i] for i, x in enumerate(pair["x"]) for j, y in enumerate(pair["y"])}
    assert z[("1.25", "24")] == pytest.approx(view.points[2].mean("tflops_per_gpu"))
    assert z[("1.0", "32")] is None


def test_cell_file_names_are_safe_and_distinct() -> None:
    names = {cell_file(x) for x in ("a/b", "a_b", "../x", "h<1>", "", "é")}
    assert len(names) == 6
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+\.html", n) and not n.startswith(".") for n in names)


# ---------------------------------------------------------------- the written site


def test_site_index_cells_and_extras(tmp_path: Path) -> None:
    view = campaign_view()
    out = tmp_path / "site"
    (out / "cells").mkdir(parents=True)
    (out / "cells" / "stale-00000000.html").write_text("old")
    (out / "cells" / "notes.html").write_text("not ours")
    index = write_site(view, out, _extras(view), {"summary.md": "x"})
    assert index == out / "index.html" and (out / "summary.md").read_text() == "x"
    assert not (out / "cells" / "stale-00000000.html").exists() and (out / "cells" / "notes.html").exists()
    dom = parse(index.read_text(encoding="utf-8"))
    links = [a.attrs["href"] for a in dom.find_all("a", cls="cell-link")]
    assert sorted(links) == sorted(f"cells/{cell_file(c.cell_id)}" for c in view.cells)
    assert all((out / link).is_file() for link in links)
    assert dom.by_id("compare-link").attrs["href"] == "compare/index.html"
    assert dom.by_id("gpu-hours").text().startswith("12.50")
    assert (
        dom.by_id("best-cell").attrs["data-point"] == "c2b0" and "DIFFERENT" in dom.by_id("best-how").text()
    )
    (rejected,) = dom.by_id("rejected-list").find_all("li")
    assert rejected.attrs["data-kind"] == "gate" and HOSTILE in rejected.text() and not rejected.find_all("b")
    assert rejected.find_all("a")[0].attrs["href"] == f"cells/{cell_file('c3c0')}"
    rows = _rows(dom)
    assert _td(rows["c1a0"], "base_tflops") == "372.7" and _td(rows["c1a0"], "delta_tflops") == "+10.0%"
    assert _td(rows["c2b0"], "base_tflops") == "—"
    assert _td(rows["c1a0"], "estimate_gib") == "48.0" and _td(rows["c1a0"], "headroom_gib") == "89.8"
    assert _td(rows["c2b0"], "estimate_gib") == "—"
    infeasible = dom.by_id("infeasible-list").text()
    assert "zz9" in infeasible and "exceeds the H200" in infeasible
    trials = dom.by_id("trials-table")
    assert [th.text() for th in trials.find_all("th")] == ["trial", "rung", "steps", "state", "TFLOP/s/GPU", "vs leader",
                                                           "peak GiB", "last loss", "verdict", "point", "cost (steps)",
                                                           "GPU-h", "value", "why"]  # fmt: skip


def test_cell_page_shows_baseline_and_curves(tmp_path: Path) -> None:
    view = campaign_view()
    write_site(view, tmp_path, _extras(view))
    dom = parse((tmp_path / "cells" / cell_file("c1a0")).read_text(encoding="utf-8"))
    assert dom.by_id("cell-id").text() == "c1a0"
    assert dom.by_id("cell-name").text() == "capacity_factor=1.0, dispatcher_sms=16"
    assert dom.by_id("index-link").attrs["href"] == "../index.html"
    figures = {tr.attrs["data-figure"]: [td.text() for td in tr.find_all("td")] for tr in dom.by_id("figures-table").find_all("tr") if "data-figure" in tr.attrs}  # fmt: skip
    assert figures["tflops_per_gpu"][1:] == ["410.0", "372.7", "+10.0%"]
    assert figures["headroom_gib"][1] == "89.8"
    ids = [d.attrs["id"] for d in dom.find_all("div", cls="figure")]
    assert ids == ["fig-step-time", "fig-loss", "fig-grad-norm", "fig-tflops", "fig-memory"]
    scripts = dom.find_all("script")
    assert [(s.attrs["src"], s.attrs["data-plotly"]) for s in scripts if "src" in s.attrs] == [
        ("../assets/site.js", "../assets/plotly.min.js")
    ]


def test_cpu_runs_show_rss_not_zero(tmp_path: Path) -> None:
    view = cpu_view()
    dom = parse(write_site(view, tmp_path).read_text(encoding="utf-8"))
    rows = _rows(dom)
    assert (
        _td(rows["cpu0"], "peak_alloc_gib") == "0.75 RSS"
        and _td(rows["cpu1"], "peak_alloc_gib") == "1.50 RSS"
    )
    ids = [d.attrs["id"] for d in dom.find_all("div", cls="figure")]
    assert {"fig-eval-loss", "fig-dropped", "fig-memory", "fig-pareto"} <= set(ids)
    memory = json.loads(dom.find_all("script", data_target="fig-memory")[0].text())
    assert memory["layout"]["yaxis"]["title"]["text"] == "peak RSS (GiB, CPU run)"
    assert [t["name"] for t in memory["data"]] == ["top_k=1", "top_k=2"]  # legends by knob values
    pareto = json.loads(dom.find_all("script", data_target="fig-pareto")[0].text())
    assert pareto["data"][0]["x"] == [0.75, 1.5]
    cell = parse((tmp_path / "cells" / cell_file("cpu1-r0")).read_text(encoding="utf-8"))
    rss = [
        tr
        for tr in cell.by_id("figures-table").find_all("tr")
        if tr.attrs.get("data-figure") == "peak_rss_gib"
    ]
    assert rss and rss[0].find_all("td")[1].text() == "1.50"
    md = markdown_summary(view)
    assert "peak RSS 1.50 GiB (CPU run)" in md and "| 1.50 RSS |" in md and "0.00" not in md


def test_markdown_in_the_shape_of_a_pr() -> None:
    view = campaign_view()
    view.description = "Sweeps `moe.dispatcher_sms` and `capacity` <b>x</b> [link](y)"
    md = markdown_summary(view, _extras(view))
    heads = [line for line in md.splitlines() if line.startswith("### ")]
    assert heads[:4] == [
        "### Frozen configuration",
        "### Performance result",
        "### Validation",
        "### Failed gates",
    ]
    assert heads.index("### Rejected experiments") < heads.index("### Points")
    assert (
        "Sweeps `moe.dispatcher_sms` and `capacity` \\<b\\>x\\</b\\> \\[link\\](y)" in md
    )  # code kept, no \`
    assert "\\`" not in md.split("### Rejected")[0]
    assert "- Point: **`c2b0`**" in md and "(DIFFERENT, p=0.001)" in md
    assert "- Step time 760.0 ms, **455.5 TFLOP/s/GPU**, 12,000 tokens/s/GPU" in md
    assert "- Loss: 10.5000 → 5.8864; skipped=0, NaN=0" in md
    assert "- GPU-hours for the campaign: 12.50" in md
    assert '- `c3c0` [\\<script\\>alert("x")\\</script\\> &amp; \\<b\\>bold\\</b\\>] (gate): gate fail' in md


def test_md_description_keeps_code_spans_only() -> None:
    assert md_description("use `a|b` and *c*") == "use `a|b` and \\*c\\*"
    assert md_description("a ``x ` y`` b") == "a ``x ` y`` b"
    assert md_description("unbalanced ` tick") == "unbalanced \\` tick"


# ---------------------------------------------------------------- a real CPU campaign through the CLI


def _campaign(path: Path, name: str, axes: dict, **extra: object) -> Path:
    data = yaml.safe_load((ROOT / "campaigns" / "quickstart.yaml").read_text())
    data["trainer"]["recipe"]["training"].update(steps=10, eval_interval=4, eval_iters=1)
    data.update(name=name, collect={"window": 5}, wandb={"mode": "disabled"}, sweep={"axes": axes}, **extra)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def cpu_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Two real CPU campaigns (the second with the first as its baseline) and `mbx report --markdown`."""
    from conftest import run_mbx

    tmp = tmp_path_factory.mktemp("site-e2e")
    ws, env = tmp / "ws", {"MBX_CACHE_DIR": str(tmp / "cache"), "WANDB_MODE": "disabled"}
    cf = "model.moe.capacity_factor"
    base = _campaign(tmp / "base.yaml", "base", {cf: [1.0, 1.5], "model.moe.top_k": [2]})
    main = _campaign(tmp / "main.yaml", "main", {cf: [1.0, 1.5], "model.moe.top_k": [1, 2]}, baseline="base",
                     description="top-k × `capacity_factor` <i>on CPU</i>")  # fmt: skip
    for file in (base, main):
        done = run_mbx("campaign", "run", str(file), "--workspace", str(ws), env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    report = run_mbx("report", "main", "--workspace", str(ws), "--markdown", env=env)
    assert report.returncode == 0, report.stderr
    return ws / "main" / "report", report


def test_cpu_campaign_site_and_markdown(cpu_site: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    site, report = cpu_site
    assert report.stdout == (site / "summary.md").read_text(encoding="utf-8")  # only Markdown on stdout
    assert report.stderr.strip() == f"report: {site / 'index.html'}"
    assert "top-k × `capacity_factor` \\<i\\>on CPU\\</i\\>" in report.stdout
    assert "### Rejected experiments" in report.stdout
    # one repeat a side on a CPU: a winner is shown with its RSS, or the tie is said (never "no completed point")
    assert ("(CPU run)" in report.stdout) != ("No winner picked" in report.stdout and "TIE" in report.stdout)
    assert "No completed point to report" not in report.stdout
    dom = parse((site / "index.html").read_text(encoding="utf-8"))
    description = dom.by_id("campaign-description")
    assert [c.text() for c in description.children] == ["capacity_factor"]  # the code span, as <code>
    assert "top-k × " in description.text() and " <i>on CPU</i>" in description.text()  # the rest as text
    assert not description.find_all("i")
    rows = _rows(dom)
    assert len(rows) == 4 and all(_td(r, "peak_alloc_gib").endswith(" RSS") for r in rows.values())
    assert (
        sum(1 for r in rows.values() if _td(r, "base_tflops") != "—") == 2
    )  # top_k=2 points match the baseline
    assert (site / "compare" / "index.html").is_file() and dom.by_id("compare-link") is not None
    assert float(dom.by_id("gpu-hours").attrs["data-value"]) > 0
    if "(CPU run)" in report.stdout:  # a winner: the other three points are rejected with reasons
        assert len(dom.by_id("rejected-list").find_all("li")) == 3
    else:  # a tie with one repeat a side: no winner; only the points DIFFERENT (worse) than its leader are rejected
        rejected = dom.by_id("rejected-list")
        items = rejected.find_all("li") if rejected is not None else []
        assert len(items) <= 2 and all("slower than the leader" in li.text() for li in items)
    assert len(list((site / "cells").glob("*.html"))) == 4
    heat = json.loads(dom.by_id("heatmap-data").text())
    assert heat["pairs"]["0|1"]["x"] == ["1.0", "1.5"] and heat["pairs"]["0|1"]["y"] == ["1", "2"]


# ---------------------------------------------------------------- in a real browser

HARNESS = """<!DOCTYPE html><html><body><iframe id="f" src="%s" width="1400" height="900"></iframe><pre id="out"></pre>
<script>
var f = document.getElementById("f");
function rows(d) { return Array.prototype.map.call(d.querySelectorAll("#summary tbody tr"), function (r) { return r.getAttribute("data-point"); }); }
function run() {
  var d = f.contentDocument;
  if (!d || !d.documentElement.getAttribute("data-rendered-ms")) { setTimeout(run, 50); return; }
  var out = {scrollWidth: d.documentElement.scrollWidth, clientWidth: d.documentElement.clientWidth,
             boxWidth: d.getElementById("summary-box").clientWidth};
  var th = d.querySelector('#summary th[data-col="tflops_per_gpu"]');
  th.click(); out.asc = rows(d); out.sortedAsc = d.getElementById("summary").getAttribute("data-sorted");
  th.click(); out.desc = rows(d);
  var sx = d.getElementById("heatmap-x"), sy = d.getElementById("heatmap-y");
  sx.value = "1"; sy.value = "0"; sx.dispatchEvent(new Event("change"));
  out.pair = d.getElementById("fig-heatmap").getAttribute("data-pair");
  out.heatTitle = d.querySelector("#fig-heatmap .gtitle").textContent;
  document.getElementById("out").textContent = JSON.stringify(out);
}
f.addEventListener("load", run);
</script></body></html>"""


def _browse(page: Path, profile: Path) -> tuple[Node, str]:
    """render_in_chromium with file pages allowed to read each other (the harness reads its iframe)."""
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
               f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
               "--enable-logging=stderr", "--v=0", "--window-size=1500,1000", "--virtual-time-budget=15000",
               "--dump-dom", page.resolve().as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return parse(done.stdout), done.stderr


def _plotted(dom: Node) -> list[str]:
    figures = dom.find_all("div", cls="figure")
    assert figures
    for fig in figures:
        assert "js-plotly-plot" in fig.classes, f"{fig.attrs['id']} was not plotted"
        assert fig.find_all("svg", cls="main-svg") and not fig.find_all(cls="plot-error"), fig.attrs["id"]
    return [f.attrs["id"] for f in figures]


@needs_chromium
def test_index_sorts_fits_and_switches_heatmap_in_chromium(tmp_path: Path) -> None:
    view = campaign_view()
    write_site(view, tmp_path / "site", _extras(view))
    harness = tmp_path / "harness.html"
    harness.write_text(HARNESS % "site/index.html", encoding="utf-8")
    dom, stderr = _browse(harness, tmp_path / "profile")
    assert console_messages(stderr) == []
    out = json.loads(dom.by_id("out").text())
    assert out["scrollWidth"] <= out["clientWidth"] <= 1400  # the page fits; the table scrolls in its own box
    measured = sorted((p for p in view.points if p.mean("tflops_per_gpu") is not None), key=lambda p: p.mean("tflops_per_gpu"))  # fmt: skip
    assert (
        out["asc"][: len(measured)] == [p.point_id for p in measured]
        and out["sortedAsc"] == "tflops_per_gpu:asc"
    )
    assert out["desc"][: len(measured)] == [p.point_id for p in reversed(measured)]
    assert out["pair"] == "1|0" and out["heatTitle"].startswith(
        "TFLOP/s/GPU: model.moe.capacity_factor × moe.dispatcher_sms"
    )


@needs_chromium
def test_index_cell_and_comparison_pages_in_chromium(tmp_path: Path, cpu_site: tuple[Path, object]) -> None:
    site, _ = cpu_site
    dom, stderr = render_in_chromium(site / "index.html", tmp_path / "p1")
    assert console_messages(stderr) == []
    assert {"fig-heatmap", "fig-pareto", "fig-loss", "fig-eval-loss", "fig-memory", "fig-tflops"} <= set(
        _plotted(dom)
    )
    legend = [t.text() for t in dom.by_id("fig-loss").find_all("text", cls="legendtext")]
    assert sorted(legend) == sorted(
        f"capacity_factor={cf}, top_k={k}" for cf in ("1.0", "1.5") for k in (1, 2)
    )
    cell = next((site / "cells").glob("*.html"))
    dom, stderr = render_in_chromium(cell, tmp_path / "p2")
    assert console_messages(stderr) == []
    assert {"fig-loss", "fig-grad-norm", "fig-memory", "fig-eval-loss"} <= set(_plotted(dom))
    dom, stderr = render_in_chromium(site / "compare" / "index.html", tmp_path / "p3")
    assert console_messages(stderr) == [] and dom.by_id("side-a").text() == "base"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report-site-index.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p4'}",
                    "--window-size=1400,2400", "--virtual-time-budget=10000", f"--screenshot={shot}",
                    (site / "index.html").as_uri()], capture_output=True, timeout=120, check=True)  # fmt: skip
    assert shot.stat().st_size > 20_000


@needs_chromium
def test_payloads_render_as_text_in_chromium(tmp_path: Path) -> None:
    view = hostile_view()
    extras = SiteExtras(rejected=[{"point_id": HOSTILE, "label": HOSTILE, "why": HOSTILE, "kind": "<b>x</b>"}],
                        trials=[{"<i>k</i>": HOSTILE}])  # fmt: skip
    index = write_site(view, tmp_path / "site", extras)
    for page in [index, *sorted((tmp_path / "site" / "cells").glob("*.html"))]:
        dom, stderr = render_in_chromium(page, tmp_path / f"p-{page.stem}")
        assert console_messages(stderr) == [], page
        assert not dom.find_all("b") and not dom.find_all("i") and not dom.find_all("img"), page
        assert HOSTILE in dom.text(), page
    dom, _ = render_in_chromium(index, tmp_path / "p-index2")
    assert dom.by_id("rejected-list").find_all("li")[0].text().count(HOSTILE) == 3
    cell = parse((tmp_path / "site" / "cells" / cell_file("h<1>")).read_text(encoding="utf-8"))
    assert cell.by_id("cell-id").text() == "h<1>" and not cell.by_id("cell-id").children


def many_view(cells: int = 130) -> CampaignView:
    """More cells than the index lays out at once: rows past the first EAGER_ROWS wait in a <template>."""
    out = []
    for i in range(cells):
        rows = step_rows(steps=12, tflops=300.0 + (i * 37) % 101, step_time_ms=800.0)
        summary = summarize(rows, 5)
        out.append(CellView(cell_id=f"m{i:03d}", point_id=f"m{i:03d}", repeat=0, label=f"x={i}", params={"x": i},
                            state="completed", attempt=1, summary=summary, rows=rows,
                            gate=evaluate(GateSpec(), summary, "completed", None)))  # fmt: skip
    return CampaignView(name="many", description="", axes=["x"], cells=out, gates={}, window=5)


@needs_chromium
def test_deferred_rows_join_the_table_and_sort_in_chromium(tmp_path: Path) -> None:
    view = many_view()
    index = write_site(view, tmp_path / "site")
    static = parse(index.read_text(encoding="utf-8"))
    (more,) = static.find_all("template")
    assert len(more.find_all("tr")) == len(view.cells) - EAGER_ROWS
    dom, stderr = render_in_chromium(index, tmp_path / "p1")
    assert console_messages(stderr) == [] and not dom.find_all("template")
    assert list(_rows(dom)) == [c.point_id for c in view.cells]
    assert len(dom.by_id("curve-note").text()) > 0 and len(_plotted(dom)) >= 6
    harness = tmp_path / "harness.html"
    harness.write_text(HARNESS.replace("var sx =", "return done(out); var sx =").replace(
        "function run() {", "function done(out) { document.getElementById('out').textContent = JSON.stringify(out); }\nfunction run() {"
    ) % "site/index.html", encoding="utf-8")  # fmt: skip
    dom, stderr = _browse(harness, tmp_path / "p2")
    assert console_messages(stderr) == []
    out = json.loads(dom.by_id("out").text())
    assert len(out["asc"]) == len(view.cells)  # the deferred rows joined before sorting
    by_id = {p.point_id: p.mean("tflops_per_gpu") for p in view.points}
    assert [by_id[i] for i in out["asc"]] == sorted(by_id.values())
    assert out["scrollWidth"] <= out["clientWidth"]


@needs_chromium
def test_profile_section_and_breakdown_from_a_trace(tmp_path: Path) -> None:
    """A cell whose run dir holds a profiler trace: the index shows reports/profile_view.py's stacked bars, the
    cell page the ms per kernel class."""
    view = campaign_view()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(
        ROOT / "tests" / "data" / "traces" / "moe_proxy_step8.trace.json.gz",
        run_dir / "profile-trace.json.gz",
    )
    view.cells[2].run_dir = str(run_dir)
    index = write_site(view, tmp_path / "site")
    dom, stderr = render_in_chromium(index, tmp_path / "p1")
    assert console_messages(stderr) == []
    section = dom.by_id("profile")
    assert section is not None and "capacity_factor=1.25, dispatcher_sms=24" in section.text()
    cell, stderr = render_in_chromium(
        tmp_path / "site" / "cells" / cell_file(view.cells[2].cell_id), tmp_path / "p2"
    )
    assert console_messages(stderr) == []
    classes = [tr.find_all("td")[0].text() for tr in cell.by_id("breakdown-table").find_all("tr")]
    assert "GEMM" in classes and all(
        tr.find_all("td")[1].text().endswith(" ms") for tr in cell.by_id("breakdown-table").find_all("tr")
    )
