"""`mbx campaign validate` loads only what validating needs (issue 22): no Megatron log parsers, no memory model,
no launcher backend the campaign does not name, no command-kind code for a bundled campaign; every check runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PROBE = """
import json, sys
sys.argv = ["mbx", *{args!r}]
from orchestrator.cli.app import main
try:
    main()
except SystemExit as exit:
    code = exit.code
else:
    code = 0
print("MODULES:" + json.dumps([code, sorted(sys.modules)]))
"""
LAZY = (
    "reports.parsers", "reports.parsers.follow", "reports.parsers.megatron_lm", "reports.parsers.megatron_bridge",
    "trainer.memory", "orchestrator.trainers.kinds.command", "orchestrator.spec.command",
    "orchestrator.spec.megatron_layout", "launchers.slurm", "launchers.slurm.launcher",
    "reports.failures", "reports.wandb_log",  # the log signatures and the W&B logger: the schema needs their names only
)  # fmt: skip
BACKENDS = ("launchers.backends.local", "launchers.backends.submitit_slurm", "launchers.backends.nemo_run")


def validate(file: Path | str) -> tuple[int, str, set[str]]:
    """(exit code, stdout + stderr, modules loaded) of `mbx campaign validate FILE` in a fresh interpreter."""
    argv = ["campaign", "validate", str(file)]
    done = subprocess.run([sys.executable, "-c", PROBE.format(args=argv)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    head, _, tail = done.stdout.rpartition("MODULES:")
    code, modules = json.loads(tail)
    return code, head + done.stderr, set(modules)


def test_quickstart_validates_without_parsers_memory_or_other_backends():
    code, out, modules = validate("campaigns/quickstart.yaml")
    assert code == 0 and "4 cell(s)" in out, out
    assert sorted(modules & {*LAZY, *BACKENDS}) == ["launchers.backends.local"]  # its `launchers.local` section


def test_a_named_backends_settings_are_still_checked_and_only_its_module_loads(tmp_path):
    text = (ROOT / "campaigns/quickstart.yaml").read_text().replace("launcher: local", "launcher: locl")
    file = tmp_path / "c.yaml"
    file.write_text(text.replace("  local:\n    parallel: 2", "  submitit:\n    partiton: gpu"))
    code, out, modules = validate(file)
    assert code == 2, out
    assert "launcher: no such launcher 'locl'; known: local, nemo-run, nemo-run-local, submitit" in out
    assert "launchers.submitit.partiton: unknown key" in out
    assert sorted(modules & set(BACKENDS)) == ["launchers.backends.submitit_slurm"]
    assert "Traceback" not in out


def test_every_backend_module_is_listed_under_the_name_it_registers():
    from launchers import registry
    from launchers.backends import MODULES

    for name, module in MODULES.items():
        assert registry.get(name).__module__ == f"launchers.backends.{module}"
    assert sorted(registry.backends()) == registry.names() == sorted(MODULES)
