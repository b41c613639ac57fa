"""False alarms and power of `mbx compare`'s decision rule (reports/compare.py) on real H200 step samples.

Run:  .venv/bin/python benchmarks/compare_stats.py [--trials 1000] [--seed 7] [--samples DIR] [--json]
      .venv/bin/python benchmarks/compare_stats.py --rates [--trials 1000]   # only the error-rate table
      .venv/bin/python benchmarks/compare_stats.py --one-run [--trials 2000]  # one run a side (issue 31)

Data: tests/data/h200-samples/aa-samples-h200 — 4 recorded runs (22 steps) of each of three points (base,
static capacity, fused cross entropy) on one H200. A run's usable steps are 2..22 (the first step never
counts). A *pseudo-repeat* is a window of 10 consecutive usable steps of one recorded run, at a uniformly
random offset (12 offsets); its value is the window's mean step time and its per-step samples are the 10 step
times. Consecutive steps keep their autocorrelation and each run its own level, so run-to-run spread is part
of the noise.

- A/A, resampled: both sides draw n pseudo-repeats each, run chosen uniformly with replacement from the same
  point's 4 runs (the null hypothesis holds exactly). Any practical DIFFERENT is a false alarm.
- A/A, split: the point's 4 runs are shuffled into two disjoint halves of 2 runs; each side takes one window
  from each run of its half (n = 2: every repeat a distinct real run, nothing shared between the sides). With
  n > 2 the windows cycle over the same 2 runs — pseudo-replication, a stress row that shows what happens when
  "repeats" are not independent runs: real run-to-run drift (base r0 is 1% faster than r1-r3) becomes a
  systematic A/B difference that the within-side spread underestimates.
- Power: like A/A resampled, with every B value and step time × (1 + effect), effect 2% (and 1%, 0.5%).
- Baselines, same trials: Pinpoint's rule applied to pooled per-step samples (min(KS, Mann-Whitney) ≤ 0.01
  over 10 × n steps per side, ignoring runs), and Mann-Whitney on the n repeat values at p ≤ 0.01.
- Until conclusive: `mbx compare --until-conclusive` simulated on resampled repeats: 2 per side, then one more
  per side while UNKNOWN, at most 6 extra cells (n → the mean repeats per side used), every look at α/K.
- Error rates (`--rates`, issue 23): false alarms (A/A called DIFFERENT), false SAME (a real change called
  SAME) and power (a real change called DIFFERENT) of fixed-n and sequential designs, on the H200 samples (A/A
  of the base point; the real fused-cross-entropy point against it, +17.9%; +1% injected, the threshold
  itself) and on synthetic lognormal repeats with a 40% CV (the seed-004 CPU case A: A/A and +17%). The
  sequential designs start at 3 repeats a side and add one a side per round while UNKNOWN, budget 6 extra
  cells (K = 4 looks): "α/K" tests every look at the split levels (what `mbx compare` does), "uncorrected"
  tests every look at the one-look levels (what optional stopping costs).
- One run a side (`--one-run`, issue 31): A/A resampled with n = 1 per side, each point, the within-run CI
  widened by a run-to-run floor: none (the steps alone: what the interval knew before), the stated default (1%),
  and the floor `mbx` would take from these 12 runs as a workspace's A/A repeats (orchestrator/judge/run_floor.py:
  the 95% upper bound of their pooled spread); false DIFFERENT, the share with p ≤ 0.01, and power at +2/5/10%.
- Real pairs: all 4 recorded runs per side, every metric, through orchestrator.judge.compare (decision, diagnosis).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import stats as sps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.judge import compare as cmp  # noqa: E402
from orchestrator.judge.run_floor import FloorBook, Spread  # noqa: E402
from reports import compare as stats  # noqa: E402
from reports.window import summarize, window_rows  # noqa: E402
from trainer import rundir  # noqa: E402

SAMPLES = ROOT / "tests" / "data" / "h200-samples" / "aa-samples-h200"
POINTS = {"base": "45ad6c6851", "static capacity": "a8ddbee1ab", "fused cross entropy": "7db0e86111"}
WINDOW = 10


def usable_steps(samples: Path, point: str) -> list[np.ndarray]:
    """Per run of the point: step times of the steps a window may hold (never the first step)."""
    runs = []
    for run in sorted(samples.glob(f"{point}-r*")):
        rows = rundir.read_metrics(run / "1")
        runs.append(np.array([r["step_time_ms"] for r in window_rows(rows, window=len(rows))], dtype=float))
    return runs


def pseudo_repeats(rng: np.random.Generator, runs: list[np.ndarray], n: int, scale: float = 1.0,
                   cycle: bool = False) -> stats.Samples:  # fmt: skip
    """n windows of WINDOW consecutive steps, each from a run drawn with replacement from `runs` (or, with
    `cycle`, from runs[0], runs[1], ... in turn)."""
    steps = []
    for i in range(n):
        run = runs[i % len(runs)] if cycle else runs[rng.integers(len(runs))]
        start = rng.integers(len(run) - WINDOW + 1)
        steps.append(run[start : start + WINDOW] * scale)
    return stats.Samples([float(s.mean()) for s in steps], [list(s) for s in steps])


def baselines(a: stats.Samples, b: stats.Samples) -> tuple[bool, bool]:
    """(Pinpoint rule on pooled steps says different, Mann-Whitney on repeat values says different)."""
    sa = np.concatenate([np.asarray(s) for s in a.steps])
    sb = np.concatenate([np.asarray(s) for s in b.steps])
    pooled = min(sps.ks_2samp(sa, sb).pvalue, sps.mannwhitneyu(sa, sb).pvalue) <= stats.ALPHA
    repeats = sps.mannwhitneyu(a.repeats, b.repeats).pvalue <= stats.ALPHA
    return bool(pooled), bool(repeats)


def trial_set(rng: np.random.Generator, runs: list[np.ndarray], n: int, trials: int, effect: float = 0.0,
              split: bool = False) -> dict[str, float]:  # fmt: skip
    """Decision shares over `trials` comparisons, plus the two baselines' DIFFERENT rates."""
    counts: Counter[str] = Counter()
    pooled = by_repeat = 0
    for _ in range(trials):
        order = rng.permutation(len(runs))
        left = [runs[i] for i in order[: len(runs) // 2]] if split else runs
        right = [runs[i] for i in order[len(runs) // 2 :]] if split else runs
        a = pseudo_repeats(rng, left, n, cycle=split)
        b = pseudo_repeats(rng, right, n, 1 + effect, cycle=split)
        d = stats.compare_samples(a, b)
        worse = stats.is_bad(d, higher_is_worse=True)
        counts["different" if d.decision == stats.DIFFERENT else d.decision] += 1
        counts["worse"] += worse
        p, r = baselines(a, b)
        pooled += p
        by_repeat += r
    row = {k: counts[k] / trials for k in (*stats.DECISIONS, "worse")}
    row.update(pinpoint_pooled_steps=pooled / trials, mwu_repeats=by_repeat / trials)
    return row


def _grow(
    rng: np.random.Generator, side: stats.Samples, runs: list[np.ndarray], scale: float
) -> stats.Samples:
    more = pseudo_repeats(rng, runs, 1, scale)
    return stats.Samples(side.repeats + more.repeats, side.steps + more.steps)


def sequential_set(rng: np.random.Generator, runs: list[np.ndarray], start: int, budget: int, trials: int,
                   effect: float = 0.0) -> dict[str, float]:  # fmt: skip
    """`--until-conclusive` on resampled repeats: start with `start` per side, add one per side while UNKNOWN
    and 2 extra cells fit in `budget`, every look at the levels split over its looks; final decision shares and
    the mean repeats per side used."""
    counts: Counter[str] = Counter()
    used = 0
    looks = 1 + budget // 2
    for _ in range(trials):
        a, b = pseudo_repeats(rng, runs, start), pseudo_repeats(rng, runs, start, 1 + effect)
        spent = 0
        d = stats.compare_samples(a, b, looks=looks)
        while d.decision == stats.UNKNOWN and spent + 2 <= budget:
            a, b = _grow(rng, a, runs, 1.0), _grow(rng, b, runs, 1 + effect)
            spent += 2
            d = stats.compare_samples(a, b, looks=looks)
        counts["different" if d.decision == stats.DIFFERENT else d.decision] += 1
        counts["worse"] += stats.is_bad(d, higher_is_worse=True)
        used += len(a.repeats)
    row = {k: counts[k] / trials for k in (*stats.DECISIONS, "worse")}
    row.update(pinpoint_pooled_steps=float("nan"), mwu_repeats=float("nan"), mean_repeats=used / trials)
    return row


# ---- error rates of fixed-n and sequential designs (issue 23) ------------------------------------------------
Draw = Callable[[np.random.Generator, int], tuple[list[float], list[float]]]  # n → (A values, B values)


def real_draw(runs_a: list[np.ndarray], runs_b: list[np.ndarray], scale: float = 1.0) -> Draw:
    """Pseudo-repeats of two recorded points (B × scale)."""
    return lambda rng, n: (pseudo_repeats(rng, runs_a, n).repeats, pseudo_repeats(rng, runs_b, n, scale).repeats)


def lognormal_draw(effect: float, cv: float) -> Draw:
    """Synthetic repeats: lognormal with coefficient of variation `cv`, B's median × (1 + effect)."""
    sd = float(np.sqrt(np.log1p(cv**2)))
    return lambda rng, n: (list(np.exp(rng.normal(0, sd, n))), list(np.exp(rng.normal(np.log1p(effect), sd, n))))


def design_run(rng: np.random.Generator, draw: Draw, start: int, rounds: int, looks: int) -> tuple[str, int]:
    """One comparison: `start` repeats a side, then up to `rounds` rounds of one more a side while UNKNOWN, each
    look at the levels split over `looks`; (final decision, repeats per side used)."""
    a, b = draw(rng, start)
    for round_ in range(rounds + 1):
        d = stats.compare_samples(stats.Samples(a), stats.Samples(b), looks=looks)
        if d.decision != stats.UNKNOWN or round_ == rounds:
            return d.decision, len(a)
        more_a, more_b = draw(rng, 1)
        a, b = a + more_a, b + more_b
    raise AssertionError("unreachable")


DESIGNS = (  # name, start, rounds, looks the levels are split over
    ("fixed n = 3", 3, 0, 1),
    ("fixed n = 6", 6, 0, 1),
    ("sequential 3→6, α/K (mbx)", 3, 3, 4),
    ("sequential 3→6, uncorrected", 3, 3, 1),
)


def rates(samples: Path, trials: int, seed: int) -> list[dict]:
    """False alarms, false SAME and power of each design on the real and synthetic cases."""
    rng = np.random.default_rng(seed)
    base = usable_steps(samples, POINTS["base"])
    fused = usable_steps(samples, POINTS["fused cross entropy"])
    cases = (
        ("H200 A/A (base)", 0.0, real_draw(base, base)),
        ("H200 real: fused CE vs base (+17.9%)", 0.179, real_draw(base, fused)),
        ("H200 +1% injected (the threshold)", 0.01, real_draw(base, base, 1.01)),
        ("synthetic A/A, CV 40%", 0.0, lognormal_draw(0.0, 0.40)),
        ("synthetic +17%, CV 40%", 0.17, lognormal_draw(0.17, 0.40)),
    )
    rows = []
    for case, effect, draw in cases:
        for design, start, rounds, looks in DESIGNS:
            counts: Counter[str] = Counter()
            used = 0
            for _ in range(trials):
                decision, n = design_run(rng, draw, start, rounds, looks)
                counts[decision] += 1
                used += n
            share = {k: counts[k] / trials for k in stats.DECISIONS}
            rows.append({"case": case, "effect": effect, "design": design, **share, "mean_repeats": used / trials})
    return rows


def print_rates(rows: list[dict], trials: int, seed: int) -> None:
    """Markdown: per case and design, false alarm (A/A DIFFERENT), false SAME and power (DIFFERENT)."""
    print(f"{trials} comparisons per row, seed {seed}; the goals: false alarm ≤ {stats.ALPHA:.0%}, false SAME ≤ "
          f"{stats.EQUIVALENCE_ALPHA:.1%} (a change of at least the {stats.MIN_EFFECT:.0%} threshold called SAME)\n")
    print("| case | design | false alarm (A/A DIFFERENT) | false SAME | power (DIFFERENT) | SAME (any) | "
          "UNKNOWN | repeats a side |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        aa = r["effect"] == 0
        alarm = f"{r['different']:.1%}" if aa else ""
        false_same = "" if aa else f"{r['same'] + r['below-practical']:.1%}"
        power = "" if aa else f"{r['different']:.1%}"
        print(f"| {r['case']} | {r['design']} | {alarm} | {false_same} | {power} | "
              f"{r['same'] + r['below-practical']:.1%} | {r['unknown']:.1%} | {r['mean_repeats']:.2f} |")


def samples_floor(samples: Path) -> stats.RunFloor:
    """The floor a workspace holding these 12 runs (3 points × 4 repeats) would give one-run comparisons."""
    spread = Spread()
    for point in POINTS.values():
        runs = sorted(samples.glob(f"{point}-r*"))
        spread.add([summarize(rundir.read_metrics(run / "1")).step_time_ms for run in runs])
    return FloorBook({("bundled", "H200", "step_time_ms"): spread}).floor("bundled", "H200", "step_time_ms")


def one_run(samples: Path, trials: int, seed: int) -> list[dict]:
    """One run a side: A/A false DIFFERENT and p ≤ 0.01 shares per point, power at +2/5/10%, per floor."""
    rng = np.random.default_rng(seed)
    pools = {name: usable_steps(samples, pid) for name, pid in POINTS.items()}
    floors = (("none (steps alone)", stats.RunFloor(0.0, "none")), ("default 1%", stats.DEFAULT_RUN_FLOOR),
              ("workspace", samples_floor(samples)))  # fmt: skip
    rows = []
    for label, floor in floors:
        for name, runs in pools.items():
            cases = [("A/A", 0.0)] + ([(f"+{e:.0%}", e) for e in (0.02, 0.05, 0.10)] if name == "base" else [])
            for case, effect in cases:
                different = low = 0
                for _ in range(trials):
                    a, b = pseudo_repeats(rng, runs, 1), pseudo_repeats(rng, runs, 1, 1 + effect)
                    d = stats.compare_samples(a, b, run_floor=floor)
                    different += d.decision == stats.DIFFERENT
                    low += d.p_value is not None and d.p_value <= stats.ALPHA
                rows.append({"floor": label, "floor_rel": floor.rel, "point": name, "case": case,
                             "different": different / trials, "p_le_alpha": low / trials})  # fmt: skip
    return rows


def print_one_run(rows: list[dict], trials: int, seed: int) -> None:
    print(f"{trials} comparisons per row, seed {seed}; one run a side, 10-step windows of the recorded H200 runs\n")
    print("| floor | point | case | DIFFERENT | p ≤ 0.01 |")
    print("|---|---|---|--:|--:|")
    for r in rows:
        print(f"| {r['floor']} ({r['floor_rel']:.2%}) | {r['point']} | {r['case']} | {r['different']:.1%} | "
              f"{r['p_le_alpha']:.1%} |")


def real_pairs(samples: Path) -> list[dict]:
    """Base against each other point, all 4 runs per side, every metric, as `mbx compare` decides."""
    points = {}
    for name, point_id in POINTS.items():
        point = cmp.Point("h200", point_id, name, {}, [])
        for run in sorted(samples.glob(f"{point_id}-r*")):
            rows = rundir.read_metrics(run / "1")
            point.repeats.append(cmp.Repeat(run.name, summarize(rows).to_dict(), window_rows(rows), {}))
        points[name] = point
    out = []
    for name in ("base", "static capacity", "fused cross entropy"):
        result = cmp.compare_pair(points["base"], points[name], cmp.METRICS, stats.MIN_EFFECT)
        out.append({"pair": f"base vs {name}", "diagnosis": result.diagnosis,
                    "metrics": {k: {"decision": cmp.verdict_word(d, next(m for m in cmp.METRICS if m.name == k)),
                                    "change": round(d.change, 5) if d.change is not None else None,
                                    "ci": [d.ci_low, d.ci_high], "p": d.p_value, "more_repeats": d.more_repeats}
                                for k, d in result.decisions.items()}})  # fmt: skip
    return out


def run(samples: Path, trials: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    pools = {name: usable_steps(samples, pid) for name, pid in POINTS.items()}
    rows = []
    for name, runs in pools.items():
        for n in (1, 2, 3, 4, 5):
            rows.append({"test": "A/A resampled", "point": name, "n": n, **trial_set(rng, runs, n, trials)})
    for n in (2, 3, 4, 5):
        rows.append({"test": "A/A split halves", "point": "base", "n": n,
                     **trial_set(rng, pools["base"], n, trials, split=True)})  # fmt: skip
    for effect in (0.02, 0.01, 0.005):
        for n in (2, 3, 4, 5):
            rows.append({"test": f"+{effect:.1%} slowdown", "point": "base", "n": n,
                         **trial_set(rng, pools["base"], n, trials, effect=effect)})  # fmt: skip
    for effect in (0.0, 0.01, 0.02):
        label = "A/A" if effect == 0 else f"+{effect:.1%} slowdown"
        rows.append({"test": f"until-conclusive {label} (start 2, budget 6)", "point": "base", "n": 2,
                     **sequential_set(rng, pools["base"], 2, 6, trials, effect)})  # fmt: skip
    return {"trials": trials, "seed": seed, "rows": rows, "real": real_pairs(samples)}


def print_table(result: dict) -> None:
    head = ("test", "point", "n", "SAME", "below", "UNKNOWN", "DIFF", "worse", "pooled-steps", "MWU-reps")
    print(f"{result['trials']} trials per row, seed {result['seed']}; shares of decisions (step time)")
    print(" | ".join(head))
    for r in result["rows"]:
        cells = (
            r["test"],
            r["point"],
            str(r["n"]) + (f" → {r['mean_repeats']:.2f}" if "mean_repeats" in r else ""),
            *(
                f"{r[k]:.3f}"
                for k in (
                    "same",
                    "below-practical",
                    "unknown",
                    "different",
                    "worse",
                    "pinpoint_pooled_steps",
                    "mwu_repeats",
                )
            ),
        )
        print(" | ".join(cells))
    for pair in result["real"]:
        print(f"\n{pair['pair']}: " + "; ".join(
            f"{k} {v['decision']} {v['change']:+.2%}" if v["change"] is not None else f"{k} {v['decision']}"
            for k, v in pair["metrics"].items()))  # fmt: skip
        for line in pair["diagnosis"]:
            print(f"  diagnosis: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--samples", type=Path, default=SAMPLES)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rates", action="store_true", help="only the error-rate table of the designs")
    parser.add_argument("--one-run", action="store_true", help="only the one-run-a-side table (issue 31)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)  # scipy notes (KS exact → asymptotic), not findings
    if args.one_run:
        found = one_run(args.samples, args.trials, args.seed)
        print(json.dumps(found, indent=2)) if args.json else print_one_run(found, args.trials, args.seed)
        return
    if args.rates:
        rows = rates(args.samples, args.trials, args.seed)
        print(json.dumps(rows, indent=2)) if args.json else print_rates(rows, args.trials, args.seed)
        return
    result = run(args.samples, args.trials, args.seed)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
