"""Property tests of the Megatron parsers: rows rendered with Megatron's own format strings come back; wraps, cuts and chunking never change or invent a value."""

from __future__ import annotations

import math
import os
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from reports.parsers import make_parser, parse_log

MIB = 1 / 1024
# Examples per property: bounded for the everyday suite (each property's whole log set takes a few seconds);
# MBX_PROPERTY_EXAMPLES=500 searches deeper.
EXAMPLES = int(os.environ.get("MBX_PROPERTY_EXAMPLES", "60"))

# ---- Megatron's format strings (megatron/training/training.py training_log; utils report_memory) ----


def render_iteration(p: dict[str, Any]) -> str:
    """One iteration line exactly as Megatron-LM prints it, from the parameters of `iteration_params`."""
    s = f" [{p['stamp']}]" if p["stamp"] else ""
    s += " iteration {:8d}/{:8d} |".format(p["step"], p["total"])
    s += " consumed samples: {:12d} |".format(p["consumed"])
    if p["skipped_samples"]:
        s += " skipped samples: {:12d} |".format(p["skipped_samples"])
    s += " elapsed time per iteration (ms): {:.1f} |".format(p["elapsed"])
    if p["throughput"] is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {p['throughput']:.1f} |"
    if p["lr"] is not None:
        s += f" learning rate: {p['lr']:.6E} |"
    s += f" global batch size: {p['gbs']:5d} |"
    for key, avg in p["losses"].items():
        if avg >= 0.0:  # Megatron drops NaN (and negative) averages from the line
            s += f" {key}: {avg:.6E} |"
    s += f" loss scale: {p['loss_scale']:.1f} |"
    if p["grad_norm"] is not None:
        s += f" grad norm: {p['grad_norm']:.3f} |"
    if p["num_zeros"] is not None:
        s += f" num zeros: {p['num_zeros']} |"
    if p["params_norm"] is not None:
        s += f" params norm: {p['params_norm']:.3f} |"
    s += " number of skipped iterations: {:3d} |".format(p["skipped"])
    s += " number of nan iterations: {:3d} |".format(p["nans"])
    return s


def render_memory(step: int, rank: int, values: tuple[float, float, float, float], raw: bool) -> str:
    """`[Rank N] (after N iterations) memory (MB) | ...`: raw floats (before 2026-01) or `.2f`."""
    fmt = "{}" if raw else "{:.2f}"
    names = ("allocated", "max allocated", "reserved", "max reserved")
    body = "".join(f" | {name}: {fmt.format(v)}" for name, v in zip(names, values, strict=True))
    return f"[Rank {rank}] (after {step} iterations) memory (MB){body}"


def expected_row(p: dict[str, Any]) -> dict[str, Any]:
    """What the parser must read back: every value as printed (after the format's rounding)."""

    def printed(fmt: str, value: float) -> float:
        return float(fmt.format(value))

    losses = {k: printed("{:.6E}", v) for k, v in p["losses"].items() if v >= 0.0}
    extra: dict[str, Any] = {
        "consumed samples": p["consumed"],
        "global batch size": p["gbs"],
        "loss scale": printed("{:.1f}", p["loss_scale"]),
        "number of skipped iterations": p["skipped"],
        "number of nan iterations": p["nans"],
        "train iters": p["total"],
    }
    extra.update({k: v for k, v in losses.items() if k != "lm loss"})
    if p["skipped_samples"]:
        extra["skipped samples"] = p["skipped_samples"]
    if p["num_zeros"] is not None:
        extra["num zeros"] = float(p["num_zeros"])
    if p["params_norm"] is not None:
        extra["params norm"] = printed("{:.3f}", p["params_norm"])
    if p["stamp"]:
        extra["timestamp"] = p["stamp"]
    return {
        "step": p["step"],
        "loss": losses.get("lm loss"),
        "grad_norm": None if p["grad_norm"] is None else printed("{:.3f}", p["grad_norm"]),
        "lr": None if p["lr"] is None else printed("{:.6E}", p["lr"]),
        "step_time_ms": printed("{:.1f}", p["elapsed"]),
        "tflops_per_gpu": None if p["throughput"] is None else printed("{:.1f}", p["throughput"]),
        "skipped": p["skipped"] > 0,
        "nan": p["nans"] > 0,
        "extra": extra,
    }


finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
loss_value = st.one_of(st.floats(min_value=0.0, max_value=30.0), st.just(float("nan")))
grad_norm = st.one_of(
    st.none(), st.floats(min_value=0.0, max_value=1e4), st.sampled_from([math.nan, math.inf])
)
stamps = st.sampled_from([None, "2024-10-24 09:49:45", "2026-03-31 14:11:11.448457"])
extra_loss_names = st.lists(
    st.sampled_from(["mtp_1 loss", "z_loss", "load_balancing_loss", "sop loss"]), unique=True
)


@st.composite
def iteration_params(draw, step: int | None = None) -> dict[str, Any]:
    step = draw(st.integers(1, 10**7)) if step is None else step
    nans = draw(st.integers(0, 3))
    losses = {"lm loss": draw(loss_value)} if draw(st.booleans()) or True else {}
    for name in draw(extra_loss_names):
        losses[name] = draw(st.floats(min_value=0.0, max_value=30.0))
    return {
        "stamp": draw(stamps),
        "step": step,
        "total": draw(st.integers(step, 10**8)),
        "consumed": draw(st.integers(0, 10**11)),
        "skipped_samples": draw(st.integers(0, 1000)),
        "elapsed": draw(finite),
        "throughput": draw(st.one_of(st.none(), finite)),
        "lr": draw(st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0))),
        "gbs": draw(st.integers(1, 99999)),
        "losses": losses,
        "loss_scale": draw(st.sampled_from([1.0, 65536.0, 0.5])),
        "grad_norm": draw(grad_norm),
        "num_zeros": draw(st.one_of(st.none(), st.integers(0, 10**9).map(float))),
        "params_norm": draw(st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e5))),
        "skipped": draw(st.integers(0, 100)),
        "nans": nans,
    }


def same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def check_row(row: dict[str, Any], want: dict[str, Any]) -> None:
    for key, value in want.items():
        if key == "extra":
            assert row["extra"].keys() == value.keys()
            for k, v in value.items():
                assert same(row["extra"][k], v), (k, row["extra"][k], v)
        elif key == "nan":
            loss = want["loss"]
            assert row["nan"] is (value or (loss is not None and not math.isfinite(loss)))
        else:
            assert same(row[key], value), (key, row[key], value)


def both_paths(text: str) -> list[dict[str, Any]]:
    """Parse through `feed` (bulk fast path) and line by line; the two must agree."""
    fed = parse_log(text)
    parser = make_parser(lag=None)
    lines = sorted(parser.iter_lines(text.splitlines(keepends=True)), key=lambda r: r["step"])
    assert len(fed) == len(lines)
    for a, b in zip(fed, lines, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key == "extra":
                assert a["extra"].keys() == b["extra"].keys()
                assert all(same(a["extra"][k], b["extra"][k]) for k in a["extra"])
            else:
                assert same(a[key], b[key]), key
    return fed


@given(iteration_params(), st.sampled_from(["", "7: ", "[rank7]: ", "[default7]: ", "job_perf/7 "]))
@settings(max_examples=2 * EXAMPLES, deadline=None)
def test_rendered_iteration_line_round_trips(params: dict[str, Any], label: str) -> None:
    text = label + render_iteration(params) + "\n"
    rows = both_paths(text)
    assert len(rows) == 1
    check_row(rows[0], expected_row(params))


@st.composite
def logs(draw) -> tuple[str, list[dict[str, Any]]]:
    """A log of 1-12 iteration lines (one layout, as one run prints) with memory lines and noise."""
    n = draw(st.integers(1, 12))
    first = draw(st.integers(1, 1000))
    template = draw(iteration_params(step=first))
    params = []
    for i in range(n):
        p = dict(template)
        p.update(
            step=first + i,
            consumed=draw(st.integers(0, 10**9)),
            elapsed=draw(finite),
            losses={k: draw(st.floats(min_value=0.0, max_value=30.0)) for k in template["losses"]},
            grad_norm=None if template["grad_norm"] is None else draw(st.floats(min_value=0, max_value=99)),
        )
        p["total"] = max(p["total"], p["step"])
        params.append(p)
    lines: list[str] = []
    noise = [
        "INFO:megatron.core.timers:(min, max) time across ranks (ms):",
        "    forward-backward ...............................: (1503.22, 1503.41)",
        "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: deprecated",
        "  return func(*args, **kwargs)",
        "[Gloo] Rank 0 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7",
    ]
    for p in params:
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(noise)))
        memory_first = draw(st.booleans())
        mem = None
        if draw(st.integers(0, 3)) == 0:
            values = tuple(draw(st.floats(min_value=0, max_value=1e5)) for _ in range(4))
            mem = render_memory(p["step"], 0, values, raw=draw(st.booleans()))
        if mem and memory_first:
            lines.append(mem)
        # Bridge prints one number in both places
        tflops = p["elapsed"] % 500 if p["throughput"] is None else p["throughput"]
        step_time = f"Step Time : {p['elapsed'] / 1000:.2f}s GPU utilization: {tflops:.1f}MODEL_TFLOP/s/GPU"
        bridge = draw(st.sampled_from([None, "before", "after"]))
        if bridge == "before":
            lines.append(step_time)
        lines.append(render_iteration(p))
        if bridge == "after":
            lines.append(step_time)
        if mem and not memory_first:
            lines.append(mem)
        if draw(st.integers(0, 4)) == 0:  # Megatron's evaluate_and_print_results
            value = draw(st.floats(min_value=0, max_value=20))
            text = f" validation loss at iteration {p['step']} | lm loss value: {value:.6E} | lm loss PPL: "
            lines += ["-" * 100, text + f"{math.exp(min(20, value)):.6E} | ", "-" * 100]
    return "\n".join(lines) + "\n", params


@given(logs())
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_rendered_logs_round_trip(log: tuple[str, list[dict[str, Any]]]) -> None:
    text, params = log
    rows = both_paths(text)
    assert [r["step"] for r in rows] == [p["step"] for p in params]
    for row, p in zip(rows, params, strict=True):
        want = expected_row(p)
        if p["throughput"] is None and f"Step Time : {p['elapsed'] / 1000:.2f}s" in text:
            want["tflops_per_gpu"] = row["tflops_per_gpu"]  # Bridge's Step Time line filled it in
        row["extra"] = {
            k: v for k, v in row["extra"].items() if not k.startswith(("validation", "Step Time", "GPU"))
        }
        check_row(row, want)


def wrap(text: str, width: int) -> str:
    """Hard-wrap every line at `width` columns and strip trailing spaces, as a copy from a terminal
    or log viewer does (see the PR841 excerpt). Widths from 80 keep a record's head (`[stamp]
    iteration N/M |`, `[Rank N] (after N iterations) memory (MB)`) on its first line, which the
    parser needs to know a record starts there."""
    out = []
    for line in text.splitlines():
        pieces = [line[i : i + width] for i in range(0, len(line), width)] or [""]
        out.extend(piece.rstrip() for piece in pieces)
    return "\n".join(out) + "\n"


@given(logs(), st.integers(80, 260))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_terminal_wrapping_changes_no_value(log: tuple[str, list[dict[str, Any]]], width: int) -> None:
    """Every value survives; only an unknown loss key's inner space may be lost ("mtp_1loss") when
    the wrap falls on it before the parser has seen the terminal's full width."""
    text, _ = log
    plain = parse_log(text)
    wrapped = both_paths(wrap(text, width))
    assert len(wrapped) == len(plain)
    for a, b in zip(wrapped, plain, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key != "extra":
                assert same(a[key], b[key]), (key, a[key], b[key])
        squashed = {k.replace(" ", ""): v for k, v in a["extra"].items()}
        assert len(squashed) == len(b["extra"])
        for k, v in b["extra"].items():
            assert same(a["extra"].get(k, squashed.get(k.replace(" ", ""))), v), (k, a["extra"], b["extra"])


@given(logs(), st.data())
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_cut_log_never_gives_a_wrong_value(
    log: tuple[str, list[dict[str, Any]]], data: st.DataObject
) -> None:
    """Cut anywhere (a job killed mid-print): rows keep a subset of their fields, each value right."""
    text, _ = log
    full = {r["step"]: r for r in parse_log(text)}
    cut = data.draw(st.integers(0, len(text)))
    for row in both_paths(text[:cut]):
        assert row["step"] in full
        want = full[row["step"]]
        for key, value in row.items():
            if key == "extra":
                for k, v in value.items():
                    assert same(v, want["extra"].get(k)), (k, v, want["extra"].get(k))
            elif value is not None:
                assert same(value, want[key]) or key in ("skipped", "nan") and want[key] is value, (
                    key,
                    value,
                )


@given(logs(), st.lists(st.integers(1, 400), min_size=1, max_size=30))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_chunk_boundaries_do_not_matter(log: tuple[str, list[dict[str, Any]]], sizes: list[int]) -> None:
    text, _ = log
    data = text.encode()
    parser = make_parser(lag=None)
    rows: list[dict[str, Any]] = []
    pos, i = 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        rows.extend(parser.feed(data[pos : pos + size]))
        pos += size
        i += 1
    rows.extend(parser.close())
    assume(rows)
    whole = parse_log(text)
    assert len(rows) == len(whole)
    for a, b in zip(sorted(rows, key=lambda r: r["step"]), whole, strict=True):
        assert all(same(a[k], b[k]) for k in a if k != "extra")
        assert all(same(a["extra"][k], b["extra"][k]) for k in b["extra"])
