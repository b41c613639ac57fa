"""The Megatron parsers on hand-made hard cases: interleaved ranks, launcher prefixes, ANSI, cut tails, NaN spellings, glued and wrapped lines, restarts, validation, Bridge step time."""

from __future__ import annotations

import math

import pytest
from test_parsers_properties import render_iteration

from reports.parsers import make_parser, parse_log

MIB = 1 / 1024


def params(step: int, **over) -> dict:
    p = {
        "stamp": f"2026-05-04 10:00:{step % 60:02d}.{step:06d}",
        "step": step,
        "total": 100,
        "consumed": step * 256,
        "skipped_samples": 0,
        "elapsed": 1500.0 + step,
        "throughput": 410.0,
        "lr": 3e-4,
        "gbs": 256,
        "losses": {"lm loss": 10.0 - step / 10, "load_balancing_loss": 1.5},
        "loss_scale": 1.0,
        "grad_norm": 0.5,
        "num_zeros": None,
        "params_norm": None,
        "skipped": 0,
        "nans": 0,
    }
    p.update(over)
    return p


def line(step: int, **over) -> str:
    return render_iteration(params(step, **over))


def memory(step: int, rank: int = 0, allocated: float = 1024.0) -> str:
    return (
        f"[Rank {rank}] (after {step} iterations) memory (MB) | allocated: {allocated:.2f} | "
        f"max allocated: {allocated * 2:.2f} | reserved: {allocated * 3:.2f} | max reserved: {allocated * 3:.2f}"
    )


def test_interleaved_ranks_with_launcher_prefixes() -> None:
    text = "\n".join(
        [
            "0: [Gloo] Rank 0 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7",
            "7: " + line(1),
            "0: " + memory(1, rank=0, allocated=1000),
            "4: " + memory(1, rank=4, allocated=3000),  # another pipeline stage's DP-rank 0
            "3: /usr/lib/python3/site-packages/torch/autograd/graph.py:824: UserWarning: stream mismatch",
            "3:   return Variable._execution_engine.run_backward(",
            "[rank7]: " + line(2),
            "[default7]:" + line(3),
            "> 7: " + line(4),
            "pretrain_moe/7 " + line(5),
            "job_perf/0 " + memory(5, allocated=500),
        ]
    )
    rows = parse_log(text + "\n")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0]["loss"] == pytest.approx(9.9) and rows[4]["loss"] == pytest.approx(9.5)
    assert rows[0]["mem_allocated_gib"] == pytest.approx(3000 * MIB)  # the larger rank wins
    assert rows[4]["mem_allocated_gib"] == pytest.approx(500 * MIB)
    assert all(r["extra"]["load_balancing_loss"] == 1.5 for r in rows)


def test_ansi_colour_codes() -> None:
    coloured = line(7).replace("lm loss:", "\x1b[1;32mlm loss:\x1b[0m").replace(" [2026", "\x1b[2m [2026", 1)
    text = f"\x1b[34m{coloured}\x1b[0m\n\x1b[33m{memory(7)}\x1b[0m\n"
    (row,) = parse_log(text)
    assert row["loss"] == pytest.approx(9.3) and row["step_time_ms"] == 1507.0
    assert row["mem_max_reserved_gib"] == pytest.approx(3072 * MIB)


def test_cut_last_line_drops_the_partial_field_or_the_row() -> None:
    """Every cut position of the last line (one loop: ~400 cuts of a pure function)."""
    full = line(2)
    complete = parse_log(full + "\n")[0]
    for cut in range(1, len(full) + 1):
        rows = parse_log(line(1) + "\n" + full[:cut])
        assert rows[0]["step"] == 1 and rows[0]["loss"] == pytest.approx(9.9), cut
        for row in rows[1:]:
            assert row["step"] == 2, cut
            for key, value in row.items():
                if key == "extra":
                    assert all(complete["extra"][k] == v for k, v in value.items()), (cut, value)
                elif value is not None:
                    assert value == complete[key], (cut, key)
        if cut < len(full):  # the last field ("number of nan iterations: 0 |") is never complete here
            assert all(r["extra"].get("number of nan iterations") is None for r in rows[1:]), cut


def test_cut_memory_line_loses_its_last_field() -> None:
    text = line(1) + "\n" + memory(1)[:-3]  # "... | max reserved: 3072." cut: no newline
    (row,) = parse_log(text)
    assert row["mem_reserved_gib"] == pytest.approx(3072 * MIB)
    assert row["mem_max_reserved_gib"] is None


@pytest.mark.parametrize("spelling", ["nan", "NaN", "NAN", "inf", "-inf", "Infinity", "-Infinity", "INF"])
def test_nan_and_inf_spellings(spelling: str) -> None:
    text = (
        line(3)
        .replace("grad norm: 0.500", f"grad norm: {spelling}")
        .replace("lm loss: 9.700000E+00", f"lm loss: {spelling}")
    )
    (row,) = parse_log(text + "\n")
    assert math.isnan(row["grad_norm"]) == ("n" in spelling.lower() and "inf" not in spelling.lower())
    assert not math.isfinite(row["loss"]) and not math.isfinite(row["grad_norm"])
    assert row["nan"] is True  # a non-finite loss is a NaN step even if the interval count says 0


def test_nan_step_where_megatron_omits_the_loss() -> None:
    """A NaN average is left out of the line (`if avg >= 0.0`); grad norm prints "nan"."""
    text = "\n".join(
        [
            line(10),
            line(
                11,
                losses={"lm loss": float("nan"), "load_balancing_loss": float("nan")},
                grad_norm=float("nan"),
                nans=1,
            ),
            line(12, losses={"lm loss": float("nan")}, grad_norm=None, skipped=1, nans=1),
        ]
    )
    r10, r11, r12 = parse_log(text + "\n")
    assert r10["nan"] is False and r10["loss"] == pytest.approx(9.0)
    assert r11["loss"] is None and "load_balancing_loss" not in r11["extra"]
    assert math.isnan(r11["grad_norm"]) and r11["nan"] is True and r11["skipped"] is False
    assert r12["grad_norm"] is None and r12["skipped"] is True and r12["nan"] is True
    assert r12["extra"]["number of nan iterations"] == 1


def test_glued_prints_are_parsed_on_their_own() -> None:
    text = line(1) + memory(1) + "\n" + line(2) + line(3) + "Number of parameters in billions: 8.03\n"
    rows = parse_log(text)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["mem_allocated_gib"] == pytest.approx(1024 * MIB)
    assert rows[2]["step_time_ms"] == 1503.0


def test_print_glued_after_another_message() -> None:
    text = "Deleting CUDA graphs" + line(4) + "\nsaving checkpoint at iteration 4" + "\n"
    (row,) = parse_log(text)
    assert row["step"] == 4 and row["loss"] == pytest.approx(9.6)


def test_crlf_and_progress_bar_carriage_returns() -> None:
    text = f"[1/1] [0%   ] profiling\r[1/1] [100%] profiling\r{line(1)}\r\n{memory(1)}\r\n{line(2)}\r\n"
    rows = parse_log(text)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["mem_max_reserved_gib"] == pytest.approx(3072 * MIB)


def test_restart_in_the_same_log_keeps_the_later_values() -> None:
    first = [line(s) for s in range(1, 6)]
    again = [line(s, elapsed=9000.0 + s) for s in range(4, 8)]
    rows = parse_log("\n".join(first + ["Resuming from checkpoint at iteration 3"] + again) + "\n")
    assert [r["step"] for r in rows] == list(range(1, 8))
    assert [r["step_time_ms"] for r in rows] == [1501.0, 1502.0, 1503.0, 9004.0, 9005.0, 9006.0, 9007.0]


def test_streaming_restart_emits_both_attempts_in_log_order() -> None:
    parser = make_parser(lag=1)
    text = "\n".join([line(1), line(2), line(3), line(2, elapsed=5.0), line(3, elapsed=6.0)]) + "\n"
    rows = parser.feed(text) + parser.close()
    assert [(r["step"], r["step_time_ms"]) for r in rows] == [
        (1, 1501.0),
        (2, 1502.0),
        (3, 1503.0),
        (2, 5.0),
        (3, 6.0),
    ]


def test_memory_printed_long_after_its_step() -> None:
    text = "\n".join([line(1), line(2), line(3), memory(1)]) + "\n"
    whole = parse_log(text)
    assert whole[0]["mem_allocated_gib"] == pytest.approx(1024 * MIB)
    parser = make_parser(lag=1)
    streamed = parser.feed(text) + parser.close()
    assert [r["step"] for r in streamed] == [1, 2, 3]  # never a duplicate step
    assert streamed[0]["mem_allocated_gib"] is None and parser.late_dropped == 1
    parser = make_parser(lag=3)
    streamed = parser.feed(text) + parser.close()
    assert streamed[0]["mem_allocated_gib"] == pytest.approx(1024 * MIB)


def test_validation_and_test_losses() -> None:
    dashes = "-" * 120
    text = "\n".join(
        [
            line(10),
            dashes,
            " validation loss at iteration 10 | lm loss value: 5.123456E+00 | lm loss PPL: 1.678901E+02 | ",
            dashes,
            line(11),
            " validation loss at iteration 15 | lm loss value: 5.000000E+00 | lm loss PPL: 1.484132E+02 | ",
            " validation loss at iteration 11 on test set | lm loss value: 5.200000E+00 | lm loss PPL: 1.812722E+02 | ",
        ]
    )
    rows = {r["step"]: r for r in parse_log(text + "\n")}
    assert rows[10]["eval_loss"] == 5.123456 and rows[10]["extra"]["validation lm loss PPL"] == 167.8901
    assert "eval_loss" not in rows[11] and rows[11]["extra"]["test lm loss"] == 5.2
    assert rows[15]["eval_loss"] == 5.0 and rows[15]["loss"] is None  # eval on a step not logged


def test_old_formats() -> None:
    """No timestamp, learning rate as {:.3E}, no throughput (Megatron before 2024)."""
    text = (
        " iteration      100/  500000 | consumed samples:        51200 | elapsed time per iteration (ms): 812.3 |"
        " learning rate: 9.150E-06 | global batch size:   512 | lm loss: 7.123456E+00 | loss scale: 65536.0 |"
        " grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
        " iteration      110/  500000 | consumed samples:        56320 | elapsed time per iteration (ms): 810.0 |"
        " learning rate: 9.200E-06 | global batch size:   512 | loss scale: 32768.0 |"
        " number of skipped iterations:  10 | number of nan iterations:   0 |\n"
    )
    r100, r110 = parse_log(text)
    assert r100["lr"] == 9.15e-06 and r100["tflops_per_gpu"] is None and "timestamp" not in r100["extra"]
    assert r110["loss"] is None and r110["grad_norm"] is None and r110["skipped"] is True
    assert r110["extra"]["number of skipped iterations"] == 10 and r110["extra"]["loss scale"] == 32768.0


def test_bridge_step_time_either_side_of_its_iteration_line() -> None:
    text = "\n".join(
        [
            "Step Time : 1.50s GPU utilization: 400.0MODEL_TFLOP/s/GPU",  # rank 0 first: step 1
            line(1, elapsed=1500.0, throughput=None),
            line(2, elapsed=1510.0, throughput=None),
            "Step Time : 1.51s GPU utilization: 401.0MODEL_TFLOP/s/GPU",  # rank 0 late: step 2
            "Step Time : 9.99s GPU utilization: 1.0MODEL_TFLOP/s/GPU",  # matches nothing: dropped
            line(3, elapsed=1520.0, throughput=None),
            "Step Time : 1.52s GPU utilization: 402.5TFLOP/s/GPU",  # old spelling, after
        ]
    )
    r1, r2, r3 = parse_log(text + "\n")
    assert (r1["tflops_per_gpu"], r2["tflops_per_gpu"], r3["tflops_per_gpu"]) == (400.0, 401.0, 402.5)
    assert r2["extra"]["Step Time (s)"] == 1.51
    assert parse_log(text + "\n", format="megatron-lm")[0]["tflops_per_gpu"] is None


def test_bridge_gb_memory_line_cut_at_the_end() -> None:
    gb = "[Rank 0] (after 1 iterations) memory (GB) | mem-allocated-gigabytes: 51.072 | mem-reserved-gigabytes: 216.8"
    (row,) = parse_log(line(1) + "\n" + gb)
    assert row["mem_allocated_gib"] == pytest.approx(51.072e9 / 2**30)
    assert row["mem_reserved_gib"] is None  # "216.8" may be the start of "216.89"


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("inside", [2, 3, 4])
def test_wrapped_memory_line_whose_last_number_is_cut(parts: int, inside: int) -> None:
    """A terminal wrap inside "max reserved: 3072.00": the line looks complete ("30") but is not."""
    mem = memory(1)
    cut = mem.rfind("3072.00") + inside
    if cut % parts:
        cut += 1
    width = cut // parts
    wrapped = "\n".join(wrap_line(mem, width))
    r1, r2 = parse_log(line(1) + "\n" + wrapped + "\n" + line(2) + "\n")
    assert r1["mem_max_allocated_gib"] == pytest.approx(2.0)
    assert r1["mem_max_reserved_gib"] == pytest.approx(3.0)
    assert r2["step"] == 2 and r2["mem_allocated_gib"] is None


def wrap_line(text: str, width: int) -> list[str]:
    return [text[i : i + width].rstrip() for i in range(0, len(text), width)]


def test_argument_dump_gives_tokens_per_second() -> None:
    args = [
        "------------------------ arguments ------------------------",
        "  seq_length ...................................... 4096",
        "  world_size ...................................... 8",
        "-------------------- end of arguments ---------------------",
    ]
    parser = make_parser(lag=1)
    rows = parser.feed("\n".join(args + [line(1, elapsed=2000.0)]) + "\n") + parser.close()
    assert parser.args["seq_length"] == "4096"
    assert rows[0]["tokens_per_s_per_gpu"] == pytest.approx(256 * 4096 / 2.0 / 8)


def test_feed_accepts_bytes_split_inside_a_utf8_character() -> None:
    text = ("résumé ✓ " + line(1) + "\n").encode()
    parser = make_parser()
    rows: list[dict] = []
    for i in range(len(text)):
        rows += parser.feed(text[i : i + 1])
    rows += parser.close()
    assert [r["step"] for r in rows] == [1]


def test_empty_and_unrelated_logs() -> None:
    assert parse_log("") == []
    assert parse_log("hello\nworld\n") == []
    with pytest.raises(ValueError):
        make_parser("megatron-deepspeed")  # type: ignore[arg-type]


def test_bulk_rows_share_no_mutable_state() -> None:
    """Identical lines (one layout, same values) still give independent rows and `extra` dicts."""
    text = "\n".join(line(s, elapsed=1500.0, losses={"lm loss": 2.0}) for s in range(1, 50)) + "\n"
    rows = parse_log(text)
    assert len({id(r) for r in rows}) == len({id(r["extra"]) for r in rows}) == 49
    rows[0]["extra"]["note"] = 1
    rows[0]["loss"] = 0.0
    assert "note" not in rows[1]["extra"] and rows[1]["loss"] == 2.0
