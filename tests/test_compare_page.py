"""The comparison page (`mbx compare ... --html DIR`): written by the real CLI from stores built on the recorded
H200 run dirs, loaded from disk in a real headless Chromium (no console errors), per pair and metric A, B, Δ
with its CI, the verdict, the diagnosis and fingerprint lines; user text shown literally, never as markup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_compare_cli import BASE, FUSED, add_campaign, compare
from test_report_page import console_messages, needs_chromium, parse, render_in_chromium

from orchestrator.judge import compare as cmp
from reports.compare_page import render_compare_page, write_compare_page

HOSTILE = '<script>alert("x")</script> & <b>bold</b> <img src=x onerror=alert(1)>'


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("cmp-page")
    add_campaign(ws, "base", [(BASE, r) for r in range(4)])
    add_campaign(
        ws, "fused", [(FUSED, r) for r in range(4)], fingerprint={"torch": "2.12.0", "git_sha": "c0ffee1"}
    )
    return ws


def _rows(section) -> dict[str, object]:
    return {tr.attrs["data-metric"]: tr for tr in section.find_all("tr") if "data-metric" in tr.attrs}


def _col(row, col: str) -> str:
    (cell,) = row.find_all("td", data_col=col)
    return cell.text().strip()


def test_page_written_by_the_cli_matches_the_json(workspace: Path, tmp_path: Path) -> None:
    out = tmp_path / "page"
    proc = compare(workspace, "base", "fused", "--html", str(out), "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert f"comparison page: {out / 'index.html'}" in proc.stderr  # stdout stays JSON
    dom = parse((out / "index.html").read_text(encoding="utf-8"))
    assert not dom.find_all("script")  # a static page: nothing to run, nothing fetched
    assert dom.by_id("overall").text() == "WORSE" and dom.by_id("overall").attrs["data-exit-code"] == "1"
    (section,) = dom.find_all("section", cls="pair")
    (pair,) = data["pairs"]
    rows = _rows(section)
    assert list(rows) == list(pair["metrics"])
    for name, metric in pair["metrics"].items():
        row = rows[name]
        assert row.attrs["data-decision"] == metric["decision"]
        assert _col(row, "change") == f"{metric['change']:+.2%}"
        if metric["test"].startswith("exact within a floor"):  # peak memory: its floor, not a CI
            assert _col(row, "ci") == f"exact, floor ±{(metric['ci_high'] - metric['ci_low']) / 2:.2%}"
        else:
            assert _col(row, "ci") == f"[{metric['ci_low']:+.2%}, {metric['ci_high']:+.2%}]"
        assert _col(row, "decision") == pair["verdicts"][name]
        assert _col(row, "a") == f"{metric['mean_a']:.5g}" and _col(row, "b") == f"{metric['mean_b']:.5g}"
    assert _col(rows["step_time"], "decision") == "DIFFERENT (worse)"
    diagnosis = [li.text() for li in section.find_all("li", cls="diagnosis")]
    assert diagnosis and all(line.startswith("diagnosis: ") for line in diagnosis)
    assert any("recompute (or offload) newly on?" in line for line in diagnosis)
    first = section.find_all("ul", cls="first")[0]  # what the sides ran differently: before the table
    assert [li.attrs["data-kind"] for li in first.find_all("li")][:1] == ["config"]
    tags = [(child.tag, child.classes) for child in section.children]
    assert tags.index(("ul", {"lines", "first"})) < tags.index(("table", {"metrics"}))
    assert dom.by_id("rule").text().startswith("DIFFERENT at p ≤ 0.01") and "TOST" in dom.by_id("rule").text()
    suspects = [li.text() for li in section.find_all("li", cls="suspect")]
    assert any("torch: 2.11.0+cu130 → 2.12.0" in line for line in suspects)
    assert any("git_sha: ? → c0ffee1" in line for line in suspects)


@needs_chromium
def test_page_renders_from_disk_in_chromium(workspace: Path, tmp_path: Path) -> None:
    out = tmp_path / "page"
    proc = compare(workspace, "base", "fused", "--html", str(out))
    assert proc.returncode == 1, proc.stderr
    dom, stderr = render_in_chromium(out / "index.html", tmp_path / "profile")
    assert console_messages(stderr) == []
    (section,) = dom.find_all("section", cls="pair")
    rows = _rows(section)
    bars = {name: row.find_all("svg", cls="ci") for name, row in rows.items()}
    assert all(len(found) == 1 for found in bars.values()), bars
    step = bars["step_time"][0]
    (dot,) = step.find_all("circle", cls="change")
    (band,) = step.find_all("rect", cls="band")
    assert float(dot.attrs["cx"]) > float(band.attrs["x"]) + float(
        band.attrs["width"]
    )  # +18%: right of the band
    assert "DIFFERENT (worse)" in _col(rows["step_time"], "decision")


@needs_chromium
def test_user_text_stays_text_in_chromium(workspace: Path, tmp_path: Path) -> None:
    data = cmp.to_json(cmp.compare_campaigns(workspace, "base", "fused"))
    data["a"] = data["b"] = HOSTILE
    pair = data["pairs"][0]
    for side in ("a", "b"):
        pair[side].update(campaign=HOSTILE, label=HOSTILE, point_id="</section><h1>x</h1>")
    pair["diagnosis"] = [HOSTILE]
    pair["fingerprint_diff"] = [f"container_image: {HOSTILE} → x"]
    data["unmatched"] = [HOSTILE]
    html = render_compare_page(data)
    assert "<script>alert" not in html and "<b>bold</b>" not in html and "<img" not in html
    page = write_compare_page(data, tmp_path / "hostile")
    dom, stderr = render_in_chromium(page, tmp_path / "profile")
    assert console_messages(stderr) == []
    assert not dom.find_all("script") and not dom.find_all("img") and not dom.find_all("b")
    assert not [h for h in dom.find_all("h1") if h.text() == "x"]
    assert dom.by_id("side-a").text() == HOSTILE and not dom.by_id("side-a").children
    (section,) = dom.find_all("section", cls="pair")
    assert section.find_all("li", cls="diagnosis")[-1].text() == f"diagnosis: {HOSTILE}"
    assert HOSTILE in section.find_all("span", cls="title-a")[0].text()
    assert dom.by_id("unmatched").find_all("li")[0].text() == HOSTILE


def test_page_directory_that_is_a_file_is_one_clean_error(workspace: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "page"
    blocker.write_text("not a directory")
    proc = compare(workspace, "base", "fused", "--html", str(blocker))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: the comparison page was not written")


def test_baseline_page_for_the_campaign_report(workspace: Path) -> None:
    from orchestrator.run.store import Store

    add_campaign(workspace, "fused-vs-base", [(FUSED, r) for r in range(2)])
    with Store(workspace) as store:
        cells = store.cells("fused-vs-base")
        store.register_campaign(
            "fused-vs-base", None, {"collect": {"window": 10}, "baseline": "base"}, "local", cells
        )
    page = cmp.write_baseline_page(workspace, "fused-vs-base")
    assert page == workspace / "fused-vs-base" / "report" / "compare" / "index.html"
    dom = parse(page.read_text(encoding="utf-8"))
    assert dom.by_id("side-a").text() == "base" and dom.by_id("side-b").text() == "fused-vs-base"
    assert dom.by_id("overall").text() == "WORSE"
    assert cmp.write_baseline_page(workspace, "base") is None  # no baseline: no page
