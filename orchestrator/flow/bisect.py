"""`mbx bisect`: find the first version that changes a metric, over an ordered list of values of one sweep key
(the commits of `git rev-list GOOD..BAD` of a software repo, container tags, pip versions, env values).

The probes are the points of one bisect campaign (`<campaign>.bisect-<digest>`) run through the lifecycle
(orchestrator/flow/lifecycle.py: prepare, execute), so a second run reuses every completed cell. Both ends are measured first; the bisect refuses when
they do not differ. Each probe is decided against the good end by orchestrator/judge/compare.py's statistics
(reports/compare.py): DIFFERENT in the bad end's direction → bad; SAME (or below the practical threshold)
→ good; UNKNOWN → more repeats of both, up to a budget, then the bisect stops inconclusive.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from scipy import stats as sps

from orchestrator.errors import ConfigError, UsageError
from orchestrator.flow.options import Options
from orchestrator.judge import compare
from orchestrator.judge.outcome import FAIL, INCONCLUSIVE, PASS, Outcome, Part, exit_code
from orchestrator.spec import software
from orchestrator.spec.campaign import Campaign, Sweep
from orchestrator.spec.keys import key_problem, value_problem
from orchestrator.spec.sweep import canonical_json
from reports import compare as stats
from reports.pvalue import p_text

DEFAULT_REPEATS = 3
TYPED_NAMESPACES = ("software", "container", "env")  # their values stay text (a pip version 1.10 is not 1.1)


@dataclass(frozen=True)
class Plan:
    """What to bisect: the key, its ordered values (first good, last bad) and how to measure."""

    key: str
    values: list[Any]
    labels: list[str]
    repeats: int = DEFAULT_REPEATS
    max_repeats: int = 10
    metric: str = "step_time"
    min_effect: float = stats.MIN_EFFECT
    name: str = ""


@dataclass
class Measurement:
    """One measured version: its repeats, the metric's mean ± CI, and the decision against the good end."""

    index: int
    value: Any
    label: str
    role: str  # good end | bad end | probe
    repeats: int = 0
    mean: float | None = None
    ci: float | None = None  # half-width of the 95% CI of the mean over repeats
    decision: stats.Decision | None = None
    verdict: str = "unmeasured"  # good | bad | unknown | other-direction | no-result | unmeasured
    good_repeats: int = 0  # the good end's repeats it was compared with (those measured beside it)


@dataclass
class Result:
    """How the bisect ended: every measurement, the first bad version (if named), why, and the exit code."""

    plan: Plan
    campaign: str
    measurements: list[Measurement] = field(default_factory=list)
    culprit: Measurement | None = None
    last_good: Measurement | None = None
    diagnosis: list[str] = field(default_factory=list)
    message: str = ""
    # pass: the first bad version named; fail: refused, the ends do not differ (or did not run); else undecided
    verdict: str = INCONCLUSIVE

    def exit_code(self, inconclusive_ok: bool = False) -> int:
        """orchestrator/judge/outcome.py's exit code of the verdict: 0 named, 1 refused, 3 undecided."""
        return exit_code(self.verdict, inconclusive_ok)

    def outcome(self) -> Outcome:
        """The one closing line's outcome (orchestrator/judge/outcome.py): the verdict and the message."""
        return Outcome("", (Part("bisect", self.verdict, self.message),))


# ---- the list of versions ------------------------------------------------------------------------------
def git_values(campaign: Campaign, file: Path | None, repo: str | None, good: str, bad: str) -> Plan:
    """The commits GOOD, then `git rev-list --reverse GOOD..BAD` of a software repo, as values of its ref key."""
    repos = campaign.software.repos
    if repo is None:
        if len(repos) != 1:
            known = ", ".join(repos) or "none"
            raise UsageError(f"--repo: name the software.repos entry to bisect (known: {known})")
        repo = next(iter(repos))
    if repo not in repos:
        raise UsageError(
            f"--repo {repo!r}: no such entry in software.repos (known: {', '.join(repos) or 'none'})"
        )
    where = Path(software.SoftwareResolver(campaign.software, file).repo_dir(repo))
    shas = [software.resolve_ref(where, ref, repo) for ref in (good, bad)]
    done = subprocess.run(["git", "-C", str(where), "rev-list", "--reverse", f"{shas[0]}..{shas[1]}"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    commits = done.stdout.split()
    if done.returncode != 0 or not commits or commits[-1] != shas[1]:
        raise UsageError(f"--good {good} --bad {bad}: {bad} is not a descendant of {good} in {where}")
    values = [shas[0], *commits]
    return Plan(f"software.repos.{repo}.ref", values, [_subject(where, sha) for sha in values])


def _subject(repo: Path, sha: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%s", sha], capture_output=True,
                          text=True, check=False)  # fmt: skip
    return f"{sha[:10]} {done.stdout.strip()}".strip()


def listed_values(key: str, text: str) -> Plan:
    """`--values a,b,c` of any sweep key (YAML-typed, except software/container/env values: text)."""
    items = [item.strip() for item in text.split(",")]
    if len(items) < 2 or not all(items):
        raise UsageError(f"--values {text!r}: give at least two comma-separated values, good first, bad last")
    typed = key.split(".", 1)[0] not in TYPED_NAMESPACES
    values = [yaml.safe_load(item) if typed else item for item in items]
    return Plan(key, values, [str(v) for v in values])


def make_plan(campaign: Campaign, file: Path | None, *, good: str | None, bad: str | None, repo: str | None,
              key: str | None, values: str | None, repeats: int | None, max_repeats: int, metric: str,
              min_effect: float) -> Plan:  # fmt: skip
    """The bisect's plan from the command line (UsageError/ConfigError, exit 2, on bad input)."""
    check_campaign(campaign, file)
    if (good is None) != (bad is None) or (good is None) == (values is None):
        raise UsageError("give either --good REF --bad REF (a software repo) or --key KEY --values v1,v2,...")
    if values is not None:
        if not key:
            raise UsageError("--values needs --key (the sweep key the values are for)")
        plan = checked(listed_values(key, values))
    else:
        plan = git_values(campaign, file, repo, good or "", bad or "")
    if not 0 <= min_effect < 1:
        raise UsageError(f"--min-effect {min_effect}: must be a fraction in [0, 1), e.g. 0.01 for 1%")
    metric_of(metric)
    default = campaign.sweep.repeats if "repeats" in campaign.sweep.model_fields_set else DEFAULT_REPEATS
    count = repeats or max(2, default)
    plan = Plan(plan.key, plan.values, plan.labels, count, max(max_repeats, count), metric, min_effect)
    return Plan(**{**plan.__dict__, "name": plan_name(campaign, plan)})


def checked(plan: Plan) -> Plan:
    """The plan, when its key may be swept and its values could be rendered (the checks `mbx campaign validate`
    applies to a sweep: orchestrator/spec/keys.py); UsageError (exit 2) naming the key or value otherwise."""
    if problem := key_problem(plan.key):
        raise UsageError(f"--key {plan.key}: {problem}")
    for value in plan.values:
        if problem := value_problem(plan.key, value):
            raise UsageError(f"--values: {plan.key}={problem}")
    return plan


def plan_name(campaign: Campaign, plan: Plan) -> str:
    """The bisect campaign's name: stable for the same campaign, key and values (so a rerun resumes)."""
    digest = hashlib.sha256(canonical_json([campaign.name, plan.key, plan.values]).encode()).hexdigest()[:8]
    return f"{campaign.name[:48]}.bisect-{digest}"


# ---- the bisect campaign -------------------------------------------------------------------------------
def probe_campaign(campaign: Campaign, plan: Plan, indices: list[int], repeats: int) -> Campaign:
    """The campaign whose points are the given versions (the base recipe frozen), `repeats` cells each."""
    sweep = Sweep(cells=[{plan.key: plan.values[i]} for i in indices], repeats=repeats)
    return campaign.model_copy(update={"name": plan.name, "sweep": sweep, "baseline": None})


def check_campaign(campaign: Campaign, file: Path | None) -> None:
    """Refuse a campaign whose own sweep varies something: the bisect needs one frozen point."""
    sweep = campaign.sweep
    if sweep.axes or sweep.zip or sweep.cells:
        raise ConfigError(
            "sweep: a bisect measures one frozen point per version; remove sweep.axes/zip/cells (keep "
            "sweep.repeats) or fix the swept values in the recipe",
            file=str(file) if file else None,
        )


class Bisector:
    """Runs probes through the lifecycle (one bisect campaign in the store) and decides them."""

    def __init__(self, campaign: Campaign, file: Path | None, plan: Plan, options: Options):
        from orchestrator import trainers

        self.campaign, self.file, self.plan = campaign, file, plan
        self.workspace = Path(options.workspace)
        # each batch is executed by the lifecycle: the workspace, launcher and parallel of the command line;
        # no report or W&B per batch (the bisect's result is its own output)
        self.options = replace(options, make_report=False, log_wandb=False)
        self.kind = trainers.for_campaign(campaign)
        self.need: dict[int, int] = {}  # version index → repeats wanted
        self.point_of: dict[int, str] = {}
        # version index → the good end's repeat numbers measured in the same batches as it (its reference)
        self.good_with: dict[int, list[int]] = {}
        self.result = Result(plan, plan.name)
        self.log: Any = None  # a callable printing one progress line

    def check(self) -> None:
        """Expand every version once (exit 2 on a bad key or value), before anything runs."""
        points = self.kind.expand(probe_campaign(self.campaign, self.plan, list(range(len(self.plan.values))), 1),
                                  self.file)  # fmt: skip
        by_value = {canonical_json(p.params.get(self.plan.key)): p.point_id for p in points}
        for i, value in enumerate(self.plan.values):
            if canonical_json(value) not in by_value:
                raise UsageError(
                    f"{self.plan.key}={value!r} is the same point as an earlier value: list it once"
                )
            self.point_of[i] = by_value[canonical_json(value)]
        if len(set(self.point_of.values())) != len(self.plan.values):
            raise UsageError(f"{self.plan.key}: two values resolve to the same point (the same commit?)")

    def measure(self, wanted: dict[int, int]) -> None:
        """Run what is missing for these versions (repeats each) through the lifecycle; completed cells are reused."""
        from orchestrator.flow.lifecycle import run_points

        before = {self.point_of[i]: n for i, n in self.need.items()}
        for index, count in wanted.items():
            self.need[index] = max(self.need.get(index, 0), count)
        indices = sorted(self.need)
        bisect_campaign = probe_campaign(self.campaign, self.plan, indices, max(self.need.values()))
        points = self.kind.expand(bisect_campaign, self.file)
        keep = {self.point_of[i]: self.need[i] for i in indices}
        chosen = [p for p in points if p.repeat < keep.get(p.point_id, 0)]
        # interleaved (A B A B …) within this batch: drift between runs hits every version alike
        chosen.sort(key=lambda p: p.repeat - before.get(p.point_id, 0))
        # the lifecycle's lines are progress (stderr); stdout gets the result
        with contextlib.redirect_stdout(sys.stderr):
            run_points(bisect_campaign, chosen, self.file, self.options)

    def points(self) -> dict[str, compare.Point]:
        from orchestrator.run.store import Store

        with Store(self.workspace, create=False) as store:
            return {p.point_id: p for p in compare.load_points(store, self.plan.name)}


def metric_of(name: str) -> compare.Metric:
    for metric in compare.METRICS:
        if metric.name == name:
            return metric
    raise UsageError(f"--metric {name}: unknown (choose from {', '.join(compare.METRIC_NAMES)})")


def mean_ci(point: compare.Point, metric: compare.Metric) -> tuple[float | None, float | None]:
    """Mean of the repeat values and the half-width of its 95% t confidence interval (None with one repeat)."""
    values = [r.summary.get(metric.summary_key) for r in point.repeats]
    values = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    low, _high = sps.t.interval(stats.CONFIDENCE, len(values) - 1, loc=mean, scale=sps.sem(values))
    return mean, (mean - low) if math.isfinite(low) else 0.0


# ---- deciding ----------------------------------------------------------------------------------------------
class Search(Bisector):
    """The bisect proper: the ends, then binary search, each probe decided against the good end."""

    def role(self, index: int) -> str:
        return "good end" if index == 0 else "bad end" if index == len(self.plan.values) - 1 else "probe"

    def judge(self, index: int, direction: float | None, points: dict[str, compare.Point]) -> Measurement:
        """Version `index` against the good end, from what the store holds now (nothing is run)."""
        plan, metric = self.plan, metric_of(self.plan.metric)
        m = Measurement(index, plan.values[index], plan.labels[index], self.role(index))
        probe, good = points.get(self.point_of[index]), points.get(self.point_of[0])
        if probe is None or not probe.repeats:
            m.verdict = "no-result"
            return m
        m.repeats = len(probe.repeats)
        m.mean, m.ci = mean_ci(probe, metric)
        if index == 0:
            m.verdict = "good"
            return m
        if good is None or not good.repeats:
            m.verdict = "no-result"
            return m
        good = self.paired_good(index, good)
        m.good_repeats = len(good.repeats)
        d = compare.compare_pair(good, probe, (metric,), plan.min_effect).decisions[metric.name]
        m.decision = d
        if d.decision == stats.DIFFERENT:
            same_way = direction is None or (d.change or 0.0) * direction > 0
            m.verdict = "bad" if same_way else "other-direction"
        elif d.decision in (stats.SAME, stats.BELOW_PRACTICAL):
            m.verdict = "good"
        else:
            m.verdict = "unknown"
        return m

    def paired_good(self, index: int, good: compare.Point) -> compare.Point:
        """The good end's repeats measured beside version `index` (all of them when none are recorded): a probe
        is compared with the good end as it ran at the same time, not with repeats from minutes before, when
        the machine may have been faster."""
        numbers = self.good_with.get(index)
        if not numbers:
            return good
        cells = {f"{self.point_of[0]}-r{n}" for n in numbers}
        same_time = [r for r in good.repeats if r.cell_id in cells]
        return replace(good, repeats=same_time) if same_time else good

    def decide(self, index: int, direction: float | None) -> Measurement:
        """Measure version `index` beside fresh repeats of the good end (interleaved) until the decision is not
        UNKNOWN or the budget is spent."""
        plan = self.plan
        count = plan.repeats
        while True:
            start = self.need.get(0, 0)  # the good end's next repeat numbers (the same on a re-run: resumable)
            add = count - len(self.good_with.get(index, []))
            self.good_with.setdefault(index, []).extend(range(start, start + add))
            self.measure({0: start + add, index: count})
            m = self.judge(index, direction, self.points())
            if m.verdict != "unknown" or count >= plan.max_repeats:
                self.say(m)
                return m
            more = (m.decision.more_repeats if m.decision else None) or 2
            count = min(plan.max_repeats, count + max(1, more))
            self.say(m, f"undecided; {count} repeats per side next")

    def say(self, m: Measurement, note: str = "") -> None:
        if self.log is not None:
            change = f" {m.decision.change:+.1%}" if m.decision and m.decision.change is not None else ""
            self.log(
                f"bisect: {m.role} {m.label}: {m.verdict}{change} ({m.repeats} repeat(s)){'; ' + note if note else ''}"
            )

    def run(self) -> Result:
        """Both ends, then binary search; the result names the first bad version or says why not."""
        self.check()
        last = len(self.plan.values) - 1
        ends = self.decide(last, None)
        if ends.verdict != "bad":
            return self.finish(None, None, ends)
        direction = math.copysign(1.0, ends.decision.change or 0.0) if ends.decision else 1.0
        lo, hi = 0, last
        while hi - lo > 1:
            mid = (lo + hi) // 2
            m = self.decide(mid, direction)
            if m.verdict == "bad":
                hi = mid
            elif m.verdict == "good":
                lo = mid
            else:
                return self.finish(lo, hi, m, direction)
        return self.finish(lo, hi, None, direction)

    def finish(self, lo: int | None, hi: int | None, stopped: Measurement | None,
               direction: float | None = None) -> Result:  # fmt: skip
        """Every measurement judged again with all data; the culprit, its diagnosis and the exit code."""
        res, points = self.result, self.points()
        res.measurements = [self.judge(i, direction, points) for i in sorted(self.need)]
        by_index = {m.index: m for m in res.measurements}
        plan = self.plan
        if lo is None or hi is None:
            res.verdict, res.message = ends_message(stopped, plan)
            return res
        if stopped is not None:
            res.verdict = INCONCLUSIVE
            res.message = (f"inconclusive: {stopped.label} is {stopped.verdict} after {stopped.repeats} repeat(s) "
                           f"(budget {plan.max_repeats}); the first bad version is one of "
                           f"{plan.labels[lo + 1]} … {plan.labels[hi]}")  # fmt: skip
            return res
        res.culprit, res.last_good = by_index[hi], by_index[lo]
        res.diagnosis = self.diagnose(lo, hi, points)
        res.verdict = PASS
        res.message = culprit_message(res, plan)
        return res

    def diagnose(self, lo: int, hi: int, points: dict[str, compare.Point]) -> list[str]:
        """compare's diagnosis lines of the culprit against the version before it (and the fingerprint diff)."""
        before, after = points[self.point_of[lo]], points[self.point_of[hi]]
        pair = compare.compare_pair(before, after, compare.METRICS, self.plan.min_effect)
        lines = list(pair.diagnosis)
        lines += [f"fingerprint differs: {line}" for line in pair.fingerprint_diff]
        return lines


def ends_message(bad: Measurement | None, plan: Plan) -> tuple[str, str]:
    """Why the bisect refuses to search: the ends do not differ (fail: exit 1), or that is not known
    (inconclusive: exit 3)."""
    first, last = plan.labels[0], plan.labels[-1]
    if bad is None or bad.verdict == "no-result":
        return (
            FAIL,
            f"refused: no completed run of {first} or {last} to compare (see the runs above)",
        )
    change = f" ({bad.decision.change:+.2%})" if bad.decision and bad.decision.change is not None else ""
    if bad.verdict == "good":
        return FAIL, (f"refused: the ends do not differ in {plan.metric}{change}: {first} and {last} are "
                                "the SAME (or below the practical threshold); nothing to bisect")  # fmt: skip
    return INCONCLUSIVE, (f"refused: cannot tell whether {first} and {last} differ in {plan.metric}{change} "
                               f"after {bad.repeats} repeat(s) (budget {plan.max_repeats}: --max-repeats)")  # fmt: skip


def culprit_message(res: Result, plan: Plan) -> str:
    culprit, good = res.culprit, res.last_good
    assert culprit is not None and good is not None and culprit.decision is not None
    d = culprit.decision
    ci = compare.fmt_ci(d)
    p = "–" if d.p_value is None else p_text(d.p_value)
    before = good.decision
    was = f"{before.decision.upper()} {compare.fmt_change(before)}" if before is not None else "the good end"
    return (
        f"first bad version: {culprit.label}: {plan.metric} {compare.fmt_change(d)} {ci} vs the good end "
        f"(p = {p}, {culprit.repeats} vs {culprit.good_repeats} repeats run beside it); the version before it, "
        f"{good.label}, is {was}"
    )


# ---- rendering ---------------------------------------------------------------------------------------------
def fmt_mean(m: Measurement) -> str:
    if m.mean is None:
        return "–"
    return f"{m.mean:.4g} ± {m.ci:.2g}" if m.ci is not None else f"{m.mean:.4g} (1 repeat)"


def fmt_verdict(m: Measurement) -> str:
    d = m.decision
    if m.index == 0:
        return "good (reference)"
    if d is None:
        return m.verdict
    return f"{m.verdict}: {d.decision.upper()} {compare.fmt_change(d)} {compare.fmt_ci(d)}"


def to_json(res: Result, inconclusive_ok: bool = False) -> dict[str, Any]:
    """The bisect as JSON: every measurement, the first bad version, the verdict, the closing line (as printed,
    `inconclusive_ok`: the command was given --inconclusive-ok) and the exit code."""

    def one(m: Measurement | None) -> dict[str, Any] | None:
        if m is None:
            return None
        return {"index": m.index, "value": m.value, "label": m.label, "role": m.role, "repeats": m.repeats,
                "mean": m.mean, "ci95_half_width": m.ci, "verdict": m.verdict, "good_repeats": m.good_repeats,
                "decision": m.decision.to_dict() if m.decision else None}  # fmt: skip

    plan = res.plan
    return {"campaign": res.campaign, "key": plan.key, "metric": plan.metric, "min_effect": plan.min_effect,
            "versions": [{"value": v, "label": lab} for v, lab in zip(plan.values, plan.labels, strict=True)],
            "measurements": [one(m) for m in res.measurements], "first_bad": one(res.culprit),
            "last_good": one(res.last_good), "diagnosis": res.diagnosis, "message": res.message,
            "verdict": res.verdict, "closing": res.outcome().closing(inconclusive_ok),
            "exit_code": res.exit_code(inconclusive_ok)}  # fmt: skip


def to_markdown(res: Result) -> str:
    from reports.markdown import md_text

    metric = metric_of(res.plan.metric)
    lines = [f"### mbx bisect {md_text(res.plan.key)} ({len(res.plan.values)} versions, {md_text(metric.label)})",
             "", f"| # | version | role | repeats | {md_text(metric.label)} mean ± 95% CI | vs good |",
             "|---:|---|---|---:|---:|---|"]  # fmt: skip
    for m in res.measurements:
        lines.append(f"| {m.index} | {md_text(m.label)} | {m.role} | {m.repeats} | {fmt_mean(m)} | "
                     f"{md_text(fmt_verdict(m))} |")  # fmt: skip
    lines += ["", f"**{md_text(res.message)}**"]
    lines += [f"- diagnosis: {md_text(line)}" for line in res.diagnosis]
    return "\n".join(lines) + "\n"
