"""The Megatron parsers on the real logs of tests/data/megatron/logs: figures read off the files by eye."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports.parsers import (
    ROW_FIELDS,
    detect_format,
    iter_rows,
    make_parser,
    parse_log,
    parse_rank_logs,
)
from reports.window import summarize

LOGS = Path(__file__).parent / "data" / "megatron" / "logs"
ONE_GPU = LOGS / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"
RANK39 = LOGS / "megatron_lm__attn_bench_llama3_1b_40gpu_rank39__stdout.log"
MOE_EP8 = LOGS / "megatron_lm__seunghyunseo_moe_exp_dropless_moe_64e_ep8__excerpt.log"
LING = LOGS / "megatron_lm__ling_v2_moe_pretrain_example__excerpt.log"
WRAPPED = LOGS / "megatron_bridge__pr841_profiler_wrapped__excerpt.log"
GLUED = LOGS / "megatron_bridge__dgxc_llama31_8b_ckpt_resume__excerpt.log"
ALL_LOGS = sorted(LOGS.glob("*.log"))

MIB = 1 / 1024  # Megatron-LM "MB" is MiB
GB = 1e9 / 2**30  # Megatron-Bridge "GB" is 1e9 bytes


def by_step(rows: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in rows}


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_every_log_gives_contract_rows(path: Path) -> None:
    rows = parse_log(path)
    assert rows, path
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps))  # one row per step, in order
    for row in rows:
        assert set(ROW_FIELDS) <= row.keys()
        assert isinstance(row["extra"], dict)


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_bulk_streaming_and_line_paths_agree(path: Path) -> None:
    """`feed` (bulk fast path), line-by-line `iter_lines` and tiny chunks give the same rows."""
    whole = parse_log(path)
    lines = sorted(make_parser(lag=None).iter_lines(path.open(encoding="utf-8")), key=lambda r: r["step"])
    parser = make_parser(lag=None)
    data = path.read_bytes()
    tiny: list[dict] = []
    for i in range(0, len(data), 7):  # 7-byte chunks also split UTF-8 sequences and "\r\n"
        tiny.extend(parser.feed(data[i : i + 7]))
    tiny.extend(parser.close())
    assert lines == whole
    assert sorted(tiny, key=lambda r: r["step"]) == whole


def test_one_gpu_log() -> None:
    rows = parse_log(ONE_GPU)
    assert [r["step"] for r in rows] == list(range(1, 16))
    r3 = by_step(rows)[3]
    assert r3["loss"] == 9.863391
    assert r3["step_time_ms"] == 3160.2
    assert r3["tflops_per_gpu"] == 344.5
    assert r3["lr"] == 2.960771e-04
    assert r3["grad_norm"] == 15.528
    assert r3["skipped"] is False and r3["nan"] is False
    assert r3["extra"]["consumed samples"] == 240
    assert r3["extra"]["global batch size"] == 80
    assert r3["extra"]["loss scale"] == 1.0
    assert r3["extra"]["train iters"] == 15
    assert r3["extra"]["timestamp"] == "2026-03-31 14:11:17.804939"
    # [Rank 0] (after 1 iterations) memory (MB) | allocated: 14235.44 | max allocated: 14235.46 | reserved: 14504.00 | ...
    r1, r2 = by_step(rows)[1], by_step(rows)[2]
    assert r1["mem_allocated_gib"] == pytest.approx(14235.44 * MIB)
    assert r1["mem_max_allocated_gib"] == pytest.approx(14235.46 * MIB)
    assert r1["mem_reserved_gib"] == pytest.approx(14504.00 * MIB)
    assert r2["mem_max_allocated_gib"] == pytest.approx(20306.24 * MIB)
    assert r2["mem_max_reserved_gib"] == pytest.approx(20562.00 * MIB)
    assert r3["mem_allocated_gib"] is None  # no memory line after iteration 3
    # the argument dump gives seq_length 2048 and world_size 1: 80 × 2048 tokens / 3.1160 s / 1 GPU
    r15 = by_step(rows)[15]
    assert r15["loss"] == 8.372658
    assert r15["tokens_per_s_per_gpu"] == pytest.approx(80 * 2048 / 3.1160)
    assert detect_format(ONE_GPU) == "megatron-lm"


def test_last_rank_of_40_gpus() -> None:
    rows = parse_log(RANK39)
    assert len(rows) == 344
    assert [r["step"] for r in rows] == list(range(1, 345))
    r = by_step(rows)
    assert r[1]["loss"] == 12.18301 and r[1]["step_time_ms"] == 12465.5 and r[1]["tflops_per_gpu"] == 11.9
    assert (
        r[308]["loss"] == 4.883297 and r[308]["step_time_ms"] == 2066.6 and r[308]["tflops_per_gpu"] == 71.5
    )
    assert r[344]["grad_norm"] == 0.488 and r[344]["lr"] == 1.024550e-04
    assert all(row["mem_allocated_gib"] is None for row in rows)  # only DP-rank 0 prints memory
    assert all(row["tokens_per_s_per_gpu"] is None for row in rows)  # no argument dump on this rank
    assert all(row["extra"]["train iters"] == 500 for row in rows)


def test_last_rank_with_caller_supplied_shape_derives_tokens() -> None:
    rows = parse_log(RANK39, seq_length=4096, num_gpus=40)
    assert by_step(rows)[344]["tokens_per_s_per_gpu"] == pytest.approx(80 * 4096 / 1.9639 / 40)


def test_moe_log_with_interleaved_warnings_and_memory_first() -> None:
    rows = parse_log(MOE_EP8)
    assert [r["step"] for r in rows] == list(range(20, 221, 20))
    r = by_step(rows)
    # the memory line of iteration 20 comes *before* its iteration line (another rank printed it)
    assert r[20]["mem_allocated_gib"] == pytest.approx(10158.16748046875 * MIB)
    assert r[20]["mem_max_allocated_gib"] == pytest.approx(20612.236328125 * MIB)
    assert r[20]["mem_reserved_gib"] == pytest.approx(24654.0 * MIB)
    assert r[20]["loss"] == 11.55786 and r[20]["step_time_ms"] == 3367.6
    # iteration 40 follows six lines of Python warnings
    assert r[40]["loss"] == 10.93352
    assert r[40]["extra"]["load_balancing_loss"] == 1.321269
    assert r[40]["extra"]["num zeros"] == 675105940.0
    assert r[40]["extra"]["params norm"] == 1104.958
    assert r[220]["tflops_per_gpu"] == 12.4 and r[220]["grad_norm"] == 0.422


def test_extra_loss_keys() -> None:
    rows = parse_log(LING)
    assert len(rows) == 10
    r1 = by_step(rows)[1]
    assert r1["loss"] == 2.605958
    assert r1["extra"]["z_loss"] == 10.91659
    assert r1["extra"]["mtp_1 loss"] == 2.828435
    assert r1["mem_allocated_gib"] == pytest.approx(26222.7236328125 * MIB)
    assert r1["mem_max_reserved_gib"] == pytest.approx(66802.0 * MIB)
    assert by_step(rows)[10]["tflops_per_gpu"] == 133.7


def test_terminal_wrapped_bridge_log() -> None:
    rows = parse_log(WRAPPED)
    assert [r["step"] for r in rows] == [10, 20]
    r10, r20 = rows
    # "...| global batch" / "size:   512 |..." and "number of s" / "kipped iterations:   0 |"
    assert r10["loss"] == 4.474437 and r10["step_time_ms"] == 13212.7 and r10["lr"] == 3.0e-4
    assert r10["grad_norm"] == 0.704
    assert r10["extra"]["global batch size"] == 512
    assert r10["extra"]["number of skipped iterations"] == 0 and r10["skipped"] is False
    assert r10["extra"]["number of nan iterations"] == 0 and r10["nan"] is False
    # "... | max alloca" / "ted: 12712.43603515625 | reserved: ..."
    assert r10["mem_allocated_gib"] == pytest.approx(11908.05029296875 * MIB)
    assert r10["mem_max_allocated_gib"] == pytest.approx(12712.43603515625 * MIB)
    assert r10["mem_max_reserved_gib"] == pytest.approx(12954.0 * MIB)
    # "Step Time : 14.26s GPU utilization: 58.2TFLOP/s/GPU" is printed before iteration 20's line
    # and equals its elapsed time (14260.3 ms); the last one (16.85 s) belongs to iteration 30, absent.
    assert r10["tflops_per_gpu"] is None
    assert r20["tflops_per_gpu"] == 58.2
    assert r20["extra"]["Step Time (s)"] == 14.26
    assert r20["loss"] == 8.797448e-02 and r20["step_time_ms"] == 14260.3
    assert detect_format(WRAPPED) == "megatron-bridge"


def test_glued_bridge_log_with_gb_memory() -> None:
    rows = parse_log(GLUED)
    assert len(rows) == 1
    row = rows[0]
    assert row["step"] == 1 and row["extra"]["train iters"] == 1
    assert row["loss"] == 12.58695 and row["step_time_ms"] == 20289.1 and row["grad_norm"] == 10.275
    assert row["extra"]["number of nan iterations"] == 0  # the last field before the glued print
    assert row["extra"]["timestamp"] == "2025-12-19 10:49:15"
    assert row["mem_allocated_gib"] == pytest.approx(51.072 * GB)
    assert row["mem_max_allocated_gib"] == pytest.approx(194.41 * GB)
    assert row["mem_reserved_gib"] == pytest.approx(216.89 * GB)
    assert row["mem_max_reserved_gib"] == pytest.approx(216.89 * GB)
    assert row["extra"]["mem-alloc-retires"] == 0 and row["extra"]["mem-allocated-count"] == 571
    assert detect_format(GLUED) == "megatron-bridge"


def test_megatron_lm_format_ignores_bridge_only_lines() -> None:
    row = parse_log(GLUED, format="megatron-lm")[0]
    assert row["loss"] == 12.58695 and row["mem_allocated_gib"] is None
    assert parse_log(WRAPPED, format="megatron-lm")[1]["tflops_per_gpu"] is None


def test_streaming_holds_one_row_and_emits_in_log_order() -> None:
    """With lag=1, once iteration N is read, rows 1..N-1 are out and N is held for late lines."""
    parser = make_parser(lag=1)
    emitted: list[int] = []
    for line in RANK39.read_text().splitlines(keepends=True):
        emitted += [row["step"] for row in parser.push(line)]
        if " iteration " in line:
            newest = int(line.split(" iteration ")[1].split("/")[0])
            assert emitted == list(range(1, newest))
    emitted += [row["step"] for row in parser.close()]
    assert emitted == list(range(1, 345))


def test_iter_rows_streams_a_path_and_lines() -> None:
    from_path = list(iter_rows(ONE_GPU))
    from_lines = list(iter_rows(ONE_GPU.read_text().splitlines(keepends=True)))
    assert [r["step"] for r in from_path] == list(range(1, 16))
    assert from_path == from_lines


def test_parse_log_accepts_text() -> None:
    assert parse_log(LING.read_text()) == parse_log(LING)
    assert parse_log(str(LING)) == parse_log(LING)


def test_rank_logs_merge_by_step(tmp_path: Path) -> None:
    """The last rank prints iteration lines, rank 0 memory lines and the argument dump: one row per step."""
    one_gpu = ONE_GPU.read_text().splitlines(keepends=True)
    rank0 = [line for line in one_gpu if "iteration " not in line or "memory (MB)" in line]
    last = [line for line in one_gpu if " iteration " in line and "/      15 |" in line]
    (tmp_path / "rank0.log").write_text("".join(rank0))
    (tmp_path / "rank1.log").write_text("".join(last))
    merged = parse_rank_logs([tmp_path / "rank0.log", tmp_path / "rank1.log"])
    assert merged == parse_log(ONE_GPU)
    assert len(merged) == 15 and merged[0]["mem_allocated_gib"] == pytest.approx(14235.44 * MIB)
    assert merged[-1]["tokens_per_s_per_gpu"] == pytest.approx(80 * 2048 / 3.1160)


def test_rows_feed_the_summary_window() -> None:
    summary = summarize(parse_log(RANK39))
    assert summary.steps == 344 and summary.window_last_step == 344 and summary.window_steps == 10
    assert summary.loss_finite and summary.nan_iterations == 0 and summary.skipped_iterations == 0
    assert summary.tflops_per_gpu == pytest.approx(
        sum(r["tflops_per_gpu"] * r["step_time_ms"] for r in parse_log(RANK39)[-10:])
        / sum(r["step_time_ms"] for r in parse_log(RANK39)[-10:])
    )
