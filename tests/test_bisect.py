"""`mbx bisect` for real: a git repository made here, whose runner script trains the bundled trainer on CPU with
the checkout's recipe defaults; one commit turns full recompute on. The bisect names that commit in the
expected number of probes, refuses ends that do not differ, and a second run re-runs nothing."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

RUNNER = '''"""Train the bundled trainer (in this process) with this checkout's defaults.json; print Megatron-LM
iteration lines whose time is each step's CPU time: on a shared 2-core test machine the wall time of a step
mostly measures the other processes, while the CPU time is the work the recipe asks for."""
import contextlib, io, json, pathlib, sys, time
import trainer.__main__ as entry
from trainer import rundir
here = pathlib.Path(__file__).resolve().parent
out = pathlib.Path(sys.argv[1]) / "inner"
out.mkdir(parents=True, exist_ok=True)
(out / "recipe.yaml").write_text((here / "defaults.json").read_text())
cpu = []
write = rundir.MetricsWriter.write
def timed(self, row):
    cpu.append(time.process_time())
    write(self, row)
rundir.MetricsWriter.write = timed
with contextlib.redirect_stdout(io.StringIO()):
    code = entry.run(["--recipe", str(out / "recipe.yaml"), "--out", str(out)])
if code:
    sys.exit(code)
rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
for index, row in enumerate(rows[1:], start=1):
    ms = (cpu[index] - cpu[index - 1]) * 1000
    print(f" iteration {row['step']:8d}/{len(rows):8d} | consumed samples: {row['step'] * 4:12d} | elapsed time per "
          f"iteration (ms): {ms:.1f} | learning rate: 1.000000E-03 | global batch size:     4 | "
          f"lm loss: {row['loss']:.6E} | loss scale: 1.0 | grad norm: {row['grad_norm']:.3f} | number of "
          "skipped iterations:   0 | number of nan iterations:   0 |", flush=True)
'''
DEFAULTS = {  # small and forward-heavy (routing): full recompute costs about 1.7-2x the CPU time per step
    "model": {"vocab_size": 128, "hidden_size": 64, "num_layers": 4, "num_attention_heads": 4,
              "ffn_hidden_size": 128, "moe": {"num_experts": 8, "top_k": 2, "ffn_hidden_size": 64}},
    "training": {"seq_length": 64, "micro_batch_size": 4, "steps": 10},
    "optimizer": {"warmup_steps": 2},
}  # fmt: skip
CULPRIT = 2  # the index (0 = good) of the commit that turns full recompute on: the bad end
# after the good one: one probe, a version as fast as the good end, which the bisect must call good under real
# timing noise before it names the bad end (each version measured costs 3 trainer runs beside 3 fresh runs of the
# good end; test_bisect_over_listed_values_markdown walks a longer search with exact replayed times)
COMMITS = 2


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin", "HOME": str(repo)}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()  # fmt: skip


def make_repo(repo: Path) -> list[str]:
    """A repository of COMMITS + 1 commits (good first); commit CULPRIT turns recompute on. Their SHAs."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "run.py").write_text(RUNNER)
    shas = []
    for index in range(COMMITS + 1):
        defaults = dict(DEFAULTS, **({"recompute": "full"} if index >= CULPRIT else {}))
        (repo / "defaults.json").write_text(json.dumps(defaults, indent=1) + "\n")
        (repo / "NOTES.txt").write_text(f"release note {index}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "turn full recompute on" if index == CULPRIT else f"change {index}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    return shas


def campaign(tmp_path: Path, write_campaign) -> Path:
    return write_campaign({
        "name": "frozen",
        "trainer": {"kind": "command", "command": [sys.executable, "{software.lib}/run.py", "{run_dir}"],
                    "steps": 10},
        "software": {"repos": {"lib": {"path": "lib", "ref": "main"}}},
        "sweep": {"repeats": 3},
        "collect": {"window": 7},
        "launchers": {"local": {"parallel": 1}},
        "env": {"values": {"OMP_NUM_THREADS": "1"}},  # one thread: steady step times on a busy machine
        "wandb": {"mode": "disabled"},
    })  # fmt: skip


def expected_probes(first_bad: int, count: int) -> int:
    """Probes (besides the ends) a binary search over `count` versions makes to find `first_bad`."""
    lo, hi, probes = 0, count - 1, 0
    while hi - lo > 1:
        mid, probes = (lo + hi) // 2, probes + 1
        lo, hi = (lo, mid) if mid >= first_bad else (mid, hi)
    return probes


def run_dirs(workspace: Path) -> list[Path]:
    return sorted(p for p in workspace.glob("frozen.bisect-*/*/*") if p.name.isdigit())


def test_bisect_names_the_recompute_commit_and_resumes(tmp_path, mbx, write_campaign, cache_env):
    shas = make_repo(tmp_path / "lib")
    path = campaign(tmp_path, write_campaign)
    workspace = tmp_path / "ws"
    args = ("bisect", str(path), "--good", shas[0], "--bad", "main", "-w", str(workspace), "--min-effect", "40",
            "--max-repeats", "8", "--json")  # fmt: skip
    done = mbx(*args, env=cache_env)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["first_bad"]["value"] == shas[CULPRIT]
    assert "turn full recompute on" in result["first_bad"]["label"]
    assert result["first_bad"]["decision"]["change"] > 0.3  # full recompute: obviously slower
    probes = [m for m in result["measurements"] if m["role"] == "probe"]
    assert len(probes) == expected_probes(CULPRIT, COMMITS + 1) == math.ceil(math.log2(COMMITS))
    assert {m["verdict"] for m in result["measurements"] if m["index"] < CULPRIT} == {"good"}
    assert {m["verdict"] for m in result["measurements"] if m["index"] >= CULPRIT} == {"bad"}
    before = run_dirs(workspace)
    assert len(before) >= 3 * (2 + len(probes))  # every version at least 3 repeats (more where UNKNOWN)
    assert all(m["repeats"] >= 3 for m in result["measurements"])
    assert len(list((workspace / ".mbx" / "software" / "git").glob("lib-*/run.py"))) == 2 + len(probes)

    again = mbx(*args[:-1], env=cache_env)  # the table this time
    assert again.returncode == 0, again.stdout + again.stderr
    assert run_dirs(workspace) == before  # resumed from the store: nothing ran again
    assert f"first bad version: {shas[CULPRIT][:10]} turn full recompute on" in again.stdout
    assert "good end" in again.stdout and "bad end" in again.stdout


def test_bisect_refuses_ends_that_do_not_differ(tmp_path, mbx, write_campaign):
    """Ends whose step times are equal (a fake Megatron replaying one real log: exact times, no noise) are
    refused after their repeats, before any probe runs."""
    from conftest import FAKE_MEGATRON, MEGATRON_LOG

    command = [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0",
               "--fake-slowdown", "{env.SLOW}"]  # fmt: skip
    path = write_campaign({"name": "replayed", "trainer": {"kind": "command", "command": command, "steps": 15},
                           "env": {"values": {"SLOW": "1.0"}}, "wandb": {"mode": "disabled"},
                           "launchers": {"local": {"parallel": 2}}})  # fmt: skip
    done = mbx("bisect", str(path), "--key", "env.SLOW", "--values", "1.0,1.00,1.000", "-w", str(tmp_path / "ws"),
               "--min-effect", "40", "--repeats", "2", "--max-repeats", "8")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "refused: the ends do not differ" in done.stdout
    closing = [line for line in done.stdout.splitlines() if "refused:" in line]
    assert closing[0].startswith("FAIL refused: the ends do not differ"), closing  # one word, as every judge says
    assert len([p for p in (tmp_path / "ws").glob("replayed.bisect-*/*/*") if p.name.isdigit()]) == 2 * 2, (
        "the two ends, their first repeats only: no probe"
    )
    again = mbx("bisect", str(path), "--key", "env.SLOW", "--values", "1.0,1.00,1.000", "-w", str(tmp_path / "ws"),
                "--min-effect", "40", "--repeats", "2", "--max-repeats", "8", "--json", "--inconclusive-ok")  # fmt: skip
    assert again.returncode == 1, again.stdout + again.stderr  # from the store: nothing runs again
    result = json.loads(again.stdout)
    assert (result["verdict"], result["exit_code"]) == ("fail", 1)
    assert result["closing"] == closing[0].strip()  # --json carries the printed closing line


def test_bisect_bad_input(tmp_path, mbx, write_campaign):
    shas = make_repo(tmp_path / "lib")
    path = campaign(tmp_path, write_campaign)
    done = mbx("bisect", str(path), "--good", "no-such-ref", "--bad", shas[2], "-w", str(tmp_path / "ws"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "software.repos.lib.ref: 'no-such-ref' does not name a commit" in done.stderr
    done = mbx(
        "bisect", str(path), "--key", "software.pipx.foo", "--values", "1,2", "-w", str(tmp_path / "ws")
    )
    assert done.returncode == 2 and "software.pipx.foo" in done.stderr and "sweepable keys" in done.stderr
    done = mbx("bisect", str(path), "--good", shas[2], "--bad", shas[1], "-w", str(tmp_path / "ws"))
    assert done.returncode == 2 and "is not a descendant" in done.stderr
    assert not (tmp_path / "ws").exists()  # nothing ran, nothing written


def test_bisect_over_listed_values_markdown(tmp_path, mbx, write_campaign):
    """`--key env.SLOW --values ...`: a fake Megatron replays a real log, slowed from the fourth value on; the
    replayed step times are exact, so every decision is exact and fast."""
    from conftest import FAKE_MEGATRON, MEGATRON_LOG

    command = [sys.executable, str(FAKE_MEGATRON), "--replay", str(MEGATRON_LOG), "--sleep-s", "0",
               "--fake-slowdown", "{env.SLOW}"]  # fmt: skip
    path = write_campaign({"name": "replayed", "trainer": {"kind": "command", "command": command, "steps": 15},
                           "env": {"values": {"SLOW": "1.0"}}, "wandb": {"mode": "disabled"},
                           "launchers": {"local": {"parallel": 2}}})  # fmt: skip
    values = "1.0,1.00,1.000,1.5,1.50,1.500"
    done = mbx("bisect", str(path), "--key", "env.SLOW", "--values", values, "-w", str(tmp_path / "ws"),
               "--repeats", "2", "--markdown")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("### mbx bisect env.SLOW (6 versions, step time (ms))")
    assert "**first bad version: 1.5: step_time +50.00%" in done.stdout
    assert "| 3 | 1.5 | probe | 2 |" in done.stdout
