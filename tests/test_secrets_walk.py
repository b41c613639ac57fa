"""The planted-secret walk (issue 32): the values of tests/planted_secrets.py followed through every writer of
mbx, and no raw value found in any file it wrote: run dirs (status.json's log tail, launch.json, metrics), the report
site and summary, W&B's offline run files and the Report spec, a freeze output and a card, and `compare`'s
terminal, Markdown, JSON and page (its config diff shows both sides' env and argv).

Two campaigns share one workspace. `leak` holds 16 of the values in its fields: `campaign validate` refuses it
(every key path named, no value shown), so it reaches the writers the way a campaign stored before this release
would: through the real lifecycle with only the file's checks left out (the input files it gave, mbx.sqlite,
campaign.json and each attempt's recipe.yaml, hold what it gave; so does the trainer's own log, which mbx never
rewrites). Its trainer prints its argv, its environment and a value of its own (`log`), which a trainer may print anytime:
`clean` validates and runs through the CLI, and its freeze output and card are written. Every other file is grepped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import FAKE_MEGATRON, MEGATRON_LOG, ROOT, run_mbx
from planted_secrets import LOG_LINE, PLANTED, VALUES, plant

LEAKY_TRAINER = '''"""Replays a Megatron log, then prints what it was given and a secret of its own."""
import os, subprocess, sys
rc = subprocess.call([sys.executable, os.environ["FAKE_MEGATRON"], "--replay", os.environ["MEGATRON_LOG"],
                      "--sleep-s", "0", *sys.argv[1:]])
print("argv:", " ".join(sys.argv[1:]))
names = ("DB_PASSWORD", "ADMIN_PASSWORD", "WANDB_API_KEY", "NOTE", "SWEEP_PASSWORD", "CELL_TOKEN", "DB2_PASSWORD",
         "CLIENT_SECRET", "DB_PASS", "NOTE2", "CURL", "SETUP", "LOGIN", "SETUP2", "PYSETUP", "HF2_TOKEN", "FETCH",
         "PROXY", "LOGIN2")
print("env:", " ".join(f"{k}={os.environ.get(k, '')}" for k in names))
print(os.environ["LOG_LINE"])
sys.exit(rc)
'''
# The lifecycle of `mbx campaign run`, without the file's checks (a campaign that reached the store before them).
RUN_UNCHECKED = """
import sys, yaml
from pathlib import Path
from orchestrator.flow import lifecycle
from orchestrator.spec.campaign import Campaign
from orchestrator.trainers import expand, with_parity_axes
file = Path(sys.argv[1])
campaign = with_parity_axes(Campaign.model_validate(yaml.safe_load(file.read_text())), file)
plan = lifecycle.prepare_points(campaign, expand(campaign, file, None), file,
                                lifecycle.Options(workspace=Path(sys.argv[2])))
lifecycle.execute(plan)
"""
# What the `leak` run was given, kept as given (relative to the workspace), and the trainer's own output.
INPUTS = ("mbx.sqlite", "leak/campaign.json")
INPUT_NAMES = ("recipe.yaml",)


def _campaign(name: str) -> dict:
    """A command-trainer campaign without absolute paths (its card is published): the trainer beside the file."""
    return {"name": name,
            "trainer": {"kind": "command", "command": ["python", "{campaign_dir}/leaky.py", "--x", "1"],
                        "log_format": "megatron-lm", "params": {"train_iters": 30}},
            "env": {"pass": ["LOG_LINE", "FAKE_MEGATRON", "MEGATRON_LOG"]},
            "sweep": {"axes": {"params.micro_batch_size": [1]}}}  # fmt: skip


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("walk")
    trainer = root / "leaky.py"
    trainer.write_text(LEAKY_TRAINER)
    leak, clean = root / "leak.yaml", root / "clean.yaml"
    leak.write_text(yaml.safe_dump(plant(_campaign("leak")), sort_keys=False))
    clean.write_text(yaml.safe_dump(_campaign("clean"), sort_keys=False))
    ws = root / "ws"
    env = {"LOG_LINE": LOG_LINE, "FAKE_MEGATRON": str(FAKE_MEGATRON), "MEGATRON_LOG": str(MEGATRON_LOG),
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "MBX_CACHE_DIR": str(root / "cache")}  # fmt: skip
    results = {"validate": run_mbx("campaign", "validate", str(leak))}
    unchecked = subprocess.run([sys.executable, "-c", RUN_UNCHECKED, str(leak), str(ws)], cwd=ROOT, text=True,
                               capture_output=True, timeout=300,
                               env={**os.environ, **env, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert unchecked.returncode == 0, unchecked.stdout[-3000:] + unchecked.stderr[-3000:]
    results["run"] = run_mbx("campaign", "run", str(clean), "-w", str(ws), env=env)
    assert results["run"].returncode == 0, results["run"].stdout[-3000:] + results["run"].stderr[-3000:]
    first = {}
    for name in ("leak", "clean"):
        results[f"report {name}"] = run_mbx("report", name, "-w", str(ws), "-m", "--wandb-report", env=env)
        cells = sorted(p.name for p in (ws / name).glob("*-r0"))
        first[name] = cells[0]
        results[f"freeze {name}"] = run_mbx("freeze", name, "-w", str(ws), "-o", str(root / f"frozen-{name}"),
                                            "--point", cells[0], env=env)  # fmt: skip
        results[f"card {name}"] = run_mbx("card", "export", name, "-w", str(ws), "--point", cells[0],
                                          "-o", str(root / f"{name}.card.yaml"), env=env)  # fmt: skip
        results[f"golden {name}"] = run_mbx("golden", "export", name, "-w", str(ws), "--point", cells[0],
                                            "-o", str(root / f"{name}.golden.json"), env=env)  # fmt: skip
    compare = ("compare", "clean", "leak", "-w", str(ws), "--pair", f"{first['clean']}:{first['leak']}")
    for flag in ("-m", "--json"):  # and the terminal, with the page (its file is grepped with the others)
        results[f"compare {flag}"] = run_mbx(*compare, flag, env=env)
    results["compare"] = run_mbx(*compare, "--html", str(root / "compared"), env=env)
    return {"root": root, "ws": ws, "results": results}


def test_validate_refuses_every_planted_field_without_showing_a_value(walked):
    result = walked["results"]["validate"]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for name, (where, _) in PLANTED.items():
        if where:
            assert f"{where}: contains " in result.stderr, (name, result.stderr)
    assert not [value for value in VALUES if value in result.stdout + result.stderr]


def _is_input(path: Path, ws: Path) -> bool:
    relative = path.relative_to(ws).as_posix() if path.is_relative_to(ws) else ""
    trainer_log = path.parent.name == "logs" and len(path.parents) > 4 and path.parents[4] == ws
    return relative in INPUTS or (relative.startswith("leak/") and path.name in INPUT_NAMES) or trainer_log


def test_no_planted_value_in_any_file_mbx_wrote(walked):
    root, ws, results = walked["root"], walked["ws"], walked["results"]
    files = [
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix not in (".py", ".yaml")
        or p.name.endswith(".card.yaml")
        or p.parent.name.startswith("frozen-")
        or p.is_relative_to(ws)
        and p.is_file()
    ]
    files = sorted({p for p in files if p.is_file()})
    found = {str(p.relative_to(root)): [n for n, (_, v) in PLANTED.items() if v.encode() in p.read_bytes()]
             for p in files if not _is_input(p, ws)}  # fmt: skip
    assert {p: n for p, n in found.items() if n} == {}
    # the writers did write: every output exists, so the grep above read them
    names = {p.relative_to(root).as_posix() for p in files}
    assert list(ws.glob("wandb/offline-run-*/run-*.wandb")), "no W&B run file"
    for expected in ("ws/leak/report/index.html", "ws/leak/report/summary.md", "ws/leak/report/wandb-report.json",
                     "ws/clean/report/index.html", "frozen-clean/FROZEN.md", "frozen-clean/campaign.yaml",
                     "frozen-clean/frozen.json", "clean.card.yaml", "clean.golden.json", "leak.golden.json"):  # fmt: skip
        assert expected in names, (expected, sorted(names)[:50])
    assert list(ws.glob("leak/*/1/launch.json")) and list(ws.glob("leak/*/1/status.json"))
    # the values did reach mbx: the inputs it was given and the trainer's log hold them
    assert PLANTED["dash_env"][1].encode() in (ws / "mbx.sqlite").read_bytes()
    assert any(PLANTED["log"][1].encode() in p.read_bytes() for p in ws.glob("*/*/1/logs/*"))
    tails = [
        yaml.safe_load(p.read_text())["launcher_status"]["log_tail"] for p in ws.glob("leak/*/1/status.json")
    ]
    assert tails and all("HF_TOKEN=<redacted>" in tail and "DB_PASSWORD=<redacted>" in tail for tail in tails)
    # what refuses a secret wrote nothing, and says so
    for command in ("freeze leak", "card leak"):
        assert results[command].returncode == 2, (command, results[command].stderr[-2000:])
    assert not (root / "frozen-leak").exists() and not (root / "leak.card.yaml").exists()
    for command in (
        "run",
        "report leak",
        "report clean",
        "freeze clean",
        "card clean",
        "golden leak",
        "golden clean",
    ):
        assert results[command].returncode == 0, (command, results[command].stderr[-2000:])
        assert not [value for value in VALUES if value in results[command].stdout + results[command].stderr]
    for command in ("compare", "compare -m", "compare --json"):  # its config diff shows both sides' env, argv
        output = results[command].stdout + results[command].stderr
        assert results[command].returncode in (0, 1, 3) and "DB_PASSWORD" in output, (command, output[-2000:])
        assert not [value for value in VALUES if value in output], command
    assert (root / "compared" / "index.html").is_file()
