"""Issue 31, judge once and say it once: one outcome (orchestrator/judge/outcome.py) for the closing line, the exit
code, status, the report page's badge, summary.md and the W&B summary; views only read; ingest exits like a run.

The CLI fixture is a real parity campaign on the CPU whose faster point (a wider model) fails its parity check:
the run must end FAIL (exit 1) without "every gate passed", the page (read in real headless Chromium) and
summary.md must say FAIL and offer no "Freeze it" for that point, and the W&B run of the outcome must say fail."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TINY_MOE_RECIPE


# ---- the one rule -------------------------------------------------------------------------------------------
def test_combine_and_exit_codes_are_one_table() -> None:
    from orchestrator.errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_PASS
    from orchestrator.judge.outcome import FAIL, INCONCLUSIVE, PASS, combine, exit_code

    assert (EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INCONCLUSIVE) == (0, 1, 2, 3)
    assert combine([PASS, PASS]) == PASS and combine([PASS, FAIL, INCONCLUSIVE]) == FAIL
    assert combine([PASS, "none"]) == INCONCLUSIVE and combine([]) == INCONCLUSIVE  # nothing judged is no pass
    assert [exit_code(v) for v in (PASS, FAIL, INCONCLUSIVE, "none")] == [0, 1, 3, 3]
    assert exit_code(INCONCLUSIVE, inconclusive_ok=True) == 0 and exit_code(FAIL, inconclusive_ok=True) == 1


def test_a_parity_fail_is_never_beside_every_gate_passed() -> None:
    from orchestrator.judge.outcome import FAIL, INCONCLUSIVE, PASS, campaign_outcome

    pairs = [{"verdict": "fail"}, {"verdict": "fail"}]
    failed = campaign_outcome([PASS] * 4, {"parity": pairs}, completed=4, total=4)
    assert failed.verdict == FAIL and failed.exit_code() == 1
    assert failed.line == ("FAIL 4/4 completed, 4 point(s), parity FAIL: 2 of 2 pair(s) failed; gates PASS: 4 of 4 "
                           "point(s) passed")  # fmt: skip
    assert "every gate passed" not in failed.line
    passed = campaign_outcome([PASS] * 4, {"parity": [{"verdict": "pass"}] * 2}, completed=4, total=4)
    assert passed.line == "PASS 4/4 completed, 4 point(s), every gate passed; parity PASS: 2 of 2 pair(s) passed"
    undecided = campaign_outcome([PASS, INCONCLUSIVE], {}, completed=2, total=2)
    assert undecided.line.startswith("INCONCLUSIVE ") and undecided.line.endswith("(exit 3; --inconclusive-ok accepts it)")


def test_every_point_infeasible_fails_and_some_infeasible_change_nothing() -> None:
    from orchestrator.judge.outcome import FAIL, INCONCLUSIVE, PASS, campaign_outcome

    none_ran = campaign_outcome([], {}, completed=0, total=0, infeasible=2)
    assert none_ran.verdict == FAIL and none_ran.exit_code() == 1
    assert none_ran.line == "FAIL 0/0 completed, 0 point(s), gates FAIL: every point (2) is infeasible, none ran"
    assert campaign_outcome([PASS, PASS], {}, completed=2, total=2, infeasible=1).verdict == PASS
    assert campaign_outcome([], {}).verdict == INCONCLUSIVE  # nothing judged yet, nothing infeasible


def test_a_search_that_spent_its_budget_with_nothing_failed_is_inconclusive() -> None:
    from orchestrator.judge.outcome import FAIL, INCONCLUSIVE, PASS, search_part

    spent = search_part(False, False, "no trial ran to the full length (8 steps)", "budget of 40 steps reached", 0)
    assert spent.verdict == INCONCLUSIVE and "budget of 40 steps reached" in spent.text
    assert search_part(False, False, "none qualified", "budget of 40 steps reached", 2).verdict == FAIL
    assert search_part(False, False, "no point met the constraints", None, 0).verdict == FAIL
    assert search_part(False, True, "a tie", None, 0).verdict == INCONCLUSIVE
    assert search_part(True, False, "", None, 3).verdict == PASS


def test_parity_failures_name_the_changed_side_only() -> None:
    from orchestrator.judge import verdict_kinds

    parity_blame = verdict_kinds.get("parity").blame  # the parity kind's rule, through the seam
    pairs = [{"verdict": "fail", "on_cell": "wide-r0", "off_cell": "narrow-r0", "title": "t", "label": "base",
              "reason": "loss: |Δ| 0.2"}, {"verdict": "pass", "on_cell": "other-r0", "off_cell": "narrow-r0"}]  # fmt: skip
    assert list(parity_blame(pairs)) == ["wide-r0"]


# ---- through the CLI: a parity campaign whose faster point fails its parity check ---------------------------
def _parity_campaign(write_campaign, wandb_dir: Path) -> Path:
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"].update(steps=10, micro_batch_size=4)
    return write_campaign({
        "name": "widefail", "trainer": {"recipe": recipe}, "collect": {"window": 6},
        "parity": {"pairs": [{"off": {"model.hidden_size": 32}, "on": {"model.hidden_size": 128}}],
                   "metrics": {"loss": {"max_rel": 0.001, "trend": False}}},
        "gates": {"loss_finite": True}, "env": {"values": {"OMP_NUM_THREADS": "1"}},
        "launchers": {"local": {"parallel": 1}}, "wandb": {"mode": "offline", "dir": str(wandb_dir)},
    }, name="widefail.yaml")  # fmt: skip


def _outcome_run(wandb_dir: Path) -> dict[str, Any]:
    """The summary of the W&B run of the campaign's outcome (job_type `outcome`), read from its offline file."""
    from reports.wandb_log import read_run_file

    for path in wandb_dir.rglob("run-*.wandb"):
        records = read_run_file(path)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        if run.job_type != "outcome":
            continue
        summary: dict[str, Any] = {}
        for r in records:
            if r.WhichOneof("record_type") == "summary":
                summary.update({i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in r.summary.update})
        return summary
    raise AssertionError(f"no outcome run under {wandb_dir}")


@pytest.fixture(scope="module")
def widefail(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The campaign run once: its output, workspace and report."""
    from conftest import run_mbx

    tmp = tmp_path_factory.mktemp("widefail")
    env = {"MBX_CACHE_DIR": str(tmp / "cache"), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}

    def write(data: dict, name: str) -> Path:
        import yaml

        (tmp / name).write_text(yaml.safe_dump(data, sort_keys=False))
        return tmp / name

    file = _parity_campaign(write, tmp / "wandb")
    ws = tmp / "ws"
    run = run_mbx("campaign", "run", str(file), "-w", str(ws), env=env)
    return {"run": run, "ws": ws, "wandb": tmp / "wandb", "report": ws / "widefail" / "report", "env": env}


def _cells(ws: Path) -> dict[str, str]:
    """hidden size → cell id."""
    con = sqlite3.connect(ws / "mbx.sqlite")
    rows = con.execute("SELECT cell_id, params_json FROM cells WHERE campaign='widefail'").fetchall()
    con.close()
    return {json.loads(p)["model.hidden_size"]: c for c, p in rows}


def test_the_closing_line_exit_status_json_and_wandb_say_fail(widefail: dict[str, Any], mbx) -> None:
    run = widefail["run"]
    assert run.returncode == 1, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith(("PASS", "FAIL", "INCONCLUSIVE"))]
    assert lines == ["FAIL 2/2 completed, 2 point(s), parity FAIL: 1 of 1 pair(s) failed; gates PASS: 2 of 2 "
                     "point(s) passed"], run.stdout  # fmt: skip
    assert "every gate passed" not in run.stdout
    status = mbx("campaign", "status", "widefail", "-w", str(widefail["ws"]), "--json")
    payload = json.loads(status.stdout)
    assert (status.returncode, payload["verdict"], payload["exit_code"]) == (0, "fail", 1)
    assert payload["closing"] == lines[0] and payload["parts"]["parity"]["verdict"] == "fail"
    table = mbx("campaign", "status", "widefail", "-w", str(widefail["ws"]))
    assert lines[0] in table.stdout.replace("\n", "") or lines[0][:60] in table.stdout
    wandb = _outcome_run(widefail["wandb"])
    assert (wandb["outcome/verdict"], wandb["outcome/exit_code"], wandb["outcome/parity"]) == ("fail", 1, "fail")
    assert wandb["outcome/closing"] == lines[0]


def test_the_page_and_summary_lead_with_fail_and_offer_no_freeze_of_the_failed_point(widefail: dict[str, Any]) -> None:
    wide = _cells(widefail["ws"])[128].rsplit("-r", 1)[0]  # the point id of the faster side that failed parity
    summary = (widefail["report"] / "summary.md").read_text()
    head = summary.split("### Numerics parity")[0]
    assert "❌ **FAIL** 2/2 completed, 2 point(s), parity FAIL: 1 of 1 pair(s) failed" in head
    assert "**parity FAIL: 1 of 1 pair(s) failed**" in summary
    assert summary.index("### Numerics parity") < summary.index("### Frozen configuration")  # parity leads
    assert f"--point {wide}" not in summary and "every gate passed" not in summary
    page = (widefail["report"] / "index.html").read_text()
    assert f'data-point="{wide}"' not in page.split('id="best"')[1].split("</section>")[0]


# reports/templates/site.css: --pass #1a7f37, --fail #cf222e, --inc #9a6700, as Chromium computes them
VERDICT_RGB = {"pass": "rgb(26, 127, 55)", "fail": "rgb(207, 34, 46)", "inconclusive": "rgb(154, 103, 0)"}


@pytest.mark.skipif(
    not __import__("chromium_cdp").CHROMIUM, reason="chromium not installed (apt-get install -y chromium)"
)
def test_the_page_badge_says_fail_in_chromium(widefail: dict[str, Any], tmp_path: Path) -> None:
    from chromium_cdp import Browser

    read = """(() => { const o = document.getElementById("outcome"), b = o.querySelector(".badge");
      const p = document.getElementById("parity-verdict");
      return {verdict: o.dataset.verdict, word: b.textContent, color: getComputedStyle(b).color,
              text: o.textContent, parity: p.dataset.verdict, top: o.getBoundingClientRect().top,
              parityTop: p.getBoundingClientRect().top, gates: document.getElementById("gate-counts").textContent,
              greenBadges: Array.from(document.querySelectorAll("header .badge.verdict-pass")).length,
              badges: Array.from(document.querySelectorAll(".badge[class*='verdict-']"), e => ({
                verdict: Array.from(e.classList).find(c => c.startsWith("verdict-")).slice(8),
                color: getComputedStyle(e).color, border: getComputedStyle(e).borderTopColor}))}; })()"""
    with Browser(tmp_path / "profile") as browser:
        session = browser.open(widefail["report"] / "index.html")
        got = browser.evaluate(session, read)
        assert browser.problems(session) == []
    assert (got["verdict"], got["word"], got["parity"]) == ("fail", "FAIL", "fail")
    assert got["color"] == VERDICT_RGB["fail"]  # #cf222e (a prefix test passed green, rgb(26, 127, 55), too)
    assert {b["verdict"] for b in got["badges"]} >= {"fail", "pass"}, got["badges"]  # the outcome's, the gates'
    for badge in got["badges"]:  # every verdict badge on the page in its own verdict's colour, text and border
        if badge["verdict"] != "none":  # not judged: muted
            assert badge["color"] == badge["border"] == VERDICT_RGB[badge["verdict"]], badge
    assert "parity FAIL: 1 of 1 pair(s) failed" in got["text"] and "every gate passed" not in got["text"]
    assert got["top"] < got["parityTop"] and got["greenBadges"] == 0 and got["gates"] == "pass 2"


def test_views_only_read(widefail: dict[str, Any], mbx) -> None:
    """status, report and a --json closing judge in memory: a stale stored verdict and a parity table emptied by
    hand stay as they are (before issue 31, `runner.view()` re-judged and wrote both, without the lock)."""
    ws = widefail["ws"]
    con = sqlite3.connect(ws / "mbx.sqlite")
    con.execute("DELETE FROM parity WHERE campaign='widefail'")
    (cell, attempt, gate) = con.execute("SELECT cell_id, attempt, gate_json FROM results WHERE campaign='widefail' "
                                        "LIMIT 1").fetchone()  # fmt: skip
    stale = {**json.loads(gate), "verdict": "fail"}
    con.execute("UPDATE results SET gate_json=? WHERE campaign='widefail' AND cell_id=? AND attempt=?",
                (json.dumps(stale), cell, attempt))  # fmt: skip
    con.commit()
    con.close()
    status = json.loads(mbx("campaign", "status", "widefail", "-w", str(ws), "--json").stdout)
    assert {c["cell_id"]: c["verdict"] for c in status["cells"]}[cell] == "pass"  # judged in memory
    assert status["parts"]["parity"]["verdict"] == "fail"
    assert mbx("report", "widefail", "-w", str(ws), "--out", str(ws.parent / "r2")).returncode == 0
    con = sqlite3.connect(ws / "mbx.sqlite")
    assert con.execute("SELECT COUNT(*) FROM parity WHERE campaign='widefail'").fetchone()[0] == 0
    kept = con.execute("SELECT gate_json FROM results WHERE campaign='widefail' AND cell_id=? AND attempt=?",
                       (cell, attempt)).fetchone()[0]  # fmt: skip
    con.close()
    assert json.loads(kept)["verdict"] == "fail"  # not rewritten by a view
    regate = mbx("campaign", "regate", "widefail", "-w", str(ws))  # the owner stores them, under the lock
    assert regate.returncode == 1 and "FAIL 2 point(s), parity FAIL" in regate.stdout
    con = sqlite3.connect(ws / "mbx.sqlite")
    assert con.execute("SELECT COUNT(*) FROM parity WHERE campaign='widefail'").fetchone()[0] == 1
    con.close()


# ---- ingest exits like a run ---------------------------------------------------------------------------------
def test_ingest_of_impossible_figures_exits_1(mbx, tmp_path: Path) -> None:
    from test_trust_ingest import edited

    bad = edited(tmp_path, r"throughput per GPU \(TFLOP/s/GPU\)", "-204.6", 7)
    result = mbx("ingest", "past", str(bad), "-w", str(tmp_path / "ws"), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    got = json.loads(result.stdout)
    assert (got["state"], got["verdict"], got["exit_code"]) == ("failed", "fail", 1)
    good = mbx("ingest", "past", str(ROOT / "tests" / "data" / "megatron" / "logs" /
                                     "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"),
               "-w", str(tmp_path / "ws"))  # fmt: skip
    assert good.returncode == 0, good.stdout + good.stderr


# ---- every command that can exit 3 takes --inconclusive-ok ----------------------------------------------------
def test_every_command_that_can_exit_3_takes_inconclusive_ok() -> None:
    """A command whose help names exit 3 (inconclusive) has --inconclusive-ok, and says what it does."""
    import re

    from test_cli_grammar import ALL, options

    exit_3 = re.compile(r"\b3 inconclusive\b|\bexit 3\b|\b3 an UNKNOWN\b|\b3 when\b|\b3 undecided\b")
    can_exit_3 = {words for words, command in ALL.items() if exit_3.search(" ".join((command.help or "").split()))}
    assert {"campaign run", "campaign resume", "campaign regate", "compare", "bisect", "freeze", "card check",
            "ingest"} <= can_exit_3  # fmt: skip
    for words in sorted(can_exit_3):
        flags = {name for option in options(ALL[words]) for name in option.opts}
        assert "--inconclusive-ok" in flags, words
        assert "--inconclusive-ok" in " ".join((ALL[words].help or "").split()), words


# ---- --inconclusive-ok: --json says the printed line; files carry no exit hint; regate rewrites them ----------
def _undecided_campaign(write_campaign, wandb_dir: Path, tflops_min: float = 349) -> Path:
    """The fake Megatron trainer, 2 noisy repeats whose mean TFLOP/s sits on the gate (349): undecided."""
    import sys

    from conftest import FAKE_MEGATRON, MEGATRON_LOG

    command = [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0",
               "--fake-noise", "{env.NOISE}"]  # fmt: skip
    return write_campaign({
        "name": "undecided", "trainer": {"kind": "command", "command": command, "steps": 15},
        "env": {"values": {"NOISE": "0.03"}}, "sweep": {"repeats": 2}, "gates": {"tflops_per_gpu_min": tflops_min},
        "launchers": {"local": {"parallel": 2}}, "wandb": {"mode": "offline", "dir": str(wandb_dir)},
    }, name=f"undecided-{tflops_min:g}.yaml")  # fmt: skip


def _outcome_runs(wandb_dir: Path) -> list[dict[str, Any]]:
    """The summaries of every W&B outcome run (job_type `outcome`), oldest first (by their offline dir's name)."""
    from reports.wandb_log import read_run_file

    found = []
    for path in sorted(wandb_dir.rglob("run-*.wandb"), key=lambda p: p.parent.name):
        records = read_run_file(path)
        if next(r.run for r in records if r.WhichOneof("record_type") == "run").job_type == "outcome":
            found.append({i.key or ".".join(i.nested_key): json.loads(i.value_json)
                          for r in records if r.WhichOneof("record_type") == "summary" for i in r.summary.update})  # fmt: skip
    return found


def _said(stderr: str) -> str:
    """The closing line a --json command printed (on stderr)."""
    return next(line for line in stderr.splitlines() if line.startswith(("PASS ", "FAIL ", "INCONCLUSIVE ")))


def test_inconclusive_ok_json_says_the_printed_line_files_no_exit_hint_and_regate_rewrites_them(
    tmp_path: Path, mbx, write_campaign
) -> None:
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    ws, wandb_dir = tmp_path / "ws", tmp_path / "wandb"
    run = mbx("campaign", "run", str(_undecided_campaign(write_campaign, wandb_dir)), "-w", str(ws),
              "--inconclusive-ok", "--json", env=env)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    got = json.loads(run.stdout)
    printed = _said(run.stderr)
    assert printed.endswith("(exit 0: --inconclusive-ok accepted it)") and printed.startswith("INCONCLUSIVE 2/2")
    assert (got["closing"], got["verdict"], got["exit_code"]) == (printed, "inconclusive", 0)
    statement = printed.removesuffix(" (exit 0: --inconclusive-ok accepted it)")
    summary = (ws / "undecided" / "report" / "summary.md").read_text()
    assert f"**INCONCLUSIVE** {statement.removeprefix('INCONCLUSIVE ')}\n" in summary and "exit 3" not in summary
    (logged,) = _outcome_runs(wandb_dir)
    assert (logged["outcome/closing"], logged["outcome/exit_code"]) == (statement, 0)  # the run's own exit code
    resume = mbx("campaign", "resume", "undecided", "-w", str(ws), "--no-wandb", "--no-report", "--inconclusive-ok",
                 "--json", env=env)  # fmt: skip
    printed = _said(resume.stderr)
    assert "(2 skipped: already completed)" in printed and json.loads(resume.stdout)["closing"] == printed
    # regate with a looser gate: the closing, --json, summary.md, the page's badge and W&B all say PASS
    loose = _undecided_campaign(write_campaign, wandb_dir, tflops_min=100)
    regate = mbx("campaign", "regate", "undecided", "-w", str(ws), "-f", str(loose), "--json", env=env)
    assert regate.returncode == 0, regate.stdout + regate.stderr
    printed = _said(regate.stderr)
    assert printed.startswith("PASS ") and json.loads(regate.stdout)["closing"] == printed
    assert "**PASS**" in (ws / "undecided" / "report" / "summary.md").read_text()
    assert 'outcome-badge verdict-pass">PASS' in (ws / "undecided" / "report" / "index.html").read_text()
    logged = _outcome_runs(wandb_dir)
    assert len(logged) == 2 and (logged[-1]["outcome/verdict"], logged[-1]["outcome/exit_code"]) == ("pass", 0)
    before = (ws / "undecided" / "report" / "summary.md").stat().st_mtime_ns
    kept = mbx("campaign", "regate", "undecided", "-w", str(ws), "--no-report", "--no-wandb", env=env)
    assert kept.returncode == 0 and "report:" not in kept.stdout and len(_outcome_runs(wandb_dir)) == 2
    assert (ws / "undecided" / "report" / "summary.md").stat().st_mtime_ns == before
