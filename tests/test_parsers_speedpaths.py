"""The bulk path of the Megatron-LM parser (`MegatronLMParser._bulk`, `fastpath.IterationLayout`)
against the line path: every row, value, type and key order must be the same, whatever the read
size and window, on logs made to hit each branch (fast regex declined, values over a newline,
constants changing, memos and caches filling up, lines that do not convert, marked gaps)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import reports.parsers
import reports.parsers.fastpath
import reports.parsers.megatron_lm
from reports.parsers import iter_rows, make_parser, parse_log

SIZES = [(1 << 16, 1 << 17), (4096, 4096), (333, 1000)]  # (read size, bulk window)


def iteration(step: int, rng: random.Random, **over: object) -> str:
    """An iteration line as Megatron-LM prints it (srun label, timestamp); `over` replaces values
    (None drops the field, "stamp" None drops the timestamp)."""
    fields = {
        "consumed samples": f"{step * 256:12d}",
        "elapsed time per iteration (ms)": f"{1500 + rng.randrange(100) / 10:.1f}",
        "throughput per GPU (TFLOP/s/GPU)": f"{400 + rng.random() * 20:.1f}",
        "learning rate": f"{3e-4 * rng.random():.6E}",
        "global batch size": f"{256:5d}",
        "lm loss": f"{2 + 8 * rng.random():.6E}",
        "load_balancing_loss": f"{1 + rng.random():.6E}",
        "loss scale": "1.0",
        "grad norm": f"{rng.random():.3f}",
        "number of skipped iterations": f"{0:3d}",
        "number of nan iterations": f"{0:3d}",
    }
    stamp = over.pop(
        "stamp", f"2026-04-15 11:{step // 60 % 60:02d}:{step % 60:02d}.{rng.randrange(10**6):06d}"
    )
    head = over.pop("head", f"iteration {step:8d}/{10_000_000:8d} |")
    for key, value in over.items():
        if value is None:
            fields.pop(key)
        else:
            fields[key] = str(value)
    body = "".join(f" {key}: {value} |" for key, value in fields.items())
    return f"7:  [{stamp}] {head}{body}\n" if stamp else f"7:  {head}{body}\n"


def memory(step: int) -> str:
    return (
        f"0: [Rank 0] (after {step} iterations) memory (MB) | allocated: 40000.25 | max allocated: 64000.5"
        " | reserved: 68000.0 | max reserved: 68000.0\n"
    )


NOISE = [
    "3: node-32:69804:92428 [2] NCCL INFO Channel 06/0 : 2 -> 4 via P2P/CUMEM/read\n",
    "1: WARNING:megatron.core.rerun_state_machine:Result validation enabled\n",
    "4: \x1b[32m[I 0415 11:19:02]\x1b[0m saving checkpoint shard 3 of 8 in 0.5 s\n",
    "5:   return func(*args, **kwargs)\n",
]


def log(steps: int, seed: int = 0, special: dict[int, str] | None = None, **over: object) -> str:
    """`steps` iteration lines with noise between and a memory line every 50 steps; `special`
    replaces the line of a step."""
    rng = random.Random(seed)
    out = []
    for step in range(1, steps + 1):
        if step % 50 == 1:
            out.append(memory(step))
        out.append((special or {}).get(step) or iteration(step, rng, **over))
        out.extend(rng.choice(NOISE) for _ in range(rng.choice((0, 1, 1, 2))))
    return "".join(out)


def line_path(text: str, **kw: object) -> list[dict]:
    return list(make_parser(**kw).iter_lines(text.splitlines(keepends=True)))


def assert_paths_agree(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    want = repr(line_path(text))
    path = tmp_path / "megatron.log"
    path.write_bytes(text.encode())
    for read, window in SIZES:
        monkeypatch.setattr(reports.parsers, "_READ_BUFFER", read)
        monkeypatch.setattr(reports.parsers.megatron_lm, "BULK_WINDOW", window)
        assert repr(list(iter_rows(path))) == want, (read, window)
    assert repr(parse_log(text)) == repr(sorted(line_path(text, lag=None), key=lambda r: r["step"]))
    return eval(want, {"nan": float("nan"), "inf": float("inf")})  # noqa: S307 - our own repr


def test_benchmark_like_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = assert_paths_agree(log(600), tmp_path, monkeypatch)
    assert [r["step"] for r in rows] == list(range(1, 601))
    assert sum(r["mem_allocated_gib"] is not None for r in rows) == 12


def test_unstamped_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    labelled = log(300, stamp=None)  # "7:  iteration ...": the unstamped regex wants the line start
    rows = assert_paths_agree(labelled, tmp_path, monkeypatch)
    assert "timestamp" not in rows[-1]["extra"]
    text = labelled.replace("7:  iteration", " iteration").replace(
        " iteration      100/", "\titeration      100/"
    )
    assert_paths_agree(text, tmp_path, monkeypatch)


def test_counters_that_change_and_count_nans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(1)
    special = {}
    for step in range(1, 400):
        over: dict[str, object] = {}
        if step > 100:
            over["loss scale"] = "65536.0" if step < 200 else "32768.0"
        if 150 <= step < 260:  # NaN / skipped counts over whole windows and here and there
            over["number of nan iterations"] = f"{1 + (step % 7 == 0):3d}"
            over["number of skipped iterations"] = f"{step % 3:3d}"
        if step % 97 == 0:
            over["lm loss"] = "nan"
        if step % 89 == 0:
            over["grad norm"] = "inf"
        if step > 300:
            over["global batch size"] = f"{256 + step:5d}"
        special[step] = iteration(step, rng, **over)
    rows = assert_paths_agree(log(400, special=special), tmp_path, monkeypatch)
    assert rows[151]["nan"] is True and rows[10]["nan"] is False
    assert rows[96]["nan"] is True


def test_layouts_without_loss_or_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_paths_agree(log(200, **{"lm loss": None}), tmp_path, monkeypatch)
    assert_paths_agree(log(200, **{"number of nan iterations": None}), tmp_path, monkeypatch)
    assert_paths_agree(
        log(200, **{"number of skipped iterations": None, "lm loss": None}), tmp_path, monkeypatch
    )
    rng = random.Random(9)
    special = {
        step: iteration(step, rng, **{"lm loss": None, "number of nan iterations": f"{step // 40 % 2:3d}"})
        for step in range(1, 200)
    }
    assert_paths_agree(log(200, special=special), tmp_path, monkeypatch)


def test_lines_the_fast_regex_declines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(2)
    special = {
        20: iteration(20, rng, head=f"iteration\t{20:8d}/{10_000_000:8d} |"),  # a tab: the exact regex
        40: iteration(40, rng, stamp="2026-04-15 11:00:01]x[1"),
        60: iteration(60, rng, **{"lm loss": "5.0:1"}),  # a colon in a value
        80: iteration(80, rng, **{"grad norm": "0.5\x1b[0m"}),
        100: iteration(100, rng, **{"lm loss": "abc"}),  # does not convert: line path
        120: iteration(120, rng, stamp="12:iteration 5"),  # "iteration" in the timestamp
        140: iteration(140, rng).replace("\n", "  \n"),  # trailing spaces
        160: iteration(160, rng).replace("\n", "\t\n"),  # trailing tab
        180: iteration(180, rng).replace("\n", "\r\n"),  # CRLF
        181: iteration(181, rng, stamp="13:iteration 6"),  # the same, next to a "\r"
        200: "7: glued iteration print [2026-04-15 11:00:00.1] " + iteration(200, rng)[4:],
        220: iteration(220, rng, **{"elapsed time per iteration (ms)": "1_500.5"}),
        230: iteration(230, rng, stamp="12 [2026-04-15 11:00:01.1"),  # "[" in what the fast regex takes
        240: iteration(240, rng, stamp="12] x: y"),  # "]" in it
        250: "2: " + "long line " * 300 + "\n",  # longer than a window
    }
    assert_paths_agree(log(260, special=special), tmp_path, monkeypatch)


def test_values_running_over_a_newline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    special = {
        30: iteration(30, rng).replace("iterations:   0 |\n", "iterations:   0\n |\n"),
        60: iteration(60, rng).replace("| loss scale", "\n | loss scale"),
        90: iteration(90, rng).replace("lm loss: ", "lm loss:\n "),
    }
    assert_paths_agree(log(120, special=special), tmp_path, monkeypatch)


def test_other_records_between_iterations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(4)
    text = log(120, seed=4)
    extra = (
        " validation loss at iteration 100 | lm loss value: 2.5E+00 | lm loss PPL: 1.2E+01 |\n"
        "------------------------ arguments ------------------------\n"
        "  seq_length ...................................... 4096\n"
        "  world_size ...................................... 8\n"
        "-------------------- end of arguments ---------------------\n"
    )
    cut = text.index("7:  [2026-04-15 11:01:41")  # step 101
    text = text[:cut] + extra + text[cut:] + iteration(121, rng) + memory(121)
    rows = assert_paths_agree(text, tmp_path, monkeypatch)
    assert rows[99]["eval_loss"] == 2.5 and rows[-1]["tokens_per_s_per_gpu"] is not None


def test_last_line_without_newline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = log(80)
    assert_paths_agree(text + iteration(81, random.Random(5))[:-1], tmp_path, monkeypatch)
    assert_paths_agree(text + iteration(81, random.Random(5))[:-30], tmp_path, monkeypatch)


def test_memos_and_caches_that_fill_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reports.parsers.fastpath, "MEMO_LIMIT", 40)
    rng = random.Random(6)
    special = {
        step: iteration(
            step,
            rng,
            **{
                "global batch size": f"{step:5d}",  # a memoised column with ever new values
                "elapsed time per iteration (ms)": f"{1000 + step / 10:.1f}",  # a cache that stops
                "grad norm": f"{step // 5 % 41 / 100:.3f}",  # a cache that fills up, starts over
            },
        )
        for step in range(1, 500)
    }
    rows = assert_paths_agree(log(500, special=special), tmp_path, monkeypatch)
    assert rows[-2]["extra"]["global batch size"] == 499


def test_duplicate_and_reserved_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    special = {}
    for step in range(1, 150):
        line = iteration(step, rng)
        if step > 50:
            line = line.replace(" | loss scale:", f" | lm loss: {step}.5 | timestamp: 3.0 | loss scale:")
        if step > 100:
            line = line.replace(" | grad norm:", f" | train iters: {step % 2} | loss scale: 2.0 | grad norm:")
        special[step] = line
    assert_paths_agree(log(150, special=special), tmp_path, monkeypatch)


def test_bridge_step_time_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(8)
    out = []
    for step in range(1, 200):
        line = iteration(step, rng)
        ms = float(line.split("elapsed time per iteration (ms): ")[1].split(" ")[0])
        step_time = f"0: Step Time : {ms / 1000:.2f}s GPU utilization: 412.3MODEL_TFLOP/s/GPU\n"
        out += [step_time, line] if step % 2 else [line, step_time]
    rows = assert_paths_agree("".join(out), tmp_path, monkeypatch)
    assert sum("Step Time (s)" in r["extra"] for r in rows) > 150
