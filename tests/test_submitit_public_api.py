"""The submitit backend uses submitit's public API only (issue 22): no private import or attribute, the sbatch
parameter names mbx accepts are the ones submitit's executor accepts, and job states come through submitit's
job objects and watcher, with squeue where its sacct cannot answer (a real Slurm without accounting)."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from launchers.backends import submitit_slurm
from launchers.backends.submitit_slurm import SUBMITIT_PARAMETERS, SubmititQuery, sacct_word

pytest_plugins = ["slurm_cluster"]
ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = sorted((ROOT / "launchers").rglob("*.py"))


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_private_names() -> set[str]:
    """Underscore names mbx itself defines in launchers/ (functions, methods, attributes it assigns)."""
    names: set[str] = set()
    for path in LAUNCHERS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and private(node.attr):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and private(node.id):
                names.add(node.id)
    return names


def submitit_uses(path: Path, own: set[str]) -> list[str]:
    """Private submitit names a module imports or reads (`_x` attributes it does not define itself)."""
    tree = ast.parse(path.read_text())
    found = []
    imports_submitit = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "submitit":
            imports_submitit = True
            parts = [*node.module.split("."), *(alias.name for alias in node.names)]
            found += [f"{path.name}:{node.lineno} from {node.module} import {a.name}" for a in node.names
                      if any(private(p) for p in parts)]  # fmt: skip
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "submitit":
                    imports_submitit = True
                    if any(private(p) for p in alias.name.split(".")):
                        found.append(f"{path.name}:{node.lineno} import {alias.name}")
    if imports_submitit:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in own:
                found.append(f"{path.name}:{node.lineno} reads .{node.attr}")
    return found


def test_launchers_use_no_private_submitit_name() -> None:
    """Fails on the old backend: it imported submitit.slurm.slurm._make_sbatch_string / _get_default_parameters."""
    own = own_private_names()
    found = [use for path in LAUNCHERS for use in submitit_uses(path, own)]
    assert found == []
    assert "import submitit" in Path(submitit_slurm.__file__).read_text()


def test_the_check_catches_a_private_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import submitit\nfrom submitit.slurm.slurm import _make_sbatch_string\n"
                   "def f(ex):\n    return ex._submit_command('x'), submitit.SlurmJob.watcher._registered\n")  # fmt: skip
    assert len(submitit_uses(bad, own_private_names())) == 3


@pytest.mark.skipif(shutil.which("srun") is None, reason="SlurmExecutor needs srun on PATH (slurm-wlm)")
def test_sbatch_parameter_names_are_the_executors(tmp_path: Path) -> None:
    """mbx validates `sbatch_parameters` against its list of submitit's names; submitit's own executor refuses
    an unknown one with the list of valid ones (its public error): both lists are the same."""
    import submitit

    executor = submitit.SlurmExecutor(folder=tmp_path)
    with pytest.raises(ValueError, match="Unavailable parameter") as err:
        executor.update_parameters(not_a_parameter=1)
    valid = set(re.findall(r"^\s+- (\w+) \(default", str(err.value), re.MULTILINE))
    assert valid == set(SUBMITIT_PARAMETERS)


def test_sacct_state_words() -> None:
    assert sacct_word("CANCELLED by 0") == ("CANCELLED", "by 0")
    assert sacct_word("COMPLETED+") == ("COMPLETED", "")
    assert sacct_word("") == ("UNKNOWN", "")


@pytest.mark.slurm
def test_states_through_submitit_then_squeue(slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the local Slurm (no accounting): the query asks submitit's watcher (its sacct fails, submitit only
    logs it), gets the state from squeue, and after 3 silent rounds stops asking the watcher."""
    import submitit

    for name, value in slurm.env.items():  # Slurm commands of this process (submitit's sacct too) reach it
        monkeypatch.setenv(name, value)
    out = slurm.run("sbatch", "--parsable", "--job-name=mbx-watch", f"--output={tmp_path}/out",
                    "--wrap", "sleep 30")  # fmt: skip
    job_id = out.stdout.strip().split(";")[0]
    try:
        query = SubmititQuery(min_interval_s=0.01, max_interval_s=0.01)
        query.adopt(job_id, tmp_path)
        assert isinstance(query.jobs[job_id], submitit.SlurmJob)
        watcher = submitit.SlurmJob.watcher
        before, rounds = watcher.num_calls, 0
        while query.sacct_enabled and rounds < 10:
            query.refresh([job_id], force=True)
            rounds += 1
        assert rounds == 3 and watcher.num_calls == before + 3, "asked the watcher until it stayed silent"
        assert query.states[job_id].source == "squeue" and query.states[job_id].state in ("PENDING", "RUNNING")
        query.refresh([job_id], force=True)
        assert watcher.num_calls == before + 3, "the watcher is no longer asked"
    finally:
        slurm.run("scancel", job_id, check=False)
