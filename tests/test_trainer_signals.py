"""The trainer stopped by SIGTERM (torchrun, a Slurm time limit or requeue) writes `failed`, however often srun
repeats the signal while the first one is being handled."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from trainer_helpers import ROOT, recipe_dict, status, trainer_env, write_recipe


def test_repeated_sigterm_is_a_failed_run_never_a_completed_one(tmp_path) -> None:
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path / "recipe.yaml", recipe_dict(**{"training.steps": 5000}))
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--recipe", str(recipe), "--out", str(out)],
                            cwd=ROOT, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        metrics_file = out / "metrics.jsonl"
        while time.time() < deadline and proc.poll() is None:
            if metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the trainer ended before it could be signalled"
        # the first SIGTERM raises; the burst lands while that failure is being handled and written
        for _ in range(200):
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    st = status(out)
    assert st["state"] == "failed" and st["reason"] == "SystemExit: terminated by signal SIGTERM", (st, output)
    assert st["steps_completed"] < st["steps_planned"] == 5000
    assert proc.returncode == 1, output
