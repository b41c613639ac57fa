"""Issue 31 (3-6, 9): a best has passed everything, one tie rule with reasons that never contradict their verdict,
one run a side widened by the run-to-run floor, extra repeats kept when a file runs again, suspects ranked by a rule.

Campaigns of a fake Megatron (tests/fixtures_cmd/fake_megatron.py replaying a real log: exact step times, a
planted slowdown, loss drift or seeded noise) run through the real `mbx campaign run`, `freeze`, `status`, `card
export` and `compare`; the one-run statistics are checked on the real H200 samples (tests/data/h200-samples).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT
from test_compare_cli import BASE, CAPACITY, FUSED, SAMPLES, add_campaign, compare

from orchestrator.judge.compare_config import ranked
from orchestrator.judge.freeze import freeze
from orchestrator.judge.run_floor import FloorBook, Spread
from reports import compare as stats
from reports.window import window_rows
from trainer import rundir


def fake(name: str, **extra: Any) -> dict[str, Any]:
    """A campaign of the fake Megatron: 15 replayed iterations, slowed by env SLOW, loss drifting from env DRIFT."""
    command = [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0",
               "--fake-slowdown", "{env.SLOW}", "--fake-loss-drift-from", "{env.DRIFT}", "--fake-noise", "{env.NOISE}"]  # fmt: skip
    return {"name": name, "trainer": {"kind": "command", "command": command, "steps": 15},
            "env": {"values": {"SLOW": "1.0", "DRIFT": "0", "NOISE": "0"}}, "wandb": {"mode": "disabled"},
            "launchers": {"local": {"parallel": 2}}, **extra}  # fmt: skip


def point_ids(mbx: Any, name: str, ws: Path) -> dict[str, str]:
    """SLOW value → point id, from `mbx campaign status --json`."""
    cells = json.loads(mbx("campaign", "status", name, "-w", str(ws), "--json").stdout)["cells"]
    return {c["params"]["env.SLOW"]: c["point_id"] for c in cells}


# ---- 3. a best has passed everything ------------------------------------------------------------------------
def test_a_fast_point_that_failed_parity_never_wins(tmp_path: Path, mbx, write_campaign) -> None:
    """The on side is 11% faster and its loss drifts from step 12: parity FAIL. It is not frozen (nor named best
    by status or the report); `-p` of it exits 1 naming the check unless --allow-failed says why."""
    pairs = [{"off": {"env.SLOW": "1.0", "env.DRIFT": "0"}, "on": {"env.SLOW": "0.89", "env.DRIFT": "12"}}]
    path = write_campaign(fake("parityfast", parity={"pairs": pairs, "metrics": {"loss": {"max_rel": 0.01}}}))
    ws = tmp_path / "ws"
    run = mbx("campaign", "run", str(path), "-w", str(ws), "--no-report")
    assert run.returncode == 1 and "first at step 12" in run.stdout, run.stdout + run.stderr
    ids = point_ids(mbx, "parityfast", ws)
    ref, fast = ids["1.0"], ids["0.89"]

    frozen = mbx("freeze", "parityfast", "-w", str(ws), "-o", str(tmp_path / "f1"))
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr
    assert f"point {ref} [" in frozen.stdout.splitlines()[0]  # was the parity-failed fast point, no caveat
    closing = f"PASS froze parityfast point {ref} [SLOW=1.0, DRIFT=0] into {tmp_path / 'f1'}, 1 point(s) rejected"
    assert frozen.stdout.rstrip().splitlines()[-1] == closing, frozen.stdout  # every judging command: one word
    assert f"rejected {fast} [SLOW=0.89, DRIFT=12] (parity): parity FAIL" in frozen.stdout
    status = mbx("campaign", "status", "parityfast", "-w", str(ws))
    assert f"best: {ref} [" in status.stdout, status.stdout
    report = mbx("report", "parityfast", "-w", str(ws), "--markdown")
    assert f"--point {fast}" not in report.stdout and f"--point {ref}" in report.stdout, report.stdout

    refused = mbx("freeze", "parityfast", "-w", str(ws), "-p", fast, "-o", str(tmp_path / "f2"))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stdout.startswith(f"FAIL parityfast: --point '{fast}' cannot be frozen: it failed a check "
                                     "(parity): parity FAIL"), refused.stdout  # the one closing line  # fmt: skip
    assert '--allow-failed "REASON"' in refused.stdout and not (tmp_path / "f2").exists()
    lonely = mbx("freeze", "parityfast", "-w", str(ws), "--allow-failed", "perf only")
    assert lonely.returncode == 2 and "give it with --point" in lonely.stderr

    allowed = mbx("freeze", "parityfast", "-w", str(ws), "-p", fast, "--allow-failed", "perf only: drift is known",
                  "-o", str(tmp_path / "f3"))  # fmt: skip
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert (
        allowed.stdout.startswith("frozen despite a failed check")
        and "perf only: drift is known" in allowed.stdout
    )
    text = (tmp_path / "f3" / "FROZEN.md").read_text()
    assert "**Frozen despite a failed check**: parity FAIL" in text and "perf only: drift is known" in text
    record = json.loads((tmp_path / "f3" / "frozen.json").read_text())
    assert record["allowed_failed"].startswith("parity FAIL") and record["point"] == fast
    assert f"the best by the verdicts is {ref}" in record["how"]
    as_json = mbx("freeze", "parityfast", "-w", str(ws), "-p", fast, "--allow-failed", "perf only", "--json",
                  "-o", str(tmp_path / "f4"))  # fmt: skip
    payload = json.loads(as_json.stdout)  # no PASS for a point that failed a check; exit_code is the process's
    assert (as_json.returncode, payload["exit_code"], payload["verdict"]) == (0, 0, None), as_json.stdout


def test_freeze_p_of_a_loser_writes_true_reasons(tmp_path: Path, mbx, write_campaign) -> None:
    """`-p` of the slower point: the faster one is "faster than the chosen point … (DIFFERENT …); not chosen", never
    "tied … lost the tie-break"; the how says where the chosen point stands; FROZEN.md and frozen.json (whose
    rejected list a card exports, orchestrator/judge/card.py) say the same."""
    path = write_campaign(fake("twospeeds", sweep={"axes": {"env.SLOW": ["1.0", "1.12"]}, "repeats": 2}))
    ws = tmp_path / "ws"
    assert mbx("campaign", "run", str(path), "-w", str(ws), "--no-report").returncode == 0
    ids = point_ids(mbx, "twospeeds", ws)
    fast, slow = ids["1.0"], ids["1.12"]
    best = mbx("freeze", "twospeeds", "-w", str(ws), "-o", str(tmp_path / "best"))
    assert best.returncode == 0 and f"point {fast} [" in best.stdout.splitlines()[0]

    chosen = mbx("freeze", "twospeeds", "-w", str(ws), "-p", slow, "-o", str(tmp_path / "slow"), "--json")
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    data = json.loads(chosen.stdout)
    assert (
        f"the best by the verdicts is {fast}" in data["how"] and "the chosen point against it" in data["how"]
    )
    assert "-10.7" in data["how"] and "DIFFERENT" in data["how"]
    (other,) = data["rejected"]
    assert other["kind"] == "not chosen" and "tie" not in other["why"], (
        other
    )  # was "tied … lost the tie-break"
    assert other["why"].startswith("faster than the chosen point in TFLOP/s/GPU: +12.0")
    assert "(DIFFERENT" in other["why"] and f"not chosen (--point chose {slow})" in other["why"]
    assert "faster than the chosen point" in (tmp_path / "slow" / "FROZEN.md").read_text()
    record = json.loads((tmp_path / "slow" / "frozen.json").read_text())  # a card's `rejected:` is this list
    assert [(r["kind"], r["why"][:28]) for r in record["rejected"]] == [
        ("not chosen", "faster than the chosen point")
    ]


# ---- 4. one tie rule, reasons that agree with their verdicts ------------------------------------------------
@pytest.fixture(scope="module")
def h200(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of the real H200 run dirs: three points with 4 repeats each (the workspace's A/A repeats), one
    campaign of one run per point, and single runs of the base point."""
    if not SAMPLES.is_dir():
        pytest.skip("h200 samples not present")
    ws = tmp_path_factory.mktemp("h200")
    add_campaign(ws, "repeats", [(p, r) for p in (BASE, CAPACITY, FUSED) for r in range(4)])
    add_campaign(ws, "singles", [(BASE, 0), (CAPACITY, 0), (FUSED, 0)])
    add_campaign(ws, "one", [(BASE, 0)])
    add_campaign(ws, "one-r2", [(BASE, 2)])
    return ws


def test_one_tie_rule_and_reasons_that_agree_with_the_verdicts(h200: Path, mbx) -> None:
    """One run per point: static capacity is 3.2% slower than base by its steps alone (the old rule called it a
    loss "by its whole interval" and wrote "(slower)" beside "(UNKNOWN …)"); with the run-to-run floor it is UNKNOWN:
    a tie, and equal memory cannot break it (exit 3). The fused point, 19% slower, is DIFFERENT: a loss."""
    tied = mbx("freeze", "singles", "--by", "step_time", "-w", str(h200))
    assert tied.returncode == 3, (
        tied.stdout + tied.stderr
    )  # was 0: base frozen, capacity "slower" by an UNKNOWN
    assert tied.stdout.startswith("INCONCLUSIVE singles: TIE: 2 points are not DIFFERENT in step time (ms)")
    assert "some UNKNOWN" in tied.stdout and tied.stdout.strip().endswith("(exit 3; --inconclusive-ok accepts it)")
    as_json = mbx("freeze", "singles", "--by", "step_time", "-w", str(h200), "--json")  # printed nothing on a tie
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["closing"] == tied.stdout.strip(), as_json.stdout
    # the fused point, DIFFERENT (worse) than the leader, is rejected with its reason though the rest tie (was [])
    (loser,) = json.loads(as_json.stdout)["rejected"]
    assert (loser["point_id"], loser["kind"]) == (FUSED, "slower") and "(DIFFERENT" in loser["why"], loser
    frozen = freeze(h200, "singles", point=BASE, objective="step_time")
    kinds = {r.point_id: r for r in frozen.rejected}
    assert kinds[CAPACITY].kind == "not chosen" and "(UNKNOWN" in kinds[CAPACITY].why
    assert kinds[FUSED].kind == "slower" and "(DIFFERENT" in kinds[FUSED].why
    for r in frozen.rejected:  # the kind never contradicts the verdict beside it
        assert (r.kind == "slower") == ("(DIFFERENT" in r.why and "slower" in r.why), r


def test_a_tie_still_rejects_the_points_worse_than_its_leader(tmp_path: Path, mbx, write_campaign) -> None:
    """One run a point (SLOW 1.0 / 1.03 / 1.2, seeded noise): 1.0 and 1.03 tie (UNKNOWN with the run-to-run
    floor, equal memory: no winner, exit 3), while 1.2 is DIFFERENT (worse): freeze --json and the report's
    Rejected experiments list it with its verdict (both said nothing)."""
    spec = fake("tied3", sweep={"axes": {"env.SLOW": ["1.0", "1.03", "1.2"]}})
    spec["env"]["values"]["NOISE"] = "0.005"
    ws = tmp_path / "ws"
    assert mbx("campaign", "run", str(write_campaign(spec)), "-w", str(ws), "--no-report").returncode == 0
    slow = point_ids(mbx, "tied3", ws)["1.2"]
    tied = mbx("freeze", "tied3", "-w", str(ws), "--json")
    assert tied.returncode == 3, tied.stdout + tied.stderr
    told = json.loads(tied.stdout)
    assert told["closing"].startswith("INCONCLUSIVE tied3: TIE: 2 points are not DIFFERENT"), told["closing"]
    (loser,) = told["rejected"]
    assert (loser["point_id"], loser["kind"], loser["verdict"]) == (slow, "slower", "fail"), loser
    assert loser["why"].startswith("slower than the leader ") and "(DIFFERENT" in loser["why"], loser
    summary = mbx("report", "tied3", "-w", str(ws), "-m")
    assert summary.returncode == 0, summary.stdout + summary.stderr
    listed = summary.stdout.split("### Rejected experiments", 1)[1].split("###", 1)[0]
    assert f"`{slow}` [SLOW=1.2] (slower): slower than the leader" in listed, listed


# ---- 5. one run a side is honest ----------------------------------------------------------------------------
def test_one_run_a_side_aa_is_not_different_and_says_its_floor(h200: Path) -> None:
    """Base r0 against base r2, one run a side: the steps alone gave p = 0.0046 and a CI [+0.39%, +2.25%] that
    excludes no change; widened by the workspace's run-to-run floor (the 95% upper bound of its repeats' spread)
    it is UNKNOWN with a CI around 0, and the output says so."""
    proc = compare(h200, "one", "one-r2", "--metric", "step_time", "--json")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    (pair,) = json.loads(proc.stdout)["pairs"]
    step = pair["metrics"]["step_time"]
    assert step["decision"] == "unknown" and step["p_value"] > stats.ALPHA  # was 0.0046
    assert step["ci_low"] < 0 < step["ci_high"]
    assert step["run_floor"] == pytest.approx(0.01167, abs=2e-4)  # sqrt(SS / chi2.ppf(0.05, 9)) of 3 × 4 runs
    note = " ".join(pair["notes"])
    assert "1 run a side: within-run CI widened by the run-to-run floor 1.17% (95% upper bound of the run-to-run " \
           "spread of 3 point(s)' repeats in the workspace, bundled on NVIDIA H200, 9 df)" in note  # fmt: skip
    text = compare(h200, "one", "one-r2", "--metric", "step_time").stdout
    assert "1 run a side: within-run CI widened by the run-to-run floor 1.17%" in " ".join(text.split())


def test_one_run_a_side_p_values_are_calibrated_on_h200_aa_samples() -> None:
    """A/A at one run a side, 10-step windows of the recorded runs of each point: p ≤ 0.01 in at most 2% of
    comparisons and DIFFERENT in at most 1% (the steps alone: p ≤ 0.01 in 19-33%)."""
    rng = np.random.default_rng(31)
    for point in (BASE, CAPACITY, FUSED):
        runs = [np.array([r["step_time_ms"] for r in window_rows(rows, len(rows))]) for rows in
                (rundir.read_metrics(SAMPLES / f"{point}-r{i}" / "1") for i in range(4))]  # fmt: skip
        low = different = 0
        for _ in range(300):
            sides = []
            for _side in range(2):
                run = runs[rng.integers(4)]
                start = rng.integers(len(run) - 9)
                steps = run[start : start + 10]
                sides.append(stats.Samples([float(steps.mean())], [list(steps)]))
            d = stats.compare_samples(*sides)
            low += d.p_value <= stats.ALPHA
            different += d.decision == stats.DIFFERENT
        assert low <= 6 and different <= 3, (point, low, different)


def test_the_floor_needs_enough_repeats_else_the_stated_default() -> None:
    book = FloorBook({("bundled", "CPU", "step_time_ms"): Spread(1e-4, 2, 1)})
    assert book.floor("bundled", "CPU", "step_time_ms") == stats.DEFAULT_RUN_FLOOR  # 2 df < 3
    assert book.floor("command", "CPU", "step_time_ms") == stats.DEFAULT_RUN_FLOOR
    spread = Spread()
    spread.add([100.0, 101.0, 99.0, 100.5])
    assert spread.df == 3 and spread.points == 1
    assert FloorBook({("k", "G", "x"): spread}).floor("k", "G", "x").rel > float(
        np.std(np.log([100.0, 101.0, 99.0, 100.5]), ddof=1)
    )


def test_a_point_run_again_in_another_campaign_is_an_a_a_sample(tmp_path: Path, mbx, write_campaign) -> None:
    """Issue 33 on the H100: Bridge's base point ran in the sweep and again as a `compare --run` side, 9% apart,
    while one-run verdicts assumed the 1% default: runs of one point id in different campaigns never met. Two
    campaigns of the same point, 2 repeats each, are one point with 4 runs (3 df: the workspace's floor), not
    two points with 1 df each (2 df: the default)."""
    from orchestrator.judge.run_floor import workspace_floors
    from orchestrator.run.store import Store

    noisy = {"values": {"SLOW": "1.0", "DRIFT": "0", "NOISE": "0.03"}}
    ws = tmp_path / "ws"
    for name in ("aa-first", "aa-again"):
        path = write_campaign(fake(name, env=noisy, sweep={"repeats": 2}), f"{name}.yaml")
        assert mbx("campaign", "run", str(path), "-w", str(ws), "--no-report").returncode == 0
    ids = [{c["point_id"] for c in json.loads(mbx("campaign", "status", n, "-w", str(ws), "--json").stdout)["cells"]}
           for n in ("aa-first", "aa-again")]  # fmt: skip
    assert ids[0] == ids[1] and len(ids[0]) == 1
    with Store(ws, create=False) as store:
        floor = workspace_floors(store, ("step_time_ms",)).floor("command", "CPU", "step_time_ms")
    assert floor != stats.DEFAULT_RUN_FLOOR and "1 point(s)' repeats" in floor.source and "3 df" in floor.source


def _retag(ws: Path, campaign: str, **fields: str) -> None:
    """Set fingerprint fields in every run dir of `campaign` (node.json): runs on another GPU or software."""
    from orchestrator.run.store import Store

    with Store(ws, create=False) as store:
        for attempt in store.latest_attempts(campaign).values():
            node = Path(attempt.run_dir) / "node.json"
            node.write_text(json.dumps({**(json.loads(node.read_text()) if node.exists() else {}), **fields}))


def test_the_same_point_elsewhere_never_hides_a_measured_floor(tmp_path: Path, mbx, write_campaign) -> None:
    """Review of the cross-campaign pool: the point's runs on another GPU made the whole point drop out (the
    measured floor fell back to the 1% default: over-confident one-run verdicts). Runs pool only with runs of
    the same trainer kind, GPU and software; the other GPU's runs are their own sample, and runs after a code
    change are not A/A with the runs before it."""
    from orchestrator.judge.run_floor import workspace_floors
    from orchestrator.run.store import Store

    noisy = {"values": {"SLOW": "1.0", "DRIFT": "0", "NOISE": "0.05"}}
    ws = tmp_path / "ws"

    def floors() -> tuple[stats.RunFloor, stats.RunFloor]:
        with Store(ws, create=False) as store:
            book = workspace_floors(store, ("step_time_ms",))
        return book.floor("command", "CPU", "step_time_ms"), book.floor("command", "NVIDIA H200", "step_time_ms")

    for name, repeats in (("on-cpu", 4), ("on-h200", 2), ("new-code", 4)):
        path = write_campaign(fake(name, env=noisy, sweep={"repeats": repeats}), f"{name}.yaml")
        assert mbx("campaign", "run", str(path), "-w", str(ws), "--no-report").returncode == 0
        if name == "on-cpu":
            alone = floors()[0]
            assert alone != stats.DEFAULT_RUN_FLOOR and "3 df" in alone.source, alone
        if name == "on-h200":
            _retag(ws, name, gpu_name="NVIDIA H200")
            cpu, h200 = floors()
            assert cpu == alone and h200 == stats.DEFAULT_RUN_FLOOR  # 1 df on the H200: not enough alone
        if name == "new-code":
            _retag(ws, name, git_sha="f" * 40)
            cpu, _ = floors()
            assert "2 point(s)' repeats" in cpu.source and "6 df" in cpu.source, cpu  # two samples of 4, not one of 8


def test_one_log_ingested_into_several_campaigns_is_one_run(tmp_path: Path, mbx) -> None:
    """The same log ingested four times has one point id (its digest) and identical figures: one run, not an
    A/A sample of zero spread (which would pass 3 df of "measured 0.00%" off as the workspace's floor)."""
    from orchestrator.judge.run_floor import workspace_floors
    from orchestrator.run.store import Store

    log = ROOT / "tests" / "data" / "bridge-0.6.2" / "h100_sweep" / "d1a49eaa0e_moe-token-dispatcher-type-alltoall.log"
    ws = tmp_path / "ws"
    for name in ("past-1", "past-2", "past-3", "past-4"):
        assert mbx("ingest", name, str(log), "--format", "megatron-bridge", "-w", str(ws)).returncode == 0
    with Store(ws, create=False) as store:
        book = workspace_floors(store, ("step_time_ms",))
    assert not book.spreads and book.floor("ingested", "CPU", "step_time_ms") == stats.DEFAULT_RUN_FLOOR


# ---- 6. extra repeats are kept ------------------------------------------------------------------------------
def test_until_conclusive_then_rerun_keeps_the_extra_repeats(tmp_path: Path, mbx, write_campaign) -> None:
    """A/A with 3% seeded noise: --until-conclusive (budget 2) adds a repeat a side; running A's file again keeps
    it (said; was: silently 4 → 3), a file with fewer repeats sets the cells aside and names them."""
    noisy = {"values": {"SLOW": "1.0", "DRIFT": "0", "NOISE": "0.03"}}
    a = write_campaign(fake("uc-a", env=noisy, sweep={"repeats": 3}), "a.yaml")
    b = write_campaign(fake("uc-b", env=noisy, sweep={"repeats": 3}), "b.yaml")
    ws = tmp_path / "ws"
    first = mbx("compare", "--run", str(a), str(b), "-w", str(ws), "--until-conclusive", "--budget", "2",
                "--metric", "step_time", "--json")  # fmt: skip
    assert first.returncode == 3, first.stdout + first.stderr
    assert [len(json.loads(first.stdout)["pairs"][0][s]["repeats"]) for s in "ab"] == [4, 4]

    again = mbx("campaign", "run", str(a), "-w", str(ws), "--no-report")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "kept 1 extra repeat(s) beyond sweep.repeats (3) of points still in the file" in again.stdout
    assert "4 cell(s)" in again.stdout and "4 skipped: already completed" in again.stdout  # nothing ran again
    stored = json.loads(
        mbx("compare", "uc-a", "uc-b", "-w", str(ws), "--metric", "step_time", "--json").stdout
    )
    assert [len(stored["pairs"][0][s]["repeats"]) for s in "ab"] == [4, 4]  # was [3, 4]

    data = yaml.safe_load(a.read_text())
    data["sweep"]["repeats"] = 2
    fewer = write_campaign(data, "a2.yaml")
    cut = mbx("campaign", "run", str(fewer), "-w", str(ws), "--no-report")
    assert cut.returncode == 0 and "set aside 2 stored cell(s)" in cut.stdout, cut.stdout
    assert "-r2, " in cut.stdout and "-r3;" in cut.stdout and "kept" not in cut.stdout


# ---- 9. suspects ranked -------------------------------------------------------------------------------------
def test_only_a_rule_makes_a_suspect() -> None:
    diff = [{"key": k, "a": "1", "b": "2"} for k in ("env.A_FLAG", "sweep.x", "trainer.recipe.recompute",
                                                      "trainer.recipe.argv --fp8-format", "trainer.recipe.label")]  # fmt: skip
    order = [(item["key"], rule) for item, rule in ranked(diff)]
    assert order == [("trainer.recipe.argv --fp8-format", "precision"), ("trainer.recipe.recompute", "recompute"),
                     ("env.A_FLAG", None), ("sweep.x", None), ("trainer.recipe.label", None)]  # fmt: skip


def test_ingested_logs_that_differ_in_label_and_path_name_no_suspect(tmp_path: Path, mbx) -> None:
    ws = tmp_path / "ws"
    for name in ("log-a", "log-b"):
        copy = tmp_path / f"{name}.log"
        copy.write_text(MEGATRON_LOG.read_text(encoding="utf-8"), encoding="utf-8")
        assert mbx("ingest", str(copy), "--campaign", name, "--workspace", str(ws)).returncode == 0
    proc = mbx("compare", "log-a", "log-b", "-w", str(ws), "--metric", "peak_alloc")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("config differs")]
    assert any("trainer.recipe.label: log-a → log-b" in line for line in lines), proc.stdout
    assert not any("suspect" in line for line in lines), lines  # was "config differs (first suspect): …label"


def test_campaign_file_keys_of_readme_are_documented() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "--allow-failed" in readme and "run-to-run floor" in readme and "extra repeat" in readme
