"""Failure classification on the fixtures of tests/data/failures (one realistic run per class) and on edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.failure_classes import FAILURE_CLASSES
from reports.failures import classify_failure, scan_logs

FIXTURES = Path(__file__).parent / "data" / "failures"
CASES = sorted(p for p in FIXTURES.iterdir() if p.is_dir())


def logs_of(case: Path) -> list[Path]:
    return sorted(p for p in case.iterdir() if p.name != "case.json")


def test_every_class_has_a_fixture() -> None:
    expected = {json.loads((c / "case.json").read_text())["expected"] for c in CASES}
    assert expected == set(FAILURE_CLASSES)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_fixture(case: Path) -> None:
    spec = json.loads((case / "case.json").read_text())
    result = classify_failure(logs_of(case), spec["exit_codes"], exited=spec["exited"])
    assert result.failure_class == spec["expected"], result.reason
    assert result.retryable is spec["retryable"]
    assert "\n" not in result.reason and result.reason.startswith(spec["expected"] + ": ")
    if spec["file"] is None:
        assert result.evidence is None
    else:
        assert result.evidence is not None
        assert Path(result.evidence.file).name == spec["file"]
        assert result.evidence.line_no == spec["line"]
        line = (case / spec["file"]).read_text().splitlines()[spec["line"] - 1]
        quoted = result.evidence.line
        assert line.strip().startswith(quoted.removesuffix("…")) and len(quoted) <= 240
        assert f"{spec['file']}:{spec['line']}" in result.reason


def test_folder_of_logs_and_reason_quotes_the_line() -> None:
    result = classify_failure(FIXTURES / "oom_cuda", [1])
    assert result.failure_class == "oom"
    assert (
        "rank3.log:18" in result.reason and "CUDA out of memory. Tried to allocate 3.50 GiB" in result.reason
    )
    assert result.to_dict()["evidence"]["line_no"] == 18


def test_retryable_classes_are_configurable() -> None:
    case = FIXTURES / "timeout_slurm"
    assert classify_failure(logs_of(case), [143]).retryable is False
    assert classify_failure(logs_of(case), [143], retryable_classes={"timeout"}).retryable is True


def test_progress_is_read_from_the_logs() -> None:
    scan = scan_logs(logs_of(FIXTURES / "nan_grad_norm"))
    assert (scan.last_step, scan.planned_steps) == (57, 500)
    result = classify_failure(logs_of(FIXTURES / "hung_after_finish"), exited=False)
    assert (result.last_step, result.planned_steps) == (20, 20)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


ITER = " [2026-05-04 10:00:0{i}] iteration {i:8d}/{n:8d} | lm loss: 5.0E+00 | number of skipped iterations:   0 | number of nan iterations: {nan:3d} |\n"


def iterations(last: int, total: int, nan_from: int | None = None) -> str:
    return "".join(
        ITER.format(i=i, n=total, nan=int(nan_from is not None and i >= nan_from)) for i in range(1, last + 1)
    )


def test_counted_nan_iterations_before_an_early_end(tmp_path: Path) -> None:
    log = write(tmp_path, "rank0.log", iterations(8, 100, nan_from=7) + "Killed\n")
    result = classify_failure([log], [1])
    assert result.failure_class == "nan" and result.evidence.line_no == 7
    # the same counts in a run that logged every step are not why it failed
    done = write(tmp_path, "done.log", iterations(9, 9, nan_from=7))
    assert classify_failure([done], [1]).failure_class == "unknown"


def test_config_error_only_before_training_starts(tmp_path: Path) -> None:
    late = write(tmp_path, "late.log", iterations(3, 10) + "ValueError: bad shape\n")
    assert classify_failure([late], [1]).failure_class == "unknown"
    early = write(tmp_path, "early.log", "ValueError: --num-experts must divide 64\n")
    assert classify_failure([early], [1]).failure_class == "config"
    missing = write(
        tmp_path, "imp.log", iterations(3, 10) + "ModuleNotFoundError: No module named 'transformer_engine'\n"
    )
    assert classify_failure([missing], [1]).failure_class == "config"  # whenever it happens


def test_exit_codes_without_messages(tmp_path: Path) -> None:
    log = write(tmp_path, "rank0.log", iterations(3, 10))
    assert classify_failure([log], [124]).failure_class == "timeout"
    crash = classify_failure([log], [139, 0])
    assert crash.failure_class == "infra" and crash.retryable and "SIGSEGV" in crash.reason
    killed = classify_failure([log], [137])
    assert killed.failure_class == "unknown" and "137 (SIGKILL)" in killed.reason  # no OOM evidence
    stalled = classify_failure([log], [None], exited=False)
    assert stalled.failure_class == "unknown" and "3/10" in stalled.reason


def test_a_full_disk_or_quota_is_infra(tmp_path: Path) -> None:
    """The attempt wrapper's note on a full disk (launchers/node/attempt.py) and a quota's OSError: retryable."""
    for line in ("OSError: [Errno 28] No space left on device: 'metrics.jsonl'",
                 "attempt: the run dir's disk was full (EDQUOT) when the command ended: [Errno 122] Disk quota exceeded"):  # fmt: skip
        result = classify_failure([write(tmp_path, "rank0.log", iterations(3, 10) + line + "\n")], [1])
        assert result.failure_class == "infra" and result.retryable and line in result.reason, result


def test_a_clean_end_is_not_a_failure(tmp_path: Path) -> None:
    log = write(tmp_path, "rank0.log", iterations(5, 5) + "Connection reset by peer (during teardown)\n")
    result = classify_failure([log], [0, 0])
    assert result.failure_class == "unknown" and "no failure" in result.reason and not result.retryable


def test_caller_knows_better_than_the_logs(tmp_path: Path) -> None:
    log = write(tmp_path, "rank0.log", iterations(5, 10))
    assert (
        classify_failure([log], [None], exited=False, all_steps_logged=True).failure_class
        == "hung_after_finish"
    )
    assert classify_failure([log], [None], exited=False, planned_steps=5).failure_class == "hung_after_finish"


def test_natural_file_order_and_big_logs(tmp_path: Path) -> None:
    noise = (
        "INFO:megatron.core.timers:(min, max) time across ranks (ms): forward-backward: (1.0, 2.0)\n"
        * 200_000
    )
    write(tmp_path, "rank10.log", noise + "[rank10]: torch.OutOfMemoryError: CUDA out of memory.\n")
    write(tmp_path, "rank2.log", noise + "[rank2]: torch.OutOfMemoryError: CUDA out of memory.\n")
    result = classify_failure(tmp_path, [1, 1])
    assert Path(result.evidence.file).name == "rank2.log" and result.evidence.line_no == 200_001


def test_big_logs_are_searched_at_both_ends_with_exact_line_numbers(tmp_path: Path, monkeypatch) -> None:
    from reports import failures

    monkeypatch.setattr(failures, "HEAD", 1 << 20)
    monkeypatch.setattr(failures, "TAIL", 1 << 20)
    monkeypatch.setattr(failures, "WEAK_TAIL", 1 << 16)
    monkeypatch.setattr(failures, "CHUNK", 1 << 18)
    filler = "INFO:megatron.core.timers:(min, max) time across ranks (ms): forward-backward: (1.0, 2.0)\n"
    n = (1 << 20) // len(filler) + 1  # about 1 MiB of lines
    text = (
        iterations(5, 100, nan_from=4)  # NaN counts far from the end: not why the run stopped
        + filler * (2 * n)
        + "RuntimeError: Connection reset by peer\n"  # in the middle: not searched
        + filler * (3 * n)
        + "[rank0]: torch.OutOfMemoryError: CUDA out of memory.\n"
        + filler * 10
    )
    log = write(tmp_path, "rank0.log", text)
    result = classify_failure([log], [1])
    assert result.failure_class == "oom"
    assert result.evidence.line_no == 5 + 5 * n + 2
    assert "network error" not in {
        name for name, found in failures.scan_logs([log]).evidence.items() if found
    }
    assert result.last_step == 5


def test_the_real_bridge_start_failure_is_named(tmp_path: Path) -> None:
    """Megatron-Bridge 0.6.2 on an H100 (tests/data/bridge-0.6.2/): `make` of the dataset helpers failed at start-up.
    It is a configuration problem of the environment, said with its line, not "no known failure message"."""
    log = Path(__file__).parent / "data" / "bridge-0.6.2" / "h100_qwen3_start_failed_compile_helpers.log"
    found = classify_failure([log], exit_codes=[1])
    assert found.failure_class == "config" and not found.retryable
    assert "dataset helpers" in found.reason and "Failed to compile the C++ dataset helper functions" in found.reason


def test_the_real_bridge_apex_fusion_failure_is_named() -> None:
    """The second H100 start of Bridge 0.6.2 (tests/data/bridge-0.6.2/): Megatron's ColumnParallelLinear refused
    gradient-accumulation fusion without APEX's CUDA extension. Named with the setting that avoids it (it said
    "unknown: exit code 1 with no known failure message")."""
    log = Path(__file__).parent / "data" / "bridge-0.6.2" / "h100_qwen3_start_failed_apex_fusion.log"
    found = classify_failure([log], exit_codes=[1])
    assert found.failure_class == "config" and not found.retryable, found
    assert "gradient_accumulation_fusion: false" in found.reason and "fused_weight_gradient_mlp_cuda" in found.reason


def test_an_unknown_failure_quotes_its_first_error_line(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("starting\nINFO: all good\nERROR:some.module:the widget could not be frobnicated\n"
                   "Traceback (most recent call last):\nSystemExit: 1\n")  # fmt: skip
    found = classify_failure([log], exit_codes=[1])
    assert found.failure_class == "unknown"
    assert found.reason.endswith("its first error line (" + f"{log}:3): ERROR:some.module:the widget could not be frobnicated")
    quiet = tmp_path / "quiet.log"
    quiet.write_text("starting\n")
    assert "first error line" not in classify_failure([quiet], exit_codes=[1]).reason


def test_a_quoted_error_line_is_masked_before_it_is_cut(tmp_path: Path) -> None:
    """The quoted line goes into status.json's reason, the store and the terminal (issue 32's review): a secret in
    it is masked, and masked before the line is cut to its length (a cut token no longer reads as a token)."""
    token = "hf_errAbcdefghijklmnopqrstuvwxyz0123"
    log = tmp_path / "rank-0.log"
    log.write_text(f"starting\nERROR: could not reach the hub, HF_TOKEN={token} rejected\n"
                   "ERROR: later\n")  # fmt: skip
    found = classify_failure([log], exit_codes=[1])
    assert "HF_TOKEN=<redacted> rejected" in found.reason and "hf_errAbc" not in found.reason
    cut = tmp_path / "cut.log"
    cut.write_text(f"starting\nERROR: {'x' * 217} {token} at the end {'y' * 100}\n")  # across character 240
    reason = classify_failure([cut], exit_codes=[1]).reason
    assert reason.endswith("…") and "hf_errAbc" not in reason and "<re" in reason
