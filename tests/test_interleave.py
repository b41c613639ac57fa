"""`mbx compare --run A.yaml B.yaml` and `--until-conclusive` end to end: two tiny CPU campaigns of the real
bundled trainer run alternately (A B A B, checked from each attempt's launch.json and the store), resumed
without rerunning anything, compared with the same verdicts and exit codes as `mbx compare A B`, and extra
repeat cells `<point>-r<n>` run until decided or out of budget.

B is the candidate that is slower (sequences 8× longer) and learns worse (a 100× smaller learning rate): its
final loss is deterministic on the CPU (same seed every repeat), so the final-loss verdict is certain
(DIFFERENT, worse: exit 1) whatever the noise of a shared machine does to step times.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TINY_MOE_RECIPE

from orchestrator.run.store import Store
from trainer import rundir


def side(name: str, *, seq_length: int, lr: float, repeats: int, window: int = 6, steps: int = 14,
         sizes: tuple[int, ...] = (4,)) -> dict[str, Any]:  # fmt: skip
    recipe = copy.deepcopy(TINY_MOE_RECIPE)
    recipe["training"].update(seq_length=seq_length, steps=steps)
    recipe["optimizer"].update(lr=lr, min_lr=lr / 10)
    recipe["device"] = "cpu"
    return {
        "name": name,
        "trainer": {"kind": "bundled", "recipe": recipe},
        "resources": {"nodes": 1, "gpus_per_node": 1},
        "sweep": {"axes": {"training.micro_batch_size": list(sizes)}, "repeats": repeats},
        "collect": {"window": window},
        "launcher": "local",
        "env": {"values": {"OMP_NUM_THREADS": "1"}},  # less contention noise on a shared CPU
        "wandb": {"mode": "disabled"},
    }


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def pair_files(tmp_path: Path, repeats: int, **extra: Any) -> tuple[Path, Path]:
    a = write(tmp_path, side("ab-fast", seq_length=32, lr=1e-2, repeats=repeats, **extra))
    b = write(tmp_path, side("ab-slow", seq_length=256, lr=1e-4, repeats=repeats, **extra))
    return a, b


def started(workspace: Path, names: tuple[str, ...]) -> list[tuple[str, str, int, float]]:
    """(campaign, cell id, attempt, launch.json written_at) of every attempt of the campaigns, by start time."""
    rows = []
    with Store(workspace, create=False) as store:
        for name in names:
            for attempt in store.attempts(name):
                launch = rundir.read_launch(Path(attempt.run_dir)) or {}
                rows.append((name, attempt.cell_id, attempt.attempt, float(launch["written_at"])))
    return sorted(rows, key=lambda r: r[3])


def test_interleaved_run_alternates_resumes_and_decides(tmp_path: Path, mbx, cache_env) -> None:
    a, b = pair_files(tmp_path, repeats=3)
    ws = tmp_path / "ws"
    args = ("compare", "--run", str(a), str(b), "--workspace", str(ws), "--metric", "step_time",
            "--metric", "final_loss", "--json")  # fmt: skip
    proc = mbx(*args, env=cache_env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)  # progress went to stderr
    assert "interleaved A/B: A = ab-fast, B = ab-slow" in proc.stderr
    (pair,) = data["pairs"]
    assert pair["a"]["campaign"] == "ab-fast" and pair["b"]["campaign"] == "ab-slow"
    assert pair["a"]["params"] == pair["b"]["params"] == {"training.micro_batch_size": 4}
    assert len(pair["a"]["repeats"]) == len(pair["b"]["repeats"]) == 3
    loss = pair["metrics"]["final_loss"]
    assert loss["decision"] == "different" and loss["change"] > 0.01 and loss["test"] == "exact (no spread)"
    step = pair["metrics"]["step_time"]
    assert step["change"] > 1.0 and step["decision"] in ("different", "unknown")
    assert "final_loss" in pair["worse"] and data["exit_code"] == 1
    assert any(line.startswith("loss diverges from step ") for line in pair["diagnosis"]), pair["diagnosis"]

    order = started(ws, ("ab-fast", "ab-slow"))
    assert [name for name, *_ in order] == ["ab-fast", "ab-slow"] * 3
    assert [cell.rsplit("-r", 1)[1] for _, cell, *_ in order] == ["0", "0", "1", "1", "2", "2"]

    again = mbx(*args, env=cache_env)  # a rerun reuses every completed cell and decides the same
    assert again.returncode == 1, again.stderr
    assert started(ws, ("ab-fast", "ab-slow")) == order
    assert json.loads(again.stdout)["pairs"][0]["metrics"] == pair["metrics"]
    assert again.stderr.count("already completed") == 6

    stored = mbx("compare", "ab-fast", "ab-slow", "--workspace", str(ws), "--metric", "step_time",
                 "--metric", "final_loss", "--json")  # fmt: skip
    assert stored.returncode == 1 and json.loads(stored.stdout)["pairs"] == data["pairs"]


def test_campaigns_that_do_not_match_point_by_point_are_refused(tmp_path: Path, mbx) -> None:
    a = write(tmp_path, side("m-a", seq_length=32, lr=1e-2, repeats=1, sizes=(2, 4)))
    b = write(tmp_path, side("m-b", seq_length=32, lr=1e-2, repeats=1, sizes=(4, 8)))
    ws = tmp_path / "ws"
    proc = mbx("compare", "--run", str(a), str(b), "--workspace", str(ws))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{a}: point [micro_batch_size=2] has no point with the same swept values in {b}" in proc.stderr
    assert f"{b}: point [micro_batch_size=8] has no point with the same swept values in {a}" in proc.stderr
    assert "Traceback" not in proc.stderr and not (ws / "mbx.sqlite").exists()  # nothing written
    same = mbx("compare", "--run", str(a), str(a), "--workspace", str(ws))
    assert same.returncode == 2 and "both files name the campaign 'm-a'" in same.stderr
    c = write(tmp_path, side("m-c", seq_length=32, lr=1e-2, repeats=1, sizes=(2, 4), window=4))
    window = mbx("compare", "--run", str(a), str(c), "--workspace", str(ws))
    assert (
        window.returncode == 2
        and "collect.window: " in window.stderr
        and "give both the same window" in window.stderr
    )
    stray = mbx("compare", "x", "y", "--repeats", "2", "--workspace", str(ws))
    assert stray.returncode == 2 and "--repeats applies with --run" in stray.stderr


def test_until_conclusive_adds_repeat_cells_within_budget(tmp_path: Path, mbx, cache_env) -> None:
    # one repeat a side: the final loss of one repeat has no spread to judge by: UNKNOWN for certain (step time,
    # 8× the tokens, may be DIFFERENT even at one run a side, its CI widened by the run-to-run floor)
    a, b = pair_files(tmp_path, repeats=1, window=3, steps=8)
    ws = tmp_path / "ws"
    first = mbx("compare", "--run", str(a), str(b), "--workspace", str(ws), "--json", env=cache_env)
    assert first.returncode in (1, 3), first.stdout + first.stderr
    step = json.loads(first.stdout)["pairs"][0]["metrics"]["step_time"]
    assert step["run_floor"] == 0.01 and "1 run a side: within-run CI widened by the run-to-run floor" in step["reason"]
    assert json.loads(first.stdout)["pairs"][0]["metrics"]["final_loss"]["decision"] == "unknown"

    # stored campaigns, a budget of 2: exactly one more repeat per side, A then B
    proc = mbx("compare", "ab-fast", "ab-slow", "--workspace", str(ws), "--until-conclusive", "--budget", "2",
               "--metric", "step_time", "--metric", "final_loss", "--json", env=cache_env)  # fmt: skip
    data = json.loads(proc.stdout)
    assert proc.returncode == data["exit_code"], proc.stderr
    pair = data["pairs"][0]
    assert [len(pair[s]["repeats"]) for s in "ab"] == [2, 2]
    assert pair["metrics"]["final_loss"]["decision"] == "different" and data["exit_code"] == 1
    order = started(ws, ("ab-fast", "ab-slow"))
    assert [(n, c[-3:]) for n, c, *_ in order] == [("ab-fast", "-r0"), ("ab-slow", "-r0"), ("ab-fast", "-r1"),
                                                   ("ab-slow", "-r1")]  # fmt: skip

    # --run with the files' single repeat keeps the extra r1 of each side (said; reused, not rerun), then
    # --until-conclusive runs new cells until step time is decided or 6 extra cells are used
    proc = mbx("compare", "--run", str(a), str(b), "--workspace", str(ws), "--until-conclusive",
               "--metric", "step_time", "--json", env=cache_env)  # fmt: skip
    data = json.loads(proc.stdout)
    assert proc.returncode == data["exit_code"] and proc.returncode in (1, 3), proc.stderr
    assert proc.stderr.count("kept 1 extra repeat(s) beyond sweep.repeats (1)") == 2, proc.stderr
    step = data["pairs"][0]["metrics"]["step_time"]
    repeats = len(data["pairs"][0]["a"]["repeats"])
    assert 2 <= repeats <= 5 and len(data["pairs"][0]["b"]["repeats"]) == repeats  # 2 + at most 6/2
    assert (step["decision"] == "unknown") == (proc.returncode == 3)
    if step["decision"] == "unknown":
        assert repeats == 5 and "budget of 6 extra cell(s) spent" in proc.stderr
    order = started(ws, ("ab-fast", "ab-slow"))
    assert len(order) == 2 * repeats  # r1 was reused: no attempt twice
    assert [n for n, *_ in order] == ["ab-fast", "ab-slow"] * repeats


def test_until_conclusive_refuses_a_golden_values_side(tmp_path: Path, mbx) -> None:
    files = sorted((Path(__file__).parent / "data" / "megatron" / "golden_values").glob("*.json"))
    if not files:
        pytest.skip("no golden-values file in tests/data")
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = mbx("compare", str(files[0]), str(files[0]), "--workspace", str(ws), "--until-conclusive")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "is a golden-values file; more repeats cannot be run" in proc.stderr
        and "Traceback" not in proc.stderr
    )


def test_a_side_whose_cells_fail_exits_1_naming_them(tmp_path: Path, mbx, cache_env) -> None:
    a = write(tmp_path, side("f-a", seq_length=32, lr=1e-2, repeats=1, steps=4, window=2))
    broken = side("f-b", seq_length=32, lr=1e-2, repeats=1, steps=4, window=2)
    broken["trainer"]["recipe"].update(precision="fp8", device="auto")  # refused by the trainer at start-up
    b = write(tmp_path, broken)
    proc = mbx("compare", "--run", str(a), str(b), "--workspace", str(tmp_path / "ws"), env=cache_env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "B " in proc.stdout and "did not complete" in proc.stdout and "Traceback" not in proc.stderr
    assert not proc.stderr.startswith("error:"), proc.stderr  # was a bare error; now the one closing line
    closing = proc.stdout.rstrip().splitlines()[-1]
    assert closing.startswith("FAIL f-a → f-b (practical threshold 1.0%), 1 matched point(s) not compared: B f-b "
                              "point "), closing  # fmt: skip
    assert "no completed repeat" in closing and "cell(s) did not complete: " in closing and "fp8" in closing
    assert any(line.startswith("not compared: B f-b point ") for line in proc.stdout.splitlines())
    stored = mbx("compare", "f-a", "f-b", "--workspace", str(tmp_path / "ws"), "--json")  # the data, stored
    told = json.loads(stored.stdout)  # exited 2 with a bare error and no JSON
    assert (stored.returncode, told["exit_code"], told["verdict"]) == (1, 1, "fail"), stored.stderr
    assert told["closing"].startswith("FAIL f-a → f-b") and told["not_compared"][0].startswith("B f-b point ")
