"""`mbx ingest` never passes impossible figures or a truncated log (issue 21): a real Megatron-LM log with a
negative, zero or non-finite step time, throughput or memory, or cut before its planned iterations, is recorded
failed with the reason; the impossible value is kept out of metrics.jsonl and the summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT

from orchestrator.run.ingest import ingest_logs

LOG = ROOT / "tests" / "data" / "megatron" / "logs" / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"
STEPS = 15  # iterations in LOG (`iteration N/15`)


def edited(tmp_path: Path, pattern: str, value: str, step: int = 7) -> Path:
    """LOG with the field `pattern` of iteration `step` (or of its memory line) printed as `value`."""
    lines = LOG.read_text().splitlines(keepends=True)
    marker = re.compile(rf"iteration\s+{step}/|\(after {step} iterations\)")
    index = next(i for i, line in enumerate(lines) if marker.search(line) and re.search(pattern, line))
    lines[index] = re.sub(rf"({pattern}:\s*)[^|\n]+", rf"\g<1>{value} ", lines[index], count=1)
    path = tmp_path / f"edited-{abs(hash((pattern, value))) % 10**6}.log"
    path.write_text("".join(lines))
    return path


def cut(tmp_path: Path, last: int) -> Path:
    """LOG as if the run's output stopped after iteration `last` (a job killed without a message)."""
    text = LOG.read_text()
    end = re.search(rf"iteration\s+{last + 1}/", text)
    assert end is not None
    path = tmp_path / f"cut-{last}.log"
    path.write_text(text[: text.rfind("\n", 0, end.start()) + 1])
    return path


def metrics(run_dir: Path) -> dict[int, dict]:
    rows = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line)
    return {row["step"]: row for row in rows}


@pytest.mark.parametrize(
    ("pattern", "value", "step", "field", "shown"),
    [
        (r"elapsed time per iteration \(ms\)", "-1e308", 7, "step_time_ms", "-1e+308"),
        (r"elapsed time per iteration \(ms\)", "0.0", 7, "step_time_ms", "= 0.0"),
        (r"throughput per GPU \(TFLOP/s/GPU\)", "inf", 7, "tflops_per_gpu", "inf"),
        (r"throughput per GPU \(TFLOP/s/GPU\)", "-204.6", 7, "tflops_per_gpu", "-204.6"),
        (r"max allocated", "nan", 2, "mem_max_allocated_gib", "nan"),
        (r"max reserved", "-20562.00", 2, "mem_max_reserved_gib", "-20.0"),
    ],
)
def test_impossible_figures_fail_the_point_and_stay_out_of_the_figures(tmp_path, pattern, value, step, field, shown):
    result = ingest_logs(tmp_path / "ws", [edited(tmp_path, pattern, value, step)], "past")
    assert (result.state, result.verdict) == ("failed", "fail"), result
    assert "impossible values" in result.reason and f"step {step}:" in result.reason and shown in result.reason
    assert metrics(result.run_dir)[step][field] is None, "the impossible value is not a figure"
    summary = result.summary
    assert summary["steps"] == STEPS and summary["step_time_ms"] > 0 and summary["tflops_per_gpu"] > 0


def test_the_untouched_log_still_passes(tmp_path):
    result = ingest_logs(tmp_path / "ws", [LOG], "past")
    assert (result.state, result.verdict, result.reason) == ("completed", "pass", None)


def test_a_log_cut_before_its_planned_iterations_is_not_passed(mbx, tmp_path):
    """Through the CLI: `iteration 5/15` is the last line → failed, 'stopped at step 5 of 15'; --train-iters
    (Megatron's name) says how many were planned: 5 makes the same log a complete run, 30 cuts the whole log."""
    workspace = str(tmp_path / "ws")
    short = cut(tmp_path, 5)
    out = mbx("ingest", str(short), "--campaign", "past", "--workspace", workspace)
    assert out.returncode == 1, out.stdout + out.stderr  # a failed cell exits 1, as `campaign run` does
    status = {c["label"]: c for c in json.loads(mbx("campaign", "status", "past", "--workspace", workspace,
                                                     "--json").stdout)["cells"]}  # fmt: skip
    cell = status["cut-5"]
    assert (cell["state"], cell["verdict"]) == ("failed", "fail") and "stopped at step 5 of 15" in cell["reason"]
    assert "failed" in out.stdout and "stopped at step 5 of 15" in out.stdout

    planned = ingest_logs(tmp_path / "ws", [short], "told", steps=5)
    assert (planned.state, planned.verdict) == ("completed", "pass"), planned
    longer = ingest_logs(tmp_path / "ws", [LOG], "longer", steps=30)
    assert longer.state == "failed" and "stopped at step 15 of 30" in longer.reason


def test_a_failed_commit_removes_its_run_dir_as_an_owned_dir(tmp_path):
    """The store write fails (a closed store): the run dir just made is removed again, through remove_owned_dir,
    which needs the marker every ingested run dir carries (written before anything else in it)."""
    from orchestrator.owned_dirs import OWNED_MARKER
    from orchestrator.run.ingest import commit, ingest_campaign, parse, plan_ingest, sources
    from orchestrator.run.store import Store

    parsed = parse(sources([LOG]), "auto", None, None, None)
    store = Store(tmp_path / "ws")
    plan = plan_ingest(store, ingest_campaign(store, "past"), parsed, "auto", seq_length=None, num_gpus=None,
                       label=None, params={}, exit_code=None)  # fmt: skip
    store.close()
    with pytest.raises(Exception, match="closed"):
        commit(store, plan)
    assert not plan.run_dir.exists() and not list(plan.run_dir.parent.iterdir()), "nothing half-written"
    done = ingest_logs(tmp_path / "ws", [LOG], "past")
    assert (done.run_dir / OWNED_MARKER).is_file(), "an ingested run dir is one mbx may remove"
