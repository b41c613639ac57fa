"""W&B logging through the real wandb library in offline mode, read back from the run's .wandb file."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from report_fixtures import campaign_view, step_rows

from reports.wandb_log import (
    REDACTED,
    WandbLogWarning,
    log_attempt,
    point_job_type,
    read_run_file,
    scrub,
    step_history,
)
from reports.wandb_settings import WandbSettings

SECRETS = ("hunter2", "hunter3", "hunter4")


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """wandb's own folders inside tmp_path, a secret in the environment, no credentials from home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    for name in (
        "WANDB_MODE",
        "WANDB_DIR",
        "WANDB_PROJECT",
        "WANDB_ENTITY",
        "WANDB_RUN_ID",
        "WANDB_DISABLED",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MBX_TEST_SECRET", "hunter2")
    monkeypatch.setenv("WANDB_API_KEY", "hunter2" * 5 + "hunte")  # 40 characters, like a real key
    return tmp_path


# ---------------------------------------------------------------- reading a .wandb file back


def _items(items: Any) -> dict[str, Any]:
    out = {}
    for item in items:
        key = item.key or ".".join(item.nested_key)
        out[key] = json.loads(item.value_json)
    return out


def _read_run(folder: Path) -> dict[str, Any]:
    files = list(folder.glob("run-*.wandb"))
    assert len(files) == 1, list(folder.iterdir())
    records = read_run_file(files[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    summary: dict[str, Any] = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(_items(r.summary.update))
    return {
        "kinds": kinds,
        "run": run,
        "config": _items(run.config.update),
        "history": [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"],
        "summary": summary,
    }


def _files_containing(root: Path, needles: tuple[str, ...]) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path}: {n}" for n in needles if n.encode() in data]
    return hits


# ---------------------------------------------------------------- tests


def test_offline_run_is_written_and_reads_back(wandb_env: Path) -> None:
    view = campaign_view()
    cell = view.cells[2]  # c2b0: passes its gates
    config = {
        "model": {"hidden_size": 2048, "moe": {"num_experts": 64}},
        "hf_token": "hunter3",
        "cluster": {"env": {"DB_PASSWORD": "hunter4"}},
    }
    workspace = wandb_env / "workspace"
    with_warnings: list[str] = []
    folder = log_attempt(
        WandbSettings(tags=["ci"]), view.name, cell, config, workspace, on_warning=with_warnings.append
    )
    assert with_warnings == []
    assert folder is not None
    folder_path = Path(folder)
    assert folder_path.parent == workspace / "wandb" and folder_path.name.startswith("offline-run-")

    got = _read_run(folder_path)
    run = got["run"]
    assert run.display_name == "moe-dispatch/c2b0/a1"
    assert run.run_group == "moe-dispatch" and run.job_type == point_job_type(cell)
    assert run.job_type == ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in cell.params.items())
    assert list(run.tags) == ["ci"]
    assert got["config"]["model"] == config["model"]
    assert got["config"]["hf_token"] == REDACTED
    assert got["config"]["cluster"] == {"env": {"DB_PASSWORD": REDACTED}}
    assert got["config"]["mbx"]["cell_id"] == "c2b0"
    assert got["config"]["mbx"]["params"] == cell.params

    history = got["history"]
    assert [h["step"] for h in history] == [r["step"] for r in cell.rows]
    assert [h["_step"] for h in history] == [r["step"] for r in cell.rows]
    for logged, row in zip(history, cell.rows, strict=True):
        for key in ("loss", "step_time_ms", "tflops_per_gpu", "mem_max_allocated_gib", "lr"):
            assert logged[key] == pytest.approx(row[key])
        assert logged["skipped"] == 0 and logged["nan"] == 0

    summary = got["summary"]
    assert summary["verdict"] == "pass" and summary["state"] == "completed"
    assert summary["window/tflops_per_gpu"] == pytest.approx(cell.summary.tflops_per_gpu)
    assert summary["window/step_time_ms"] == pytest.approx(cell.summary.step_time_ms)
    assert summary["gate/failed"] == []
    assert got["kinds"][-1] == "exit"  # complete when log_attempt returned

    # Nothing secret anywhere wandb wrote: run files, logs, wandb's own config and cache folders.
    assert _files_containing(wandb_env, SECRETS) == []


def test_failed_cell_with_nan_rows(wandb_env: Path) -> None:
    view = campaign_view()
    cell = next(c for c in view.cells if c.cell_id == "c4d0")  # NaN losses, a skipped step, gates failed
    folder = log_attempt(WandbSettings(), view.name, cell, {"seed": 1}, wandb_env / "ws")
    assert folder is not None
    got = _read_run(Path(folder))
    by_step = {h["step"]: h for h in got["history"]}
    assert math.isnan(by_step[17]["loss"]) and by_step[17]["nan"] == 1
    assert by_step[18]["skipped"] == 1
    assert got["summary"]["verdict"] == "fail"
    assert len(got["summary"]["gate/failed"]) == 2


def test_long_run_spans_many_blocks(wandb_env: Path) -> None:
    """A run file larger than one 32 KiB block: records split across blocks read back whole."""
    view = campaign_view()
    cell = view.cells[0]
    cell.rows = step_rows(steps=600)
    folder = log_attempt(WandbSettings(), view.name, cell, {}, wandb_env / "ws")
    assert folder is not None
    (wandb_file,) = Path(folder).glob("run-*.wandb")
    assert wandb_file.stat().st_size > 4 * 32 * 1024
    got = _read_run(Path(folder))
    assert [h["step"] for h in got["history"]] == list(range(1, 601))
    assert got["kinds"][-1] == "exit"


def test_settings_dir_overrides_workspace(wandb_env: Path) -> None:
    view = campaign_view()
    folder = log_attempt(
        WandbSettings(dir=str(wandb_env / "elsewhere")), view.name, view.cells[0], {}, wandb_env / "ws"
    )
    assert folder is not None and Path(folder).parent == wandb_env / "elsewhere" / "wandb"
    assert not (wandb_env / "ws").exists()


def test_disabled_logs_nothing(wandb_env: Path, recwarn: pytest.WarningsRecorder) -> None:
    view = campaign_view()
    assert log_attempt(WandbSettings(mode="disabled"), view.name, view.cells[0], {}, wandb_env / "ws") is None
    assert not (wandb_env / "ws").exists()
    assert not [w for w in recwarn if issubclass(w.category, WandbLogWarning)]


def test_wandb_failure_is_a_warning_not_a_crash(wandb_env: Path) -> None:
    """wandb.init itself refuses (a project name the schema would have caught); the caller gets None."""
    bad = WandbSettings.model_construct(**{**WandbSettings().model_dump(), "project": "bad/name"})
    view = campaign_view()
    messages: list[str] = []
    out = log_attempt(bad, view.name, view.cells[0], {}, wandb_env / "ws", on_warning=messages.append)
    assert out is None
    assert len(messages) == 1
    assert messages[0].startswith("W&B logging of moe-dispatch/c1a0/a1 failed: UsageError: ")
    assert "\n" not in messages[0]
    with pytest.warns(WandbLogWarning, match="W&B logging of moe-dispatch/c1a0/a1 failed"):
        assert log_attempt(bad, view.name, view.cells[0], {}, wandb_env / "ws") is None


_ONLINE_WITHOUT_KEY = """
import sys, time
from pathlib import Path
from report_fixtures import campaign_view
from reports.wandb_log import log_attempt
from reports.wandb_settings import WandbSettings
view, messages, took = campaign_view(), [], []
for cell in view.cells[:2]:
    start = time.perf_counter()
    out = log_attempt(WandbSettings(mode="online"), view.name, cell, {}, Path(sys.argv[1]), on_warning=messages.append)
    took.append(time.perf_counter() - start)
    assert out is None, out
print(repr((messages, took)))
"""


def test_online_without_credentials(wandb_env: Path) -> None:
    """A fresh process (wandb caches a login per process) with no key anywhere: a warning, then a skip."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_API_KEY")}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "tests"), str(root)])
    done = subprocess.run(
        [sys.executable, "-c", _ONLINE_WITHOUT_KEY, str(wandb_env / "ws")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    messages, took = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert len(messages) == 2
    assert messages[0].startswith("W&B logging of moe-dispatch/c1a0/a1 failed: ")
    assert messages[1].startswith("W&B logging of moe-dispatch/c1a1/a1 skipped: online W&B failed")
    assert took[1] < 1.0


def test_unwritable_dir_is_a_warning(wandb_env: Path) -> None:
    blocker = wandb_env / "a-file"
    blocker.write_text("not a folder")
    view = campaign_view()
    with pytest.warns(WandbLogWarning):
        assert (
            log_attempt(WandbSettings(dir=str(blocker / "sub")), view.name, view.cells[0], {}, wandb_env)
            is None
        )


def test_settings_schema() -> None:
    with pytest.raises(ValidationError):
        WandbSettings(mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="found /"):
        WandbSettings(project="team/mbx")
    with pytest.raises(ValidationError):
        WandbSettings(api_key="x")  # type: ignore[call-arg]
    assert WandbSettings().mode == "offline" and WandbSettings().project == "mbx"
    for name, info in WandbSettings.model_fields.items():
        assert info.description, name


def test_scrub_and_history_helpers() -> None:
    config = {"a": 1, "api_key": "k", "nested": [{"password": "p", "tokens_per_step": 3}], "bos_token": "<s>"}
    assert scrub(config) == {
        "a": 1,
        "api_key": REDACTED,
        "nested": [{"password": REDACTED, "tokens_per_step": 3}],
        "bos_token": "<s>",
    }
    rows = [
        {"step": 2, "loss": 1.0, "note": "x"},
        {"step": 1, "loss": 2.0},
        {"step": 2, "loss": 0.5},
        {"loss": 9},
    ]
    assert step_history(rows) == [(1, {"loss": 2.0, "step": 1}), (2, {"loss": 0.5, "step": 2})]


def test_import_does_not_load_wandb() -> None:
    code = "import sys, reports.wandb_log; assert 'wandb' not in sys.modules, 'wandb imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_summary_has_window_energy_and_profile(wandb_env: Path) -> None:
    """energy_j rows average over the window into window/energy_j; a profiled run dir adds profile/<class>_ms."""
    import dataclasses

    from reports.profile_view import breakdown

    cell = campaign_view().cells[2]
    rows = [dict(r, energy_j=100.0 + r["step"]) for r in cell.rows]
    run_dir = wandb_env / "run"
    run_dir.mkdir()
    trace = Path(__file__).parent / "data" / "traces" / "cpu_quickstart_steps2-3.pt.trace.json.gz"
    (run_dir / "profile-trace.json.gz").write_bytes(trace.read_bytes())
    cell = dataclasses.replace(cell, rows=rows, run_dir=str(run_dir))
    folder = log_attempt(WandbSettings(), "moe-dispatch", cell, {}, wandb_env / "ws")
    assert folder is not None
    summary = _read_run(Path(folder))["summary"]
    first, last = cell.summary.window_first_step, cell.summary.window_last_step
    assert summary["window/energy_j"] == pytest.approx(100.0 + (first + last) / 2)
    shares = breakdown(run_dir)
    assert shares and summary["profile/GEMM_ms"] == pytest.approx(shares["GEMM"])
    assert set(k for k in summary if k.startswith("profile/")) == {f"profile/{c}_ms" for c in shares}
