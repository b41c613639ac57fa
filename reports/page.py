"""Static, offline HTML index page of a campaign: its frame (head, nav, assets) around the sections of
reports/sections/, each that applies in its order (reports/index_sections.py)."""

from __future__ import annotations

from pathlib import Path

from reports import index_sections
from reports.index_data import IndexPage
from reports.site_data import SiteExtras
from reports.site_format import TEMPLATE_DIR, atomic_copy, atomic_write, environment
from reports.views import CampaignView

PLOTLY_ASSET = "assets/plotly.min.js"
SITE_ASSETS = ("site.js", "site.css")  # copied from templates/ to assets/ beside plotly


def render_report(view: CampaignView, extras: SiteExtras | None = None, hrefs: dict[str, str] | None = None,
                  asset_dir: str = "assets") -> str:  # fmt: skip
    """The index page as HTML text; `hrefs` maps cell ids to their pages (relative), `asset_dir` is where the
    page loads plotly.js, site.js and site.css from (relative)."""
    page = IndexPage(view, extras or SiteExtras(), hrefs or {})
    sections, nav = index_sections.render(page)
    template = environment().get_template("report.html.j2")
    return template.render(view=view, extras=page.extras, nav=nav, sections=sections, asset_dir=asset_dir)


def _plotly_js_source() -> Path | None:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


def _copy_if_changed(source: Path, target: Path) -> None:
    src, dst = source.stat(), target.stat() if target.is_file() else None
    if dst is None or (dst.st_size, dst.st_mtime_ns) != (src.st_size, src.st_mtime_ns):
        atomic_copy(source, target)  # keeps the mtime: an unchanged asset is not copied again


def write_assets(out_dir: Path) -> Path:
    """Copy the installed plotly package's plotly.min.js, site.js and site.css to out_dir/assets/ so the pages
    work offline; returns the plotly asset's path."""
    target = Path(out_dir) / PLOTLY_ASSET
    target.parent.mkdir(parents=True, exist_ok=True)
    source = _plotly_js_source()
    if source is not None:
        _copy_if_changed(source, target)
    else:
        from plotly.offline import get_plotlyjs

        atomic_write(target, get_plotlyjs())
    for name in SITE_ASSETS:
        _copy_if_changed(TEMPLATE_DIR / name, target.parent / name)
    return target


def write_report(view: CampaignView, out_dir: Path, extra: dict[str, str] | None = None) -> Path:
    """Write out_dir/index.html alone (no cell pages: reports/site.py writes the whole site), its assets and the
    `extra` files (name → text), each whole or not at all; returns the page's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_assets(out_dir)
    page = out_dir / "index.html"
    atomic_write(page, render_report(view))
    for name, text in (extra or {}).items():
        atomic_write(out_dir / name, text)
    return page
