"""A workspace moved or copied elsewhere (cluster scratch to a laptop, a CI artifact unpacked) reads and judges the
same: status, freeze, compare and the report give the same verdicts and figures after the move, with no cell
"damaged"; so does a store written before run dirs were recorded relative to the workspace (absolute paths).
Real `mbx` subprocesses on a real bundled-trainer campaign (CPU) and on real H200 run dirs."""

from __future__ import annotations

import copy
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY_MOE_RECIPE, run_mbx

from orchestrator.run.store import STORE_FILE, CellRow, Store
from reports.window import summarize
from trainer import rundir

NAME = "tiny"
SAMPLES = ROOT / "tests" / "data" / "h200-samples"
PAIR = {"45ad6c6851-r0": "native", "7db0e86111-r0": "fused"}  # one repeat a point: per-step samples decide
FORMS = ["relative", "absolute-before-the-change"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace where a real two-point campaign (one repeat each) completed on the bundled trainer."""
    tmp = tmp_path_factory.mktemp("moved")
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 6
    data = {"name": NAME, "trainer": {"recipe": recipe}, "sweep": {"axes": {"model.moe.top_k": [1, 2]}},
            "collect": {"window": 3}, "wandb": {"mode": "disabled"}}  # fmt: skip
    (tmp / "tiny.yaml").write_text(json.dumps(data))
    env = {"MBX_CACHE_DIR": str(tmp / "cache"), "WANDB_MODE": "disabled"}
    result = run_mbx("campaign", "run", str(tmp / "tiny.yaml"), "--workspace", str(tmp / "ws"), "--no-report",
                     env=env)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp / "ws"


def _stored_run_dirs(workspace: Path) -> list[str]:
    db = sqlite3.connect(workspace / STORE_FILE)
    try:
        return [r[0] for r in db.execute("SELECT run_dir FROM attempts ORDER BY cell_id, attempt")]
    finally:
        db.close()


def _make_absolute(workspace: Path) -> None:
    """The store as mbx wrote it before run dirs were relative: each run dir's absolute path (in `workspace`)."""
    db = sqlite3.connect(workspace / STORE_FILE)
    db.execute("UPDATE attempts SET run_dir = ? || '/' || campaign || '/' || cell_id || '/' || attempt",
               (str(workspace),))  # fmt: skip
    db.commit()
    db.close()
    assert all(Path(p).is_relative_to(workspace) for p in _stored_run_dirs(workspace))


def _mbx(*args: str) -> str:
    result = run_mbx(*args)
    text = result.stdout + result.stderr
    assert "Traceback" not in text and result.returncode in (0, 1, 3), text
    return f"exit {result.returncode}\n{text}"


def _judged(workspace: Path, campaign: str, every: bool) -> dict[str, str]:
    """What status and freeze (with `every`, also compare and the report) say of `campaign`, with the workspace's
    path made neutral."""
    ws = str(workspace)
    said = {
        "status": _mbx("campaign", "status", campaign, "--workspace", ws),
        "status --json": _mbx("campaign", "status", campaign, "--workspace", ws, "--json"),
        "freeze": _mbx("freeze", campaign, "--workspace", ws, "--json"),
    }
    if every:
        said["compare"] = _mbx("compare", campaign, campaign, "--workspace", ws, "--json")
        said["report"] = _mbx("report", campaign, "--workspace", ws)
        said["summary.md"] = (workspace / campaign / "report" / "summary.md").read_text()
    return {what: text.replace(ws, "<workspace>") for what, text in said.items()}


def _move(source: Path, target: Path) -> Path:
    """`source` moved to `target` the way a user moves a workspace (nothing is left at the old path)."""
    shutil.move(source, target)
    assert not source.exists()
    return target


@pytest.mark.parametrize("form", FORMS)
def test_moved_campaign_judges_the_same(finished: Path, tmp_path: Path, form: str) -> None:
    before_ws = tmp_path / "gpu" / "ws"
    shutil.copytree(finished, before_ws, symlinks=True)
    if form == FORMS[0]:
        on_disk = sorted(before_ws.glob(f"{NAME}/*/1"))
        assert _stored_run_dirs(before_ws) == [str(p.relative_to(before_ws)) for p in on_disk] and on_disk
    else:
        _make_absolute(before_ws)
    before = _judged(before_ws, NAME, every=form == FORMS[0])  # they share the reader: one form runs them all
    status = before["status"]
    assert "PASS 2/2 completed" in status and ("\nbest: " in status or "\nno best point: " in status), status

    after_ws = _move(before_ws, tmp_path / "laptop" / "ws")
    after = _judged(after_ws, NAME, every=form == FORMS[0])
    for what, text in after.items():
        assert "damaged:" not in text and "directory is missing" not in text, (
            f"{what} after the move:\n{text}"
        )
        assert text == before[what], f"{what} changed with the move"
    cells = json.loads(after["status --json"].split("\n", 1)[1])["cells"]
    assert [c["damaged"] for c in cells] == [[], []] and all(c["summary"] for c in cells)


@pytest.mark.parametrize("form", FORMS)
def test_a_run_dir_truly_missing_after_a_move_is_still_damaged(
    finished: Path, tmp_path: Path, form: str
) -> None:
    before_ws = tmp_path / "a" / "ws"
    shutil.copytree(finished, before_ws, symlinks=True)
    if form != FORMS[0]:
        _make_absolute(before_ws)
    after_ws = _move(before_ws, tmp_path / "b" / "ws")
    gone = sorted(after_ws.glob(f"{NAME}/*/1"))[0]
    shutil.rmtree(gone)
    text = _mbx("campaign", "status", NAME, "--workspace", str(after_ws))
    held = before_ws / gone.relative_to(after_ws)  # an old store holds the path before the move
    looked_for = gone if form == FORMS[0] else held
    flat = " ".join(text.split())
    assert f"{looked_for}: the run directory is missing" in flat, text
    assert flat.count("the run directory is missing") == 1, text


def _pair_workspace(workspace: Path) -> None:
    """Campaign `pair`: one repeat each of two points recorded on an H200 (tests/data/h200-samples), ~16% apart in
    TFLOP/s/GPU: one run a side, only the per-step samples in the run dirs make that DIFFERENT."""
    spec = yaml.safe_load((SAMPLES / "campaign.yaml").read_text())
    spec.update(name="pair", sweep={"axes": {"cross_entropy": list(PAIR.values())}})
    cells = [CellRow(campaign="pair", cell_id=cell, point_id=cell.split("-")[0], repeat=0, ordinal=i, label=label,
                     params={"cross_entropy": label}, recipe={}, resources={}, env={})
             for i, (cell, label) in enumerate(PAIR.items())]  # fmt: skip
    with Store(workspace) as store:
        store.register_campaign("pair", None, spec, "local", cells)
        for cell in cells:
            attempt = store.reserve_attempt("pair", cell.cell_id, "local",
                                            lambda n, c=cell: workspace / "pair" / c.cell_id / str(n))  # fmt: skip
            run_dir = Path(attempt.run_dir)
            for item in (SAMPLES / "aa-samples-h200" / cell.cell_id / "1").iterdir():
                shutil.copy(item, run_dir / item.name)
            summary = summarize(rundir.read_metrics(run_dir), 10).to_dict()
            store.record_outcome(
                "pair", cell.cell_id, attempt.attempt, "completed", None, None, summary, None
            )


@pytest.mark.parametrize("form", FORMS)
def test_best_stays_different_after_a_move(tmp_path: Path, form: str) -> None:
    """The symptom as seen: moved, `best:` fell to "TIE ... (some UNKNOWN ...)" and another point won the
    tie-break; with the run dirs found it is DIFFERENT and the faster point wins."""
    before_ws = tmp_path / "root" / "ws"
    _pair_workspace(before_ws)
    if form != FORMS[0]:
        _make_absolute(before_ws)
    ws = str(before_ws)
    best_before = _mbx("campaign", "status", "pair", "--workspace", ws).split("best: ", 1)[1]
    frozen_before = json.loads(_mbx("freeze", "pair", "--workspace", ws, "--json").split("\n", 1)[1])
    assert best_before.startswith("45ad6c6851 [native]") and "(DIFFERENT, p=" in best_before, best_before
    assert frozen_before["point_id"] == "45ad6c6851"

    after_ws = _move(before_ws, tmp_path / "tmp" / "gpu" / "ws")
    ws = str(after_ws)
    status = _mbx("campaign", "status", "pair", "--workspace", ws)
    frozen = json.loads(_mbx("freeze", "pair", "--workspace", ws, "--json").split("\n", 1)[1])
    assert "damaged" not in status and status.split("best: ", 1)[1] == best_before, status
    assert (frozen["point_id"], frozen["how"], frozen["rejected"]) == (
        frozen_before["point_id"], frozen_before["how"], frozen_before["rejected"])  # fmt: skip


def test_resolve_run_dir(tmp_path: Path) -> None:
    """The one reading of a stored run dir: relative against the workspace; an old absolute path by its tail under
    this workspace (a requeued run's archive too); otherwise as stored."""
    from orchestrator.run.store import resolve_run_dir

    workspace = tmp_path / "now"
    (workspace / "c" / "cell-r0" / "2" / "requeued" / "0").mkdir(parents=True)
    old = "/gone/ws/c/cell-r0/2"
    assert resolve_run_dir(workspace, "c/cell-r0/2", "c", "cell-r0") == str(workspace / "c/cell-r0/2")
    assert resolve_run_dir(workspace, old, "c", "cell-r0") == str(workspace / "c/cell-r0/2")
    assert resolve_run_dir(workspace, old + "/requeued/0", "c", "cell-r0") == str(
        workspace / "c/cell-r0/2/requeued/0")  # fmt: skip
    assert resolve_run_dir(workspace, "/gone/ws/c/cell-r0/3", "c", "cell-r0") == "/gone/ws/c/cell-r0/3"
    assert (
        resolve_run_dir(workspace, "/gone/ws/other/cell-r0/2", "c", "cell-r0") == "/gone/ws/other/cell-r0/2"
    )
    inside = str(workspace / "c/cell-r0/9")  # an absolute path inside this workspace is taken as it is
    assert resolve_run_dir(workspace, inside, "c", "cell-r0") == inside


def test_a_schema_2_store_is_brought_to_3_and_an_older_mbx_would_refuse_it(tmp_path: Path) -> None:
    """Relative run dirs are schema 3: a schema-2 store (absolute run dirs) is migrated when opened (read-only
    openers see it migrated in memory, the file untouched), and a store newer than this mbx is refused."""
    from orchestrator.errors import StoreTooNew
    from orchestrator.run.store import SCHEMA_VERSION

    assert SCHEMA_VERSION == 3
    ws = tmp_path / "ws"
    Store(ws).close()
    path = ws / STORE_FILE

    def set_version(value: str) -> None:
        db = sqlite3.connect(path)
        db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (value,))
        db.commit()
        db.close()

    def version() -> str:
        db = sqlite3.connect(path)
        try:
            return db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
        finally:
            db.close()

    set_version("2")
    Store(ws, create=False, read_only=True).close()
    assert version() == "2"  # a reader leaves the file as it was
    Store(ws).close()
    assert version() == "3"
    set_version("4")
    with pytest.raises(StoreTooNew, match=r"written by a newer mbx \(schema 4 > 3\)"):
        Store(ws)
