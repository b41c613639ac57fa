"""`mbx store rebuild` from run dirs of the previous run-dir format (v1: records with no `mbx_format`, as mbx main
wrote them before the format was versioned; tests/data/rundir_v1/): the same attempts, states and results as the
store mbx wrote then, and not a byte of the old run dirs rewritten."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.run.store import STORE_FILE

FIXTURE = Path(__file__).parent / "data" / "rundir_v1"
WRITTEN_IN = "/tmp/mbxfix/ws"  # where main wrote the workspace (status.json's reasons name its paths)
COLUMNS = "campaign cell_id attempt state reason failure_class job_id summary verdict".split()


def _attempts(workspace: Path) -> list[dict]:
    db = sqlite3.connect(workspace / STORE_FILE)
    try:
        rows = db.execute(
            "SELECT a.campaign, a.cell_id, a.attempt, a.state, a.reason, a.failure_class, a.job_id, r.summary_json, "
            "r.verdict FROM attempts a LEFT JOIN results r USING (campaign, cell_id, attempt) ORDER BY 1, 2, 3"
        ).fetchall()
    finally:
        db.close()
    found = []
    for row in rows:
        record = dict(zip(COLUMNS, row, strict=True))
        record["summary"] = json.loads(record["summary"]) if record["summary"] else None
        for path in (str(workspace), WRITTEN_IN):
            record["reason"] = record["reason"] and record["reason"].replace(path, "<workspace>")
        found.append(record)
    return found


def _digests(workspace: Path) -> dict[str, str]:
    """Every file under the campaigns' cell directories, by content."""
    return {str(p.relative_to(workspace)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(workspace.glob("*/*/**/*")) if p.is_file()}  # fmt: skip


@pytest.fixture
def v1_workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    shutil.copytree(FIXTURE / "ws", workspace)
    return workspace


def test_rebuild_from_v1_run_dirs_gives_back_the_store_main_wrote(mbx, v1_workspace: Path) -> None:
    before = _digests(v1_workspace)
    rebuilt = mbx("store", "rebuild", "--workspace", str(v1_workspace))
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    expected = json.loads((FIXTURE / "expected_attempts.json").read_text())
    assert _attempts(v1_workspace) == expected
    assert _digests(v1_workspace) == before, "a rebuild reads the old run dirs and rewrites none of them"
    status = mbx("campaign", "status", "flaky", "--workspace", str(v1_workspace), "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert [c["damaged"] for c in json.loads(status.stdout)["cells"]] == [[], []]


def test_rebuild_from_v1_run_dirs_alone(mbx, v1_workspace: Path) -> None:
    """campaign.json lost too: the cells come back from the v1 recipe.yaml and launch.json of their run dirs (judged
    with the default window and gates: what run dirs never hold)."""
    for name in ("tiny", "flaky"):
        (v1_workspace / name / "campaign.json").unlink()
    rebuilt = mbx("store", "rebuild", "--workspace", str(v1_workspace))
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert "rebuilt from their run directories" in rebuilt.stdout + rebuilt.stderr
    found = {(a["campaign"], a["cell_id"], a["attempt"]): a for a in _attempts(v1_workspace)}
    for want in json.loads((FIXTURE / "expected_attempts.json").read_text()):
        got = found[(want["campaign"], want["cell_id"], want["attempt"])]
        assert (got["state"], got["failure_class"], got["job_id"]) == (want["state"], want["failure_class"],
                                                                      want["job_id"])  # fmt: skip
        facts = ("steps", "first_loss", "last_loss", "peak_alloc_gib")  # the window is the default one now
        assert {k: got["summary"][k] for k in facts} == {k: want["summary"][k] for k in facts}


def test_a_record_a_newer_mbx_wrote_is_refused_by_rebuild_and_status(mbx, v1_workspace: Path) -> None:
    """A status.json of a newer format: `store rebuild` and `campaign status` stop with exit 2 naming the file and
    its version (no traceback); the store in place and the record stay as they were."""
    assert mbx("store", "rebuild", "--workspace", str(v1_workspace)).returncode == 0
    store = (v1_workspace / STORE_FILE).read_bytes()
    status = v1_workspace / "tiny" / "7fab3c2a3f-r0" / "1" / "status.json"
    newer = b'{"mbx_format": 99, "state": "completed", "written_by": "trainer", "new_key": 1}'
    status.write_bytes(newer)
    said = f"error: {status}: written by a newer mbx (v99); this mbx reads run-dir formats v1 to v"
    for command in (("store", "rebuild"), ("campaign", "status", "tiny"), ("report", "tiny")):
        done = mbx(*command, "--workspace", str(v1_workspace))
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        shown = " ".join(done.stderr.split())
        assert said in shown and "Traceback" not in done.stderr, (command, done.stderr)
    assert status.read_bytes() == newer and (v1_workspace / STORE_FILE).read_bytes() == store
    assert not list(v1_workspace.glob(f"{STORE_FILE}.*")), "no half-built or kept-aside store"
