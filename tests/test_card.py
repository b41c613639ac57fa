"""Model verification cards: the published Bridge cards validate; hostile cards are refused with the key path; a
real CPU campaign → `mbx card export` → `validate` → `check` round trip, passing against its own card and failing
against a card it cannot meet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY_MOE_RECIPE

from reports.card import card_problems, portable_margin

BRIDGE = ROOT / "tests" / "data" / "megatron" / "bridge"
PUBLISHED = sorted(BRIDGE.glob("*.card.yaml"))


def test_published_bridge_cards_validate(mbx) -> None:
    assert PUBLISHED, f"no published cards in {BRIDGE}"
    result = mbx("card", "validate", *map(str, PUBLISHED))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok ") == len(PUBLISHED)


def _card(**item: object) -> dict:
    body = {"status": "verified", "precision": "bf16", "command": "./train.sh --nodes 1",
            "metrics": {"last_10_steps_model_tflops_per_gpu_avg": 300.0, "final_loss": 5.0}, **item}  # fmt: skip
    return {"title": "m", "items": {"pretrain": {"H200": body}}}


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (
            {"command": "srun --account=myproject ./train.sh"},
            "items.pretrain.H200.command: contains a Slurm account",
        ),
        ({"command": "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789 x"}, "contains a Hugging Face token"),
        ({"save_dir": "/lustre/fsw/alice/ckpt"}, "items.pretrain.H200.save_dir: contains a personal or site"),
        ({"log": "see /tmp/run/log.txt"}, "contains an absolute path ('/tmp/run/log.txt')"),
        ({"wandb_api_key": "0123456789abcdef0123456789abcdef01234567"}, "under a credential-like key"),
        (
            {"metrics": {"final_loss": float("nan")}},
            "items.pretrain.H200.metrics.final_loss: must be a finite",
        ),
        ({"window_steps": 5}, "window of at least 10 steps, got 5"),
        ({"status": "great"}, "items.pretrain.H200.status: must be one of verified"),
        (
            {"thresholds": {"last_10_steps_model_tflops_per_gpu_avg": {"min": 310.0}}},
            "wrong side of the measured",
        ),
        ({"thresholds": {"final_loss": {"max": 6}}}, "not a gated metric"),
    ],
)
def test_hostile_or_broken_cards_are_named(item: dict, expected: str) -> None:
    problems = card_problems(_card(**item))
    assert any(expected in p for p in problems), problems


def test_validate_cli_names_file_and_key_and_exits_2(mbx, tmp_path: Path) -> None:
    bad = tmp_path / "bad.card.yaml"
    bad.write_text(yaml.safe_dump(_card(command="srun -A acct x", log="[red]/x[/red]")))
    result = mbx("card", "validate", str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{bad}: items.pretrain.H200.command: contains a Slurm account" in result.stderr
    assert "absolute path ('/x')" in result.stderr and "[red]" not in result.stderr.replace("'[red]", "")


def test_margin_comes_from_repeat_noise_with_a_floor() -> None:
    tight, basis = portable_margin([100.0, 100.01, 99.99])
    assert tight == 0.01 and "floor" in basis
    noisy, basis = portable_margin([100.0, 104.0, 96.0])
    assert 0.3 < noisy < 0.5 and "3 repeats" in basis  # t(0.99, 2) = 6.96: a wide bound from 3 noisy repeats
    assert portable_margin([100.0])[0] == 0.03 and portable_margin([1.0, 2.0], given=0.07)[0] == 0.07


def _campaign(tmp_path: Path) -> Path:
    recipe = json.loads(json.dumps(TINY_MOE_RECIPE))
    recipe["training"]["steps"] = 13
    data = {"name": "cardrun", "description": "tiny MoE for a card", "trainer": {"kind": "bundled", "recipe": recipe},
            "sweep": {"repeats": 1}, "collect": {"window": 10}}  # fmt: skip
    path = tmp_path / "cardrun.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_export_validate_check_round_trip(mbx, tmp_path: Path, cache_env: dict[str, str]) -> None:
    workspace = tmp_path / "ws"
    run = mbx("campaign", "run", str(_campaign(tmp_path)), "--workspace", str(workspace), env=cache_env)
    assert run.returncode == 0, run.stdout + run.stderr
    points = json.loads(mbx("campaign", "status", "cardrun", "--workspace", str(workspace), "--json").stdout)["cells"]
    point = points[0]["point_id"]

    card_file = tmp_path / "cardrun.card.yaml"
    exported = mbx(
        "card", "export", "cardrun", "--point", point, "--workspace", str(workspace), "--out", str(card_file)
    )
    assert exported.returncode == 0, exported.stderr
    card = yaml.safe_load(card_file.read_text())
    (body,) = card["items"]["pretrain_performance"].values()
    assert body["repeats"] == 1 and body["window_steps"] == 10 and body["status"] == "verified"
    gate = body["thresholds"]["last_10_steps_model_tflops_per_gpu_avg"]
    assert gate["min"] < gate["measured"] == body["metrics"]["last_10_steps_model_tflops_per_gpu_avg"]
    assert gate["margin"] == 0.03 and "one repeat gives no noise estimate" in gate["basis"]
    assert (
        body["thresholds"]["last_10_steps_step_time_ms_avg"]["max"]
        > body["metrics"]["last_10_steps_step_time_ms_avg"]
    )
    assert "Portable gate" in body["expected_result"] and str(tmp_path) not in card_file.read_text()

    assert mbx("card", "validate", str(card_file)).returncode == 0
    own = mbx("card", "check", str(card_file), "--campaign", "cardrun", "--workspace", str(workspace))
    # one repeat is judged on its value (no interval): the run meets its own portable gates (3% margin)
    assert own.returncode == 0 and "PASS" in own.stdout, own.stdout + own.stderr

    # --margin is a percent (before 2026-12-06 a fraction): 7 is 7%, in the card as the fraction 0.07
    wide = mbx("card", "export", "cardrun", "-p", point, "-w", str(workspace), "--margin", "7", "--json")
    wide_gate = json.loads(wide.stdout)["items"]["pretrain_performance"]
    (wide_gate,) = (b["thresholds"]["last_10_steps_model_tflops_per_gpu_avg"] for b in wide_gate.values())
    assert wide_gate["margin"] == 0.07 and wide_gate["basis"] == "given (7%)", wide.stderr
    assert wide_gate["min"] == pytest.approx(wide_gate["measured"] * 0.93, rel=1e-3)
    prose = tmp_path / "prose.card.yaml"  # a card without structured thresholds is gated with --margin
    prose.write_text(yaml.safe_dump({**card, "items": {"pretrain_performance": {
        gpu: {k: v for k, v in b.items() if k != "thresholds"} for gpu, b in card["items"]["pretrain_performance"].items()
    }}}))  # fmt: skip
    gated = mbx("card", "check", "cardrun", str(prose), "-w", str(workspace), "--margin", "10%")
    assert gated.returncode == 0 and "gating at its measured values with a 10% margin" in gated.stderr, gated.stderr

    def check_with(scale: float) -> object:
        for name, threshold in body["thresholds"].items():
            key = "min" if "min" in threshold else "max"
            threshold["measured"] = body["metrics"][name] = threshold["measured"] * scale
            threshold[key] = threshold["measured"] / 100 if key == "min" else threshold["measured"] * 100
        card_file.write_text(yaml.safe_dump(card))
        return mbx("card", "check", str(card_file), "--campaign", "cardrun", "--workspace", str(workspace))

    met = check_with(1.0)  # bounds 100× looser than measured: clearly met
    assert met.returncode == 0 and "PASS" in met.stdout, met.stdout + met.stderr
    unmet = check_with(1000.0)  # a card measured 1000× faster: its bounds are 10× beyond this run
    assert unmet.returncode == 1 and "FAIL" in unmet.stdout and "below the minimum" in unmet.stdout, (
        unmet.stdout
    )

    missing = mbx("card", "export", "cardrun", "--point", "nope", "--workspace", str(workspace))
    assert missing.returncode == 2 and "no such point" in missing.stderr and "Traceback" not in missing.stderr


def test_check_gates_only_the_points_named(mbx, tmp_path: Path, cache_env: dict[str, str]) -> None:
    """`card check -p POINT` gates the point the card came from (issue 33: a Bridge sweep's card item, checked on
    its sweep, failed the 7 other points, which the card does not describe); `-p` repeats; an unknown point is
    bad input naming the campaign's points."""
    data = yaml.safe_load(_campaign(tmp_path).read_text())
    data["sweep"] = {"axes": {"optimizer.lr": [0.001, 0.002]}, "repeats": 1}
    path = tmp_path / "cardrun.yaml"
    path.write_text(yaml.safe_dump(data))
    workspace = tmp_path / "ws"
    run = mbx("campaign", "run", str(path), "-w", str(workspace), "--json", env=cache_env)
    assert run.returncode == 0, run.stdout + run.stderr
    first, second = (c["point_id"] for c in json.loads(run.stdout)["cells"])
    card_file = tmp_path / "cardrun.card.yaml"
    assert mbx("card", "export", "cardrun", "-p", first, "-w", str(workspace), "-o", str(card_file)).returncode == 0

    one = mbx("card", "check", "cardrun", str(card_file), "-w", str(workspace), "-p", first, "--json")
    assert one.returncode == 0 and json.loads(one.stdout)["closing"].endswith(": 1 point(s)"), one.stdout + one.stderr
    both = mbx("card", "check", "cardrun", str(card_file), "-w", str(workspace), "-p", first, "-p", second, "-p",
               first, "--json")  # fmt: skip
    assert json.loads(both.stdout)["closing"].endswith(": 2 point(s)"), both.stdout  # a point named twice: once
    unknown = mbx("card", "check", "cardrun", str(card_file), "-w", str(workspace), "-p", "nope")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    listed = ", ".join(sorted((first, second)))  # the same resolver and message as `card export -p`
    assert f"--point 'nope': campaign 'cardrun' has no such point, cell or label (points: {listed})" in unknown.stderr
