"""Issue 31 review: what compare and ingest say and exit with (one closing line from orchestrator/judge/outcome.py,
`--json`'s exit_code the process's), the run-to-run floor's minimum, and the suspects' "config differs" lines.

Campaigns of the fake Megatron (tests/fixtures_cmd/fake_megatron.py replaying a real log: exact step times, a
planted slowdown) run through the real `mbx campaign run`, `compare` and `ingest`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT

from orchestrator.judge import run_floor
from orchestrator.judge.run_floor import FloorBook, Spread

# a trainer that fails repeat 1 of a point (its run dir ends in -r1/<attempt>) and replays the log otherwise
FAIL_R1 = """import os, sys
if os.path.basename(os.path.dirname(os.environ["MBX_RUN_DIR"])).endswith("-r1"):
    sys.exit("fake failure of repeat 1")
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def fake(name: str, slow: str = "1.0", repeats: int = 1, wrapper: Path | None = None) -> dict[str, Any]:
    """A campaign of the fake Megatron: 15 replayed iterations, slowed by env SLOW, no noise."""
    command = [sys.executable, *([str(wrapper)] if wrapper else []), str(FAKE_MEGATRON), "--replay",
               str(MEGATRON_LOG), "--sleep-s", "0", "--fake-slowdown", "{env.SLOW}"]  # fmt: skip
    return {"name": name, "trainer": {"kind": "command", "command": command, "steps": 15},
            "env": {"values": {"SLOW": slow}}, "wandb": {"mode": "disabled"},
            "launchers": {"local": {"parallel": 2}}, "sweep": {"repeats": repeats}}  # fmt: skip


def run(mbx: Any, write_campaign: Any, ws: Path, spec: dict[str, Any]) -> None:
    proc = mbx(
        "campaign", "run", str(write_campaign(spec, f"{spec['name']}.yaml")), "-w", str(ws), "--no-report"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- the run-to-run floor has a minimum ---------------------------------------------------------------------
def test_a_quiet_workspace_floor_is_raised_to_the_minimum_and_says_so() -> None:
    quiet = Spread()
    for _ in range(2):
        quiet.add([100.0, 100.0001, 100.0])
    got = FloorBook({("command", "CPU", "step_time_ms"): quiet}).floor("command", "CPU", "step_time_ms")
    assert quiet.df == 4 and got.rel == run_floor.MIN_RUN_FLOOR == 0.01
    assert got.text().startswith("1.00% (minimum; measured 0.00%: 95% upper bound of the run-to-run spread")


def test_one_run_a_side_in_a_quiet_workspace_is_not_a_false_different(
    tmp_path: Path, mbx, write_campaign
) -> None:
    """The workspace's A/A repeats are exact (a replayed log: spread 0, 3 df): the floor stays at its 1% minimum,
    so a 2% change at one run a side is UNKNOWN (was DIFFERENT at p=1.7e-16 with a 0.00% floor)."""
    ws = tmp_path / "ws"
    for spec in (fake("aa", repeats=4), fake("one-a"), fake("one-b", slow="1.02")):
        run(mbx, write_campaign, ws, spec)
    proc = mbx("compare", "one-a", "one-b", "-w", str(ws), "--metric", "step_time", "--json")
    payload = json.loads(proc.stdout)
    decision = payload["pairs"][0]["metrics"]["step_time"]
    assert decision["decision"] == "unknown" and decision["run_floor"] == 0.01, decision
    assert "run-to-run floor 1.00% (minimum; measured 0.00%: 95% upper bound" in decision["reason"]
    assert (proc.returncode, payload["exit_code"], payload["verdict"]) == (3, 3, "inconclusive")


# ---- compare: one closing line, --json's exit code is the process's ------------------------------------------
def test_compare_json_exit_code_is_the_process_exit_code(tmp_path: Path, mbx, write_campaign) -> None:
    """--inconclusive-ok turns an UNKNOWN into 0 and a --run cell that did not complete into 1: --json says the
    same (it said 3 and 0/3: the comparison's own code), and the terminal ends with the outcome's closing line."""
    ws = tmp_path / "ws"
    run(mbx, write_campaign, ws, fake("one-a"))
    run(mbx, write_campaign, ws, fake("one-b", slow="1.02"))
    ok = mbx(
        "compare", "one-a", "one-b", "-w", str(ws), "--metric", "step_time", "--json", "--inconclusive-ok"
    )
    assert (ok.returncode, json.loads(ok.stdout)["exit_code"]) == (0, 0), ok.stdout + ok.stderr
    table = mbx("compare", "one-a", "one-b", "-w", str(ws), "--metric", "step_time")
    closing = (
        "INCONCLUSIVE one-a → one-b (practical threshold 1.0%), compare UNKNOWN: step time (ms) undecided"
    )
    assert table.returncode == 3 and table.stdout.rstrip().splitlines()[-1].startswith(closing), table.stdout
    assert "(exit 3; --inconclusive-ok accepts it)" in table.stdout
    accepted = mbx("compare", "one-a", "one-b", "-w", str(ws), "--metric", "step_time", "--inconclusive-ok")
    last = accepted.stdout.rstrip().splitlines()[-1]
    assert accepted.returncode == 0 and "(exit 0: --inconclusive-ok accepted it)" in last, accepted.stdout

    wrapper = tmp_path / "fail_r1.py"
    wrapper.write_text(FAIL_R1)
    a = write_campaign(fake("ra", repeats=2), "ra.yaml")
    b = write_campaign(fake("rb", repeats=2, wrapper=wrapper), "rb.yaml")
    proc = mbx("compare", "--run", str(a), str(b), "-w", str(ws), "--metric", "step_time", "--json",
               "--inconclusive-ok")  # fmt: skip
    payload = json.loads(proc.stdout)
    assert (proc.returncode, payload["exit_code"], payload["verdict"]) == (1, 1, "fail"), (
        proc.stdout + proc.stderr
    )
    assert payload["parts"]["cells"]["text"].startswith("1 cell(s) did not complete: ")
    assert payload["closing"].startswith("FAIL ra → rb (practical threshold 1.0%), ")


def test_compare_of_a_matched_point_that_never_completed(tmp_path: Path, mbx, write_campaign) -> None:
    """Sides sweeping env.FAIL [none, config] (fake Megatron `--fail config`: every cell of that point fails):
    `compare --run` and `compare` of the stored sides both exit 1 with the FAIL closing, compare the point that
    completed and name the one not compared (--run exited 1 with a bare error, the stored compare 2; no JSON)."""
    files = []
    for name in ("fa", "fb"):
        spec = fake(name)
        spec["trainer"]["command"] += ["--fail", "{env.FAIL}"]
        spec["env"]["values"]["FAIL"] = "none"
        spec["sweep"]["axes"] = {"env.FAIL": ["none", "config"]}
        files.append(str(write_campaign(spec, f"{name}.yaml")))
    ws = str(tmp_path / "ws")
    ran = mbx("compare", "--run", *files, "-w", ws, "--metric", "step_time", "--json")
    stored = mbx("compare", "fa", "fb", "-w", ws, "--metric", "step_time", "--json")
    for proc in (ran, stored):
        told = json.loads(proc.stdout)
        assert (proc.returncode, told["exit_code"], told["verdict"]) == (1, 1, "fail"), proc.stderr
        assert [p["a"]["label"] for p in told["pairs"]] == ["FAIL=none"]  # the completed point is compared
        assert told["parts"]["points"]["verdict"] == "fail", told["parts"]
        (why,) = told["not_compared"]
        assert why.startswith("A fa point ") and "[FAIL=config] and B fb point " in why, why
        assert told["closing"].startswith("FAIL fa → fb (practical threshold 1.0%), 1 matched point(s) not")


# ---- ingest: the same closing line ---------------------------------------------------------------------------
def test_ingest_ends_with_the_closing_line_of_its_outcome(mbx, tmp_path: Path) -> None:
    """A completed log passes, a truncated one fails (exit 1): each says so in one closing line, --json too
    (ingest ended with "ingested … verdict pass" and no PASS / FAIL word)."""
    logs, ws = ROOT / "tests" / "data" / "megatron" / "logs", str(tmp_path / "ws")
    good = mbx(
        "ingest", "past", str(logs / "megatron_lm__attn_bench_sink_te_1gpu_correctness__stdout.log"), "-w", ws
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert re.fullmatch(
        r"PASS cell \w+-r0 of 'past', every gate passed", good.stdout.rstrip().splitlines()[-1]
    )
    cut = logs / "megatron_lm__ling_v2_moe_pretrain_example__excerpt.log"  # stops at step 10 of 2000
    proc = mbx("ingest", "past", str(cut), "-w", ws, "--json")
    got = json.loads(proc.stdout)
    assert (proc.returncode, got["exit_code"], got["outcome"]) == (1, 1, "fail")
    assert re.fullmatch(
        r"FAIL cell \w+-r0 of 'past', gates FAIL: 1 failed, 1 cell\(s\) did not complete", got["closing"]
    )
    again = mbx("ingest", "past", str(cut), "-w", ws)  # already ingested: the same outcome, said again
    assert again.returncode == 1 and again.stdout.rstrip().splitlines()[-1] == got["closing"]


# ---- the search plots name the real length --------------------------------------------------------------------
def test_a_search_stopped_before_full_length_labels_no_trial_full_length(
    mbx, write_campaign, tmp_path: Path, cache_env
) -> None:
    """A halving over [4, 8] steps whose GPU-hours run out after one 4-step trial: the plot's trace is "4 steps",
    never "4 steps (full length)" (the longest trial was taken for the full length), and no plot calls it so."""
    import copy

    from conftest import TINY_MOE_RECIPE

    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"]["steps"] = 8
    search = {"method": "halving", "halving": {"steps": [4, 8], "keep": 0.5}, "budget": {"gpu_hours": 1e-9}}
    path = write_campaign({"name": "spent", "trainer": {"recipe": recipe}, "collect": {"window": 3},
                           "wandb": {"mode": "disabled"}, "launchers": {"local": {"parallel": 1}},
                           "sweep": {"axes": {"training.micro_batch_size": [1, 2, 4]}, "search": search}})  # fmt: skip
    ws = tmp_path / "ws"
    proc = mbx("campaign", "run", str(path), "-w", str(ws), env=cache_env)
    assert proc.returncode == 3 and "no trial ran to the full length (8 steps)" in proc.stdout, proc.stdout
    page = (ws / "spent" / "report" / "index.html").read_text()
    found = re.search(r'data-target="fig-pareto">(.*?)</script>', page, re.S)
    assert found is not None
    names = [t["name"] for t in json.loads(found.group(1))["data"] if "steps" in t["name"]]
    assert names == ["4 steps"], names
    assert "(full length)" not in page


# ---- config differs: each change once ---------------------------------------------------------------------------
def test_a_swept_change_is_one_config_line_with_the_keys_it_set(tmp_path: Path, mbx, write_campaign) -> None:
    """Two points of one sweep over env.SLOW: the swept key, the env it set and the argv flag its template fills
    with `{env.SLOW}` are one line (they were three, one per key); --json's config_diff keeps every key."""
    ws = tmp_path / "ws"
    spec = fake("swept")
    spec["sweep"] = {"axes": {"env.SLOW": ["1.0", "1.03"]}}
    run(mbx, write_campaign, ws, spec)
    ids = {c["params"]["env.SLOW"]: c["point_id"] for c in
           json.loads(mbx("campaign", "status", "swept", "-w", str(ws), "--json").stdout)["cells"]}  # fmt: skip
    args = (
        "compare",
        "swept",
        "swept",
        "--pair",
        f"{ids['1.0']}:{ids['1.03']}",
        "-w",
        str(ws),
        "--metric",
        "peak_alloc",
    )
    lines = [line for line in mbx(*args).stdout.splitlines() if line.startswith("config")]
    assert lines == [
        "config differs: sweep.env.SLOW: 1.0 → 1.03 (also: env.SLOW, trainer.recipe.argv --fake-slowdown)"
    ]
    data = json.loads(mbx(*args, "--json").stdout)["pairs"][0]
    assert [d["key"] for d in data["config_diff"]] == [
        "env.SLOW",
        "sweep.env.SLOW",
        "trainer.recipe.argv --fake-slowdown",
    ]


def test_only_keys_a_change_set_join_its_line() -> None:
    """Same values alone do not join: an unrelated key changed 1 → 2 keeps its own line; a rendered flag joins
    the swept key it renders, and a line takes the best rule of its keys."""
    from orchestrator.judge.compare_config import ranked_groups

    diff = [{"key": k, "a": "1", "b": "2"} for k in ("env.OTHER", "sweep.training.micro_batch_size",
            "trainer.recipe.argv --micro-batch-size", "trainer.recipe.training.micro_batch_size")]  # fmt: skip
    assert ranked_groups(diff, {}) == [
        ("sweep.training.micro_batch_size: 1 → 2 (also: trainer.recipe.argv --micro-batch-size, "
         "trainer.recipe.training.micro_batch_size)", "batch and sequence"),
        ("env.OTHER: 1 → 2", None),
    ]  # fmt: skip


def test_a_command_trainers_param_is_one_change() -> None:
    """A Megatron command's `trainer.params.X` (the campaign's), `trainer.recipe.params.X` (the cell's recipe)
    and the flag it renders to are one change, said once (were two lines: the recipe's key on its own)."""
    from orchestrator.judge.compare_config import ranked_groups

    keys = ("trainer.params.micro_batch_size", "trainer.recipe.argv --micro-batch-size",
            "trainer.recipe.params.micro_batch_size")  # fmt: skip
    diff = [{"key": k, "a": "1", "b": "2"} for k in keys]
    diff += [{"key": k, "a": "full", "b": "selective"} for k in ("trainer.params.recompute_granularity",
             "trainer.recipe.argv --recompute-granularity", "trainer.recipe.params.recompute_granularity")]  # fmt: skip
    assert ranked_groups(diff, {}) == [
        ("trainer.params.micro_batch_size: 1 → 2 (also: trainer.recipe.argv --micro-batch-size, "
         "trainer.recipe.params.micro_batch_size)", "batch and sequence"),
        ("trainer.params.recompute_granularity: full → selective (also: trainer.recipe.argv "
         "--recompute-granularity, trainer.recipe.params.recompute_granularity)", "recompute"),
    ]  # fmt: skip


def test_two_trainers_compared_name_the_trainer_first() -> None:
    """Bridge (a command trainer) against the bundled trainer on the same shapes (the real H100 case of issue 33):
    the first suspect is the trainer itself, not a key only one trainer's schema has (it said "first suspect:
    precision: trainer.recipe.precision: (unset) → bf16", though both ran BF16)."""
    from orchestrator.judge.compare_config import ranked_groups

    diff = [{"key": "trainer.recipe.precision", "a": "(unset)", "b": "bf16"},
            {"key": "trainer.kind", "a": "command", "b": "bundled"},
            {"key": "container.image", "a": "nemo:25.11", "b": "nemo:26.01"}]  # fmt: skip
    assert ranked_groups(diff, {}) == [
        ("trainer.kind: command → bundled", "the trainer itself"),
        ("trainer.recipe.precision: (unset) → bf16", "precision"),
        ("container.image: nemo:25.11 → nemo:26.01", "container and software"),
    ]


# ---- campaign plan: why a point is infeasible, not its headroom --------------------------------------------------
def test_plan_says_why_a_row_is_infeasible_and_names_a_sized_gpu_plainly(mbx, write_campaign) -> None:
    """`--gpu 80GiB`: the too-big point's row says "INFEASIBLE: memory" with no headroom (it showed -70.8 beside
    INFEASIBLE), a layout-refused row names its keys, and the reason says "the GPU's 80.0 GiB" (was "the
    80GiB's 80.0 GiB")."""
    from test_feasibility import HUGE, bundled_campaign

    result = mbx("campaign", "plan", str(write_campaign(bundled_campaign())), "--gpu", "80GiB")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {
        line.split()[2] + "/" + line.split()[3]: line.split()[5:] for line in result.stdout.splitlines()[3:7]
    }
    assert rows["32/1"] == ["0.06", "80GiB", "79.9", "ok"], rows
    assert rows[f"{HUGE}/1"] == ["150.8", "80GiB", "·", "INFEASIBLE:", "memory"], rows
    assert rows["32/2"] == ["·", "80GiB", "·", "INFEASIBLE:", "parallel.tensor,", "parallel"], rows
    assert "allocator slack exceeds the GPU's 80.0 GiB;" in result.stdout and "80GiB's" not in result.stdout
