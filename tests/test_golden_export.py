"""Megatron-LM golden values written by mbx: the real files round-trip through the reader and the writer, `mbx golden
export` turns a tiny real campaign's cell into one, and `mbx compare` takes a golden-values file as a side."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY_MOE_RECIPE, run_mbx

from orchestrator.run.store import Store
from reports.parsers.golden import GoldenValues, lm_document, read_golden_values, rows_layout
from trainer import rundir

DATA = ROOT / "tests" / "data" / "megatron"  # the published files, in the repository (SOURCES.md says where from)
GOLDEN_DIR = DATA / "golden_values"
REAL_FILES = sorted(GOLDEN_DIR.glob("*.json"))
BRIDGE_DIR = DATA / "bridge"
# The real entry point (orchestrator.cli.app.main: clean errors, exit codes).
RUNNER = "import sys\nfrom orchestrator.cli.app import main\nsys.argv[0] = 'mbx'\nmain()\n"


def mbx_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200", WANDB_SILENT="true")
    env.pop("MBX_DEBUG", None)
    return subprocess.run([sys.executable, "-c", RUNNER, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def clean_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    """Exit 2, one `error:` line saying `needle`, no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


# ---- the writer ---------------------------------------------------------------------------------------------
def test_real_files_are_present() -> None:
    assert len(REAL_FILES) >= 6, GOLDEN_DIR


@pytest.mark.parametrize("path", REAL_FILES, ids=[p.name[:60] for p in REAL_FILES])
def test_real_golden_file_round_trips(path: Path) -> None:
    original = json.loads(path.read_text())
    written = lm_document(read_golden_values(path))
    assert written == original  # same keys, values (numbers and "nan"), start/end/interval
    # ... in the same order, with the same types and layout
    assert json.dumps(written) == json.dumps(original)
    for metric, spec in original.items():
        if isinstance(spec, dict):
            assert type(written[metric]["values"]) is type(spec["values"])  # legacy list stays a list


def test_bridge_golden_is_not_written_as_megatron_lm() -> None:
    bridge = next(BRIDGE_DIR.glob("*.golden_values.json"))
    with pytest.raises(ValueError, match="megatron-bridge"):
        lm_document(read_golden_values(bridge))


def test_mbx_rows_to_golden_and_back(tmp_path: Path) -> None:
    rows = [{"step": s, "loss": 10.0 - s / 7, "step_time_ms": None if s == 1 else 100.0 + s / 3,
             "mem_allocated_gib": 24.437710285186768, "mem_max_allocated_gib": 34.88 + s / 1024,
             "nan": False} for s in range(1, 7)]  # fmt: skip
    rows[3]["loss"] = None
    doc = lm_document(GoldenValues("megatron-lm", rows, layout=rows_layout(rows)))
    assert list(doc) == ["lm loss", "iteration-time", "mem-allocated-bytes", "mem-max-allocated-bytes"]
    assert doc["iteration-time"]["start_step"] == 2 and doc["iteration-time"]["end_step"] == 6
    assert doc["lm loss"]["step_interval"] == 1 and doc["lm loss"]["values"]["4"] == "nan"
    assert doc["mem-allocated-bytes"]["values"]["1"] == 24.437710285186768 * 2**30
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc, indent=4))
    back = {r["step"]: r for r in read_golden_values(path).rows}
    for row in rows:
        for key in ("loss", "step_time_ms", "mem_allocated_gib", "mem_max_allocated_gib"):
            assert back[row["step"]][key] == row[key]  # exact: the shortest decimal that scales back


# ---- `mbx golden export` and `mbx compare` on a tiny real campaign ------------------------------------------
@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("golden")
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    spec = {"name": "tiny-golden", "trainer": {"recipe": recipe}, "sweep": {"repeats": 2},
            "wandb": {"mode": "disabled"}}  # fmt: skip
    path = tmp / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    workspace = tmp / "ws"
    env = {"MBX_CACHE_DIR": str(tmp / "cache"), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = run_mbx("campaign", "run", str(path), "--workspace", str(workspace), "--no-report", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Store(workspace, create=False) as store:
        cells = store.cells("tiny-golden")
        runs = {a.cell_id: Path(a.run_dir) for a in store.latest_attempts("tiny-golden").values()}
    return {"workspace": workspace, "tmp": tmp, "cells": cells, "runs": runs}


@pytest.fixture(scope="module")
def exported(campaign: dict) -> Path:
    out = campaign["tmp"] / "tiny.golden_values.json"
    cell = campaign["cells"][0]
    proc = mbx_cli("golden", "export", "tiny-golden", "--point", cell.point_id, "--workspace",
                   str(campaign["workspace"]), "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "has 2 completed repeats; exported" in proc.stderr and "wrote" in proc.stderr
    return out


def test_export_holds_the_cells_metrics(campaign: dict, exported: Path) -> None:
    doc = json.loads(exported.read_text())
    assert {"lm loss", "iteration-time"} <= set(doc)
    assert set(doc) <= {
        "lm loss",
        "iteration-time",
        "mem-allocated-bytes",
        "mem-max-allocated-bytes",
        "num-zeros",
    }
    first = campaign["cells"][0]
    rows = rundir.read_metrics(campaign["runs"][first.cell_id])
    loss = doc["lm loss"]
    assert (loss["start_step"], loss["end_step"], loss["step_interval"]) == (1, 12, 1)
    assert loss["values"] == {str(r["step"]): r["loss"] for r in rows}
    assert doc["iteration-time"]["values"]["3"] == pytest.approx(rows[2]["step_time_ms"] / 1000, rel=1e-12)
    golden = read_golden_values(exported)
    assert golden.schema == "megatron-lm" and len(golden.rows) == 12
    assert lm_document(golden) == doc  # an exported file round-trips too


def test_export_to_stdout_by_cell_id(campaign: dict, exported: Path) -> None:
    cell = campaign["cells"][0]
    proc = mbx_cli(
        "golden", "export", "tiny-golden", "--point", cell.cell_id, "-w", str(campaign["workspace"])
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(exported.read_text())


def test_compare_campaign_with_exported_golden(campaign: dict, exported: Path) -> None:
    proc = mbx_cli("compare", "tiny-golden", str(exported), "--workspace", str(campaign["workspace"]))
    assert proc.returncode in (0, 1, 3), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"no fingerprint recorded for B ({exported.name})" in proc.stdout
    assert "one repeat on B" in proc.stdout and "single-repeat rule" in proc.stdout
    closing = proc.stdout.rstrip().splitlines()[-1]
    assert closing.startswith({0: "PASS ", 1: "FAIL ", 3: "INCONCLUSIVE "}[proc.returncode]), closing
    data = json.loads(mbx_cli("compare", str(exported), "tiny-golden", "-w", str(campaign["workspace"]),
                              "--json").stdout)  # fmt: skip
    (pair,) = data["pairs"]
    assert pair["a"]["source"] == "golden" and pair["a"]["point_id"] == "golden"
    assert pair["b"]["source"] == "campaign" and len(pair["b"]["repeats"]) == 2
    assert pair["no_fingerprint"] == [f"A ({exported.name})"] and pair["fingerprint_diff"] == []
    assert pair["metrics"]["final_loss"]["decision"] != "same"  # one repeat: never SAME


def test_compare_two_golden_files_needs_no_store(exported: Path, tmp_path: Path) -> None:
    proc = mbx_cli(
        "compare", str(exported), str(exported), "--workspace", str(tmp_path / "none"), "--markdown"
    )
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    assert "no fingerprint recorded for A" in proc.stdout and "single-repeat rule" in proc.stdout


def test_compare_real_megatron_goldens() -> None:
    first, second = REAL_FILES[-2], REAL_FILES[-1]  # a resumed run's two halves
    proc = mbx_cli("compare", str(first), str(second), "--metric", "step_time", "--json")
    assert proc.returncode in (0, 1, 3), proc.stderr
    assert json.loads(proc.stdout)["pairs"][0]["metrics"]["step_time"]["decision"] != "same"


def test_bad_golden_inputs_are_one_clean_error(campaign: dict, tmp_path: Path) -> None:
    ws = str(campaign["workspace"])
    clean_error(mbx_cli("compare", "tiny-golden", str(tmp_path / "missing.json"), "-w", ws),
                "no such golden-values file")  # fmt: skip
    clean_error(mbx_cli("compare", "tiny-golden", "nope.json", "-w", ws), "no such golden-values file")
    (tmp_path / "other.json").write_text('{"name": "x"}')
    clean_error(mbx_cli("compare", str(tmp_path / "other.json"), "tiny-golden", "-w", ws),
                "not a Megatron-LM or Megatron-Bridge golden-values file")  # fmt: skip
    (tmp_path / "broken.json").write_text('{"lm loss": ')
    clean_error(mbx_cli("compare", "tiny-golden", str(tmp_path / "broken.json"), "-w", ws), "not JSON")
    (tmp_path / "empty.json").write_text("{}")
    clean_error(
        mbx_cli("compare", "tiny-golden", str(tmp_path / "empty.json"), "-w", ws), "without any value"
    )
    (tmp_path / "dir.json").mkdir()
    clean_error(mbx_cli("compare", "tiny-golden", str(tmp_path / "dir.json"), "-w", ws), "is a directory")
    (tmp_path / "bad.json").write_text('{"lm loss": {"start_step": 1, "values": {"x": 1.0}}}')
    clean_error(
        mbx_cli("compare", "tiny-golden", str(tmp_path / "bad.json"), "-w", ws), "not a golden-values file"
    )


def test_bad_export_inputs_are_one_clean_error(campaign: dict, tmp_path: Path) -> None:
    ws = str(campaign["workspace"])
    clean_error(mbx_cli("golden", "export", "nope", "--point", "x", "-w", ws), "not in the store")
    clean_error(mbx_cli("golden", "export", "tiny-golden", "--point", "x", "-w", ws), "no such point or cell")
    point = campaign["cells"][0].point_id
    clean_error(mbx_cli("golden", "export", "tiny-golden", "--point", point, "-w", ws, "--out",
                        str(tmp_path / "no" / "dir" / "g.json")), "cannot be written")  # fmt: skip
    clean_error(mbx_cli("golden", "export", "tiny-golden", "--point", point, "-w", ws, "--out", str(tmp_path)),
                "is a directory")  # fmt: skip
