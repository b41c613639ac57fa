"""Each input mbx reads, made hostile at its limit (reports/limits.py), through the real CLI: wall and CPU seconds and
the peak memory (max RSS) of the process. Issue 32's targets: every one <= 2 s and <= 1 GB.

    .venv/bin/python benchmarks/hostile_inputs.py [--only NAME ...] [--keep DIR] [--mbx PATH]

Each case writes its input into a temporary folder (or --keep DIR), runs `mbx ...` once to warm the file cache and
once measured (a fresh process: imports count), and prints one Markdown row: the case, the input's size, the
exit code (0 accepted, 2 refused with a message), wall s, CPU s (user + system; steadier on a shared machine) and
peak RSS MB (the kernel's ru_maxrss of the child).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reports import limits  # noqa: E402

MBX = ROOT / ".venv" / "bin" / "mbx"
ITERATION = (" [2026-12-03 10:00:00] iteration {step:>8}/{last:>8} | consumed samples: {step} | elapsed time per "
             "iteration (ms): 100.0 | throughput per GPU (TFLOP/s/GPU): 300.0 | learning rate: 1.0E-04 | global "
             "batch size: 8 | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 1.0 | number of skipped "
             "iterations: 0 | number of nan iterations: 0 |\n")  # fmt: skip
CASES: dict[str, Callable[[Path], tuple[list[str], Path]]] = {}


def case(name: str):
    def register(make: Callable[[Path], tuple[list[str], Path]]):
        CASES[name] = make
        return make

    return register


def _words(n: int, length: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_letters + string.digits, k=length)) for _ in range(n)]


def _yaml_quoted(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


@case("campaign: 49,000 distinct env values (validate)")
def campaign_env(folder: Path):
    values = "".join(f"    V{i:05d}: {_yaml_quoted('v-' + w)}\n" for i, w in enumerate(_words(49_000, 40)))
    path = folder / "env.yaml"
    path.write_text(f"name: env\nenv:\n  values:\n{values}")
    return ["campaign", "validate", str(path)], path


@case("campaign: 99,000 values under credential-like names and quotes (validate)")
def campaign_credential_words(folder: Path):
    words = _words(33_000, 12, seed=1)
    values = "".join(f'    - "token key= password {w}"\n' for w in words)
    path = folder / "credwords.yaml"
    path.write_text(f"name: cw\nwandb:\n  tags:\n{values}")
    return ["campaign", "validate", str(path)], path


@case("campaign: one 4 MB description (validate)")
def campaign_description(folder: Path):
    text = "".join(random.Random(2).choices(string.ascii_letters + " :=-", k=limits.MAX_YAML_BYTES - 4096))
    path = folder / "description.yaml"
    path.write_text(f"name: d\ndescription: {_yaml_quoted(text)}\n")
    return ["campaign", "validate", str(path)], path


@case("card: 4 MB, 72,000 strings (card validate)")
def card_strings(folder: Path):
    notes = "".join(f"      - {_yaml_quoted('note ' + w + ' with ./train.sh --nodes 1')}\n"
                    for w in _words(72_000, 14, seed=3))  # fmt: skip
    path = folder / "strings.card.yaml"
    path.write_text("title: m\nitems:\n  pretrain:\n    H200:\n      status: verified\n      precision: bf16\n"
                    "      command: ./train.sh\n      metrics: {last_10_steps_model_tflops_per_gpu_avg: 300.0}\n"
                    f"      notes:\n{notes}")  # fmt: skip
    return ["card", "validate", str(path)], path


@case("card: one 4 MB string full of `password=…` (card validate)")
def card_one_string(folder: Path):
    text = "password=hunter2x " * ((limits.MAX_YAML_BYTES - 4096) // 18)
    path = folder / "one.card.yaml"
    path.write_text("title: m\nitems:\n  pretrain:\n    H200:\n      status: verified\n      precision: bf16\n"
                    f"      command: {_yaml_quoted(text)}\n"
                    "      metrics: {last_10_steps_model_tflops_per_gpu_avg: 300.0}\n")  # fmt: skip
    return ["card", "validate", str(path)], path


def _nested_assignments() -> str:
    """~3.8 MB of 4,000-character lines of `k0=key=key=…` (issue 32's review: the scan read each value to the end
    of its line again, 12 ms a line)."""
    return "\n".join(f"k{i}=" + "key=" * 1000 for i in range((limits.MAX_YAML_BYTES - 200_000) // 4008))


@case("campaign: 3.8 MB of `k0=key=key=…` lines of 4,000 characters (validate)")
def campaign_nested_assignments(folder: Path):
    path = folder / "nested.yaml"
    path.write_text(f"name: n\ntrainer: {{kind: command, command: [python, t.py]}}\n"
                    f"description: {_yaml_quoted(_nested_assignments())}\n")  # fmt: skip
    return ["campaign", "validate", str(path)], path


@case("card: 3.8 MB of `k0=key=key=…` lines of 4,000 characters (card validate)")
def card_nested_assignments(folder: Path):
    path = folder / "nested.card.yaml"
    path.write_text("title: m\nitems:\n  pretrain:\n    H200:\n      status: verified\n      precision: bf16\n"
                    f"      command: ./train.sh\n      notes: [{_yaml_quoted(_nested_assignments())}]\n"
                    "      metrics: {last_10_steps_model_tflops_per_gpu_avg: 300.0}\n")  # fmt: skip
    return ["card", "validate", str(path)], path


def _review_lines(n: int, line: Callable[[int], str]) -> str:
    """A campaign whose description is `n` lines (issue 32's second review: the scanner's hostile shapes)."""
    text = "".join(f"  {line(i)}\n" for i in range(n))
    return f"name: b\ndescription: |\n{text}trainer: {{kind: command, command: [python, t.py], log_format: megatron-lm}}\n"


@case('campaign: 150,000 lines `mykeyN = "vN"` (validate; the second review\'s A2)')
def campaign_keyword_lines(folder: Path):
    path = folder / "keyword.yaml"
    path.write_text(_review_lines(150_000, lambda i: f'mykey{i} = "v{i}"'))
    return ["campaign", "validate", str(path)], path


@case("campaign: 135,000 quoted random 24-character strings (validate; the second review's B2)")
def campaign_quoted_random(folder: Path):
    path = folder / "b64.yaml"
    path.write_text(_review_lines(135_000, lambda i, w=_words(135_000, 24, seed=5): f'"{w[i]}"'))
    return ["campaign", "validate", str(path)], path


@case("campaign: 9,000 lines `wandb login` + 40 × ` --host=x` (validate; exponential before)")
def campaign_wandb_login(folder: Path):
    path = folder / "wandb_login.yaml"
    path.write_text(_review_lines(9_000, lambda i: f"{i} wandb login" + " --host=x" * 40))
    return ["campaign", "validate", str(path)], path


@case("campaign: 1,000 lines of `key` + 4,000 spaces + a 44-character value (validate; cubic before)")
def campaign_key_spaces(folder: Path):
    path = folder / "key_spaces.yaml"
    path.write_text(
        _review_lines(1_000, lambda i: f"{i} key" + " " * 4000 + "a" * 44 + " key" + " " * 3 + "!")
    )
    return ["campaign", "validate", str(path)], path


@case('campaign: 1,000 lines `secretsecret…: "x"` of 4 KB (validate; KeywordDetector quadratic before)')
def campaign_keyword_bomb(folder: Path):
    path = folder / "secret_words.yaml"
    path.write_text(_review_lines(1_000, lambda i: f"a{i}" + "secret" * 680 + ': "abc"'))
    return ["campaign", "validate", str(path)], path


def _trace_events(n: int, name: Callable[[int], str]) -> str:
    step = '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": %d}'
    kernels = (json.dumps({"ph": "X", "cat": "kernel", "name": name(i), "pid": 0, "tid": 7, "ts": i * 2, "dur": 1,
                           "args": {"correlation": i}}) for i in range(n - 1))  # fmt: skip
    return '{"traceEvents": [' + ", ".join([step % (2 * n), *kernels]) + "]}"


@case(f"trace: {limits.MAX_TRACE_EVENTS:,} kernels, the event limit (profile show)")
def trace_events(folder: Path):
    names = ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
             "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >(...)")  # fmt: skip
    path = folder / "events.json"
    path.write_text(_trace_events(limits.MAX_TRACE_EVENTS, lambda i: names[i % 3] + str(i % 1000)))
    return ["profile", "show", str(path)], path


@case(f"trace: {limits.MAX_TRACE_EVENTS // 2:,} profiled steps, as many kernels (profile show)")
def trace_steps(folder: Path):
    half = limits.MAX_TRACE_EVENTS // 2  # each kernel was tested against every step window (issue 32 review)
    steps = (json.dumps({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
                         "ts": i * 10, "dur": 5}) for i in range(half))  # fmt: skip
    kernels = (json.dumps({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": half * 10 + 1000 + i,
                           "dur": 1}) for i in range(half))  # fmt: skip
    path = folder / "steps.json"
    path.write_text('{"traceEvents": [' + ", ".join([*steps, *kernels]) + "]}")
    return ["profile", "show", str(path)], path


@case("trace: one kernel name of 4 MB, the event-size limit (profile show)")
def trace_long_name(folder: Path):
    path = folder / "long.json"
    long = "void cutlass::Kernel<" + "x" * (limits.MAX_TRACE_VALUE_CHARS - 1024) + ">"
    path.write_text(_trace_events(3, lambda i: long if i == 0 else "nvjet_tst"))
    return ["profile", "show", str(path)], path


@case("trace: 0.6 MB .gz inflating past 512 MiB, events of 60 bytes (profile show)")
def trace_bomb(folder: Path):
    path = folder / "bomb.json.gz"
    event = b'{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":1},'
    block = gzip.compress(event * ((1 << 20) // len(event)), compresslevel=9)
    with path.open("wb") as handle:
        handle.write(gzip.compress(b'{"traceEvents": ['))
        for _ in range(limits.MAX_TRACE_BYTES // (1 << 20) + 8):
            handle.write(block)
    return ["profile", "show", str(path)], path


def _golden(path: Path, values: int, offset: float) -> None:
    per = values // 4
    doc = {metric: {"start_step": 1, "end_step": per, "step_interval": 1,
                    "values": {str(s): 10.0 + offset + (s % 97) * 1e-3 for s in range(1, per + 1)}}
           for metric in ("lm loss", "iteration-time", "mem-allocated-bytes", "num-zeros")}  # fmt: skip
    path.write_text(json.dumps(doc))


@case(f"golden: two files of {limits.MAX_GOLDEN_VALUES - 1000:,} values (compare)")
def golden_compare(folder: Path):
    a, b = folder / "a.json", folder / "b.json"
    _golden(a, limits.MAX_GOLDEN_VALUES - 1000, 0.0)
    _golden(b, limits.MAX_GOLDEN_VALUES - 1000, 0.001)
    return ["compare", str(a), str(b)], a


@case("log: 40 lines of 1 MiB, the line limit, among 2,000 iterations (ingest)")
def log_long_lines(folder: Path):
    path = folder / "rank0.log"
    long = "x" * (limits.MAX_LOG_LINE_CHARS - 2) + "\n"
    with path.open("w") as handle:
        for step in range(1, 2001):
            handle.write(ITERATION.format(step=step, last=2000, loss=10.0 - step * 1e-3))
            if step % 50 == 0:
                handle.write(long)
    return ["ingest", "bench", str(path), "-w", str(folder / "ws")], path


def measure(argv: list[str], mbx: Path = MBX) -> tuple[int, float, float, float, str]:
    """(exit code, wall s, CPU s, peak RSS MB, last stderr line) of one fresh `mbx` process."""
    start = time.perf_counter()
    proc = subprocess.Popen([str(mbx), *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    lines = stderr.decode(errors="replace").strip().splitlines()
    return (
        os.waitstatus_to_exitcode(status),
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
        (lines[-1][:160] if lines else ""),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="cases whose name holds one of these words")
    parser.add_argument("--keep", type=Path, default=None, help="write the inputs here (default: a temp dir)")
    parser.add_argument("--mbx", type=Path, default=MBX, help="the mbx to time (another checkout's: before)")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="mbx-hostile-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}, inputs in {folder}\n")
    print(
        "| input | size MB | exit | wall s | CPU s | peak RSS MB | ≤ 2 s and ≤ 1 GB |\n|---|---|---|---|---|---|---|"
    )
    for name, make in CASES.items():
        if args.only and not any(word in name for word in args.only):
            continue
        argv, path = make(folder)
        measure(argv, args.mbx)  # warm-up: the file cache
        code, wall, cpu, rss, last = measure(argv, args.mbx)
        ok = "yes" if wall <= 2 and rss <= 1024 else "NO"
        print(f"| {name} | {path.stat().st_size / 1e6:.1f} | {code} | {wall:.2f} | {cpu:.2f} | {rss:.0f} | {ok} |",
              flush=True)  # fmt: skip
        if code not in (0, 2, 3):
            print(f"    unexpected exit {code}: {last}")
        elif code == 2:
            print(f"    {last}")


if __name__ == "__main__":
    main()
