"""Injection suite (issue 10): hostile strings in every field that can reach a job script or a command.

For every backend, field and payload the launcher either refuses the value (a ValueError: one line naming the
field, the value shortened) or renders it; what it rendered is then *executed*: every job script under bash,
every submit command as printed by a dry run under bash, the local backend's argv as `launch()` starts it,
with stub `srun`, `sbatch`, `scontrol` and `python3` first on PATH (they only record their argv). No marker
file may appear anywhere, every script must run to its end, and the values that reach `srun` must arrive as
one verbatim argument. Control characters must be refused wherever they would reach a script.

PAYLOADS and FIELDS are data: add a line to extend the suite. Derived values are covered through their sources:
job names and log paths (campaign name, cell id, workspace), run dirs (workspace, campaign, cell id).
`python tests/test_injection.py` runs the whole matrix and prints its size (the README's Reliability figures).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

if __name__ == "__main__":  # run as a script from anywhere: the checkout root is where imports start
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launchers import registry
from launchers.base import LaunchSpec, Rendered, Resources
from launchers.profile import SlurmProfile

MARKER = "MBXPWN"
PAYLOADS: dict[str, str] = {
    "subshell": f"$(touch {MARKER})",
    "backticks": f"`touch {MARKER}`",
    "semicolon": f";touch {MARKER};",
    "and": f"&& touch {MARKER};",
    "or": f"|| touch {MARKER};",
    "pipe": f"|touch {MARKER};",
    "quotes": "'\"",
    "quote_breakout": f"'\";touch {MARKER};'\"",
    "newline": f"\ntouch {MARKER}\n",
    "carriage_return": f"\rtouch {MARKER};",
    "nul": f"\0touch {MARKER};",
    "unicode": f"ünï-日本語-😀\u2028\u0085;touch {MARKER};",
    "very_long": ("x" * 250 + "/") * 12 + f"$(touch {MARKER})",  # 3 KB, folder-sized parts: a path too
}
CONTROL = {"newline", "carriage_return", "nul"}  # refused wherever they would reach a script

SLURM = ("submitit", "nemo-run")
ALL = (*SLURM, "local")
BASE_SETTINGS: dict[str, dict[str, Any]] = {"submitit": {}, "nemo-run": {}, "local": {"python": "python3"}}
STUBS = ("srun", "sbatch", "scontrol", "python3")
SUBMITIT_TASK = "# each task runs (a submitit.helpers.CommandFunction): "  # its argv, shlex-joined
END = "MBX-END-OF-CALL"


@dataclass(frozen=True)
class Case:
    """The inputs of one render: workspace folder name, the campaign's sections, one attempt's spec."""

    backend: str
    workspace: str = "ws"
    cluster: dict[str, Any] = field(default_factory=lambda: {"partition": "debug", "gpus": False})
    container: dict[str, Any] = field(
        default_factory=lambda: {"image": "nvcr.io#nvidia/pytorch:25.01-py3", "workdir": "/workspace",
                                 "mounts": ["/data:/data:ro"]}  # fmt: skip
    )
    settings: dict[str, Any] = field(default_factory=dict)
    campaign: str = "inj"
    cell_id: str = "c0ffee-r0"
    env: dict[str, str] = field(default_factory=lambda: {"NOTE": "hello"})
    env_pass: list[str] = field(default_factory=lambda: ["HF_TOKEN"])
    module: str | None = "trainer"
    args: list[str] = field(default_factory=lambda: ["--recipe", "recipe.yaml"])


def _cluster(key: str) -> Callable[[Case, str], Case]:
    return lambda c, v: replace(c, cluster={**c.cluster, key: v})


def _container(key: str, wrap: Callable[[str], Any]) -> Callable[[Case, str], Case]:
    return lambda c, v: replace(c, container={**c.container, key: wrap(v)})


def _setting(key: str, wrap: Callable[[str], Any] = lambda v: v, **more: Any) -> Callable[[Case, str], Case]:
    return lambda c, v: replace(c, settings={**c.settings, **more, key: wrap(v)})


@dataclass(frozen=True)
class Field:
    """One route into a script or command: how a campaign names it, how to plant a value, what must hold."""

    name: str
    plant: Callable[[Case, str], Case]
    backends: tuple[str, ...]
    mention: str  # a refusal must name this
    control_ok: bool = False  # newline/CR may pass (the value never reaches a script: task table, argv)
    arrives: Callable[[str], list[str]] | None = None  # srun arguments of which one must equal the value

    def value(self, payload: str) -> str:
        return payload


FIELDS: list[Field] = [
    Field("cluster.partition", _cluster("partition"), SLURM, "partition"),
    Field("cluster.account", _cluster("account"), SLURM, "account"),
    Field("cluster.qos", _cluster("qos"), SLURM, "qos"),
    Field("cluster.constraint", _cluster("constraint"), SLURM, "constraint"),
    Field("cluster.python", _cluster("python"), SLURM, "python", arrives=lambda v: [v]),
    Field("cluster.sbatch_extra (value)", lambda c, v: replace(c, cluster={**c.cluster, "sbatch_extra": {"comment": v}}),
          SLURM, "sbatch_extra"),
    Field("cluster.sbatch_extra (name)", lambda c, v: replace(c, cluster={**c.cluster, "sbatch_extra": {"x" + v: "1"}}),
          SLURM, "sbatch_extra"),
    Field("container.image", _container("image", lambda v: "img" + v), SLURM, "image",
          arrives=lambda v: ["img" + v, f"--container-image=img{v}"]),
    Field("container.mounts", _container("mounts", lambda v: ["/d" + v + ":/d"]), SLURM, "mounts"),
    Field("container.workdir", _container("workdir", lambda v: "/w" + v), SLURM, "workdir",
          arrives=lambda v: [f"--container-workdir=/w{v}"]),
    Field("launchers.<slurm>.srun_args", _setting("srun_args", lambda v: ["--comment=" + v]), SLURM, "srun_args",
          arrives=lambda v: ["--comment=" + v]),
    Field("launchers.<slurm>.mem", _setting("mem"), SLURM, "mem"),
    Field("launchers.submitit.wckey", _setting("wckey"), ("submitit",), "wckey"),
    Field("launchers.submitit.sbatch_parameters", _setting("sbatch_parameters", lambda v: {"comment": v}),
          ("submitit",), "sbatch_parameters"),
    Field("launchers.nemo-run.job_dir", _setting("job_dir", lambda v: "jd" + v), ("nemo-run",), "job_dir"),
    Field("launchers.nemo-run.host", _setting("host", lambda v: "h" + v, tunnel="ssh", user="u", job_dir="/j"),
          ("nemo-run",), "host"),
    Field("launchers.nemo-run.user", _setting("user", lambda v: "u" + v, tunnel="ssh", host="h", job_dir="/j"),
          ("nemo-run",), "user"),
    Field("launchers.nemo-run.identity",
          _setting("identity", lambda v: "/k" + v, tunnel="ssh", host="h", user="u", job_dir="/j"),
          ("nemo-run",), "identity"),
    Field("launchers.local.python", _setting("python", lambda v: "python3" + v), ("local",), "python"),
    Field("env.values (value)", lambda c, v: replace(c, env={"NOTE": v}), ALL, "env", control_ok=True),
    Field("env.values (name)", lambda c, v: replace(c, env={"N" + v: "1"}), ALL, "env"),
    Field("env.pass (name)", lambda c, v: replace(c, env_pass=["P" + v]), ALL, "env"),
    Field("campaign name", lambda c, v: replace(c, campaign="inj" + v), ALL, "campaign"),
    Field("cell id", lambda c, v: replace(c, cell_id="c0ffee" + v), ALL, "cell"),
    Field("--workspace", lambda c, v: replace(c, workspace="ws" + v), ALL, "workspace"),
    Field("trainer argument", lambda c, v: replace(c, args=["--x", v]), ALL, "argument", control_ok=True),
    Field("trainer module", lambda c, v: replace(c, module="trainer" + v), ALL, "module"),
]  # fmt: skip


# ---- running one case ------------------------------------------------------------------------------------
def make_stubs(folder: Path) -> Path:
    """`srun`, `sbatch`, `scontrol`, `python3` that append their argv (NUL-separated) to $MBX_STUB_LOG/<name>."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in STUBS:
        stub = folder / name
        stub.write_text(
            "#!/bin/sh\n"
            f'{{ printf \'%s\\0\' "$@"; printf \'{END}\\0\'; }} >> "$MBX_STUB_LOG/{name}"\n'
            + ('echo 4242\n' if name == "sbatch" else "")
            + "exit 0\n"
        )
        stub.chmod(0o755)
    return folder


def calls(log: Path, tool: str) -> list[list[str]]:
    """The argv of every call of a stub, in order."""
    path = log / tool
    if not path.exists():
        return []
    parts = path.read_bytes().decode().split("\0")
    out, current = [], []
    for part in parts[:-1]:
        if part == END:
            out.append(current)
            current = []
        else:
            current.append(part)
    return out


@dataclass
class Outcome:
    """What one case did: refused (with its message) or rendered and executed (problems found)."""

    refused: str | None = None
    problems: list[str] = field(default_factory=list)
    executed: Counter[str] = field(default_factory=Counter)  # job scripts, printed commands, argv run


def render(case: Case, root: Path) -> list[Rendered]:
    """Profile, backend and spec as the orchestrator builds them, then the backend's render()."""
    workspace = root / case.workspace
    profile = SlurmProfile.model_validate({"cluster": case.cluster, "container": case.container})
    settings = {**BASE_SETTINGS[case.backend], **case.settings}
    launcher = registry.get(case.backend)(settings, workspace, profile)
    run_dir = workspace / case.campaign / case.cell_id / "1"
    spec = LaunchSpec(campaign=case.campaign, cell_id=case.cell_id, attempt=1, run_dir=run_dir,
                      resources=Resources(1, 2, 30), module=case.module, args=list(case.args), env=dict(case.env),
                      env_pass=list(case.env_pass))  # fmt: skip
    return launcher.render([spec])


def refusal(err: Exception) -> str:
    """The message a user would see: pydantic errors as `key.path: message` lines, others as they are."""
    if isinstance(err, ValidationError):
        return "\n".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
    return str(err)


def execute(items: list[Rendered], backend: str, cwd: Path, env: dict[str, str]) -> tuple[list[str], Counter[str]]:
    """Write what was rendered (as submit() does), run every script and command; problems and what ran."""
    problems: list[str] = []
    count: Counter[str] = Counter()
    for item in items:
        for path, text in {**item.files, **item.scripts}.items():  # NeMo-Run writes its scripts itself
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        printed = item.describe()
        runs = [("job scripts", ["bash", str(path)]) for path in item.scripts]
        for text in item.scripts.values():  # submitit: the script starts submitit's entry, which runs this argv
            task = [line for line in text.split("\n") if line.startswith(SUBMITIT_TASK)]  # (as bash splits)
            runs += [("submitit tasks", shlex.split(line[len(SUBMITIT_TASK) :])) for line in task]
        for argv in item.commands:  # as a dry run prints them, for a user to paste into a shell
            assert "$ " + shlex.join(argv) in printed
            runs.append(("printed commands", ["bash", "-c", shlex.join(argv)]))
        if backend == "local":
            runs += [("local argv", argv) for argv in item.commands]  # launch() starts it itself, no shell
        for kind, argv in runs:
            count[kind] += 1
            try:
                done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
            except OSError as err:  # the local argv's interpreter does not exist: nothing ran
                if backend != "local":
                    problems.append(f"could not start {argv[0]!r}: {err}")
                continue
            except ValueError as err:  # a NUL in the argv: launch() would crash the same way
                problems.append(f"rendered a command no process can be started with: {err}")
                continue
            if done.returncode != 0 and not (backend == "local" and done.returncode in (126, 127)):  # no such python
                problems.append(f"{shlex.join(argv)[:200]} exited {done.returncode}: {done.stderr[-500:]}")
    return problems, count


def run_case(case: Case, fld: Field, payload: str, tmp: Path) -> Outcome:
    """Plant one payload in one field, render, and execute what was rendered."""
    tmp.mkdir(parents=True)
    stubs, log, cwd = make_stubs(tmp / "stubs"), tmp / "log", tmp / "cwd"
    log.mkdir()
    cwd.mkdir()
    outcome = Outcome()
    value = fld.value(payload)
    here = os.getcwd()
    os.chdir(cwd)  # a tool that runs a shell while rendering (NeMo-Run's mkdir) does it here
    try:
        items = render(fld.plant(case, value), tmp)
    except ValueError as err:
        outcome.refused = refusal(err)
        return outcome
    except Exception as err:  # noqa: BLE001 - a crash is a finding, not a refusal
        outcome.problems.append(f"crashed instead of refusing: {type(err).__name__}: {err}"[:500])
        return outcome
    finally:
        os.chdir(here)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp), "MBX_STUB_LOG": str(log), "LC_ALL": "C.UTF-8",
           "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1"}  # fmt: skip
    try:
        outcome.problems, outcome.executed = execute(items, case.backend, cwd, env)
    except (OSError, ValueError) as err:  # a rendered file that cannot be written (NUL or newline in its path)
        outcome.problems.append(f"rendered files submit() cannot write: {type(err).__name__}: {err}"[:300])
    if case.backend in SLURM:
        srun = calls(log, "srun")
        last = srun[-1] if srun else []
        if last[-2:] != ["--port-base", "20000"]:
            outcome.problems.append(f"the job's srun line was cut or split: {last[-6:]}")
        if fld.arrives and not set(fld.arrives(value)) & set(last):
            outcome.problems.append(f"{fld.name} did not reach srun as one verbatim argument: {last}"[:600])
    return outcome


def check(backend: str, fld: Field, name: str, outcome: Outcome, tmp: Path) -> list[str]:
    """Every way one case can fail the suite, as messages."""
    where = f"{backend}: {fld.name} <- {name}"
    found = [*tmp.rglob(MARKER), *[p for p in [Path.cwd() / MARKER] if p.exists()]]
    out = [f"{where}: INJECTED, marker at {p}" for p in found]
    out += [f"{where}: {p}" for p in outcome.problems]
    if outcome.refused is not None:
        msg = outcome.refused
        if "\n" in msg or "\r" in msg or "\0" in msg or len(msg) > 400 or fld.mention not in msg:
            out.append(f"{where}: refusal is not one clean line naming {fld.mention!r}: {msg[:300]!r}")
    elif name in CONTROL and not (fld.control_ok and name != "nul"):
        out.append(f"{where}: a control character was accepted")
    return out


def cases() -> list[tuple[str, Field]]:
    return [(backend, fld) for fld in FIELDS for backend in fld.backends]


def run_field(backend: str, fld: Field, tmp: Path, tally: Counter[str]) -> list[str]:
    failures = []
    for name, payload in PAYLOADS.items():
        case_dir = tmp / name
        outcome = run_case(Case(backend), fld, payload, case_dir)
        failures += check(backend, fld, name, outcome, case_dir)
        tally["cases"] += 1
        tally["refused" if outcome.refused is not None else "rendered"] += 1
        tally.update(outcome.executed)
        shutil.rmtree(case_dir, ignore_errors=True)
    return failures


def _needs(backend: str) -> None:
    if backend == "nemo-run":
        pytest.importorskip("nemo_run", reason="pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(("backend", "fld"), cases(), ids=[f"{b}-{f.name}" for b, f in cases()])
def test_no_injection(backend: str, fld: Field, tmp_path: Path) -> None:
    _needs(backend)
    tally: Counter[str] = Counter()
    failures = run_field(backend, fld, tmp_path, tally)
    assert not failures, "\n".join(failures)
    assert tally["rendered"] == 0 or tally["job scripts"] + tally["local argv"] > 0


def test_benign_values_render_and_run(tmp_path: Path) -> None:
    """The base case of every backend renders, runs to its end and reaches srun with the values as given."""
    for backend in ALL:
        if backend == "nemo-run" and shutil.which("bash") and not _has_nemo():
            continue
        outcome = run_case(Case(backend), FIELDS[0], "debug", tmp_path / backend)
        assert outcome.refused is None and not outcome.problems and sum(outcome.executed.values()) >= 1, (backend, outcome)


def test_shell_words_stay_one_verbatim_word() -> None:
    """shell_word (what NeMo-Run's srun line gets) leaves plain values as they are and quotes everything else."""
    from launchers.safety import is_plain, shell_word

    for plain in ("nvcr.io#nvidia/pytorch:25.01-py3", "/lustre/data:/data:ro", "--container-workdir=/workspace",
                  "python3", "ünï/日本語"):  # fmt: skip
        assert shell_word(plain) == plain and shlex.split(plain) == [plain]
    for name, payload in PAYLOADS.items():
        if name not in CONTROL:
            assert not is_plain(payload) and shlex.split(shell_word(payload)) == [payload], name
    assert not is_plain("#x") and not is_plain("~/x") and not is_plain("a b") and not is_plain("")


def test_plain_ssh_and_job_dir_settings_are_accepted() -> None:
    """Refusing what NeMo-Run writes unquoted does not refuse ordinary hosts, users, keys and folders."""
    pytest.importorskip("nemo_run", reason="pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)")
    from launchers.backends.nemo_run import NemoRunSettings

    settings = NemoRunSettings.model_validate({"tunnel": "ssh", "host": "login-01.cluster.example.org",
                                               "user": "first.last", "identity": "~/.ssh/id_ed25519",
                                               "job_dir": "/scratch/first.last/nemo-run"})  # fmt: skip
    assert settings.identity == "~/.ssh/id_ed25519"
    with pytest.raises(ValidationError, match="host"):
        NemoRunSettings.model_validate({"host": "login -oProxyCommand=x"})


def test_nemo_run_quoting_follows_nemo_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should NeMo-Run start quoting srun arguments itself (a real `noquote` class), values are passed as they are
    and still arrive verbatim: never quoted twice."""
    pytest.importorskip("nemo_run", reason="pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)")
    from nemo_run.core.execution import slurm

    class noquote(str):  # noqa: N801 - NeMo-Run's name
        pass

    monkeypatch.setattr(slurm, "noquote", noquote)
    fld = next(f for f in FIELDS if f.name == "container.image")
    for name in ("subshell", "quote_breakout", "unicode"):
        outcome = run_case(Case("nemo-run"), fld, PAYLOADS[name], tmp_path / name)
        assert outcome.refused is None and not outcome.problems, (name, outcome)
        assert not list((tmp_path / name).rglob(MARKER))


def _has_nemo() -> bool:
    import importlib.util

    return importlib.util.find_spec("nemo_run") is not None


def test_suite_covers_every_route() -> None:
    """The matrix stays as wide as the issue asks: payload kinds and the fields of every route."""
    assert {"subshell", "backticks", "semicolon", "and", "pipe", "quotes", "newline", "carriage_return", "nul",
            "unicode", "very_long"} <= set(PAYLOADS)  # fmt: skip
    names = {f.name for f in FIELDS}
    for route in ("cluster.partition", "cluster.python", "cluster.sbatch_extra (value)", "container.image",
                  "container.mounts", "container.workdir", "launchers.<slurm>.srun_args", "env.values (value)",
                  "env.values (name)", "campaign name", "cell id", "--workspace", "launchers.local.python"):  # fmt: skip
        assert route in names
    assert {b for b, _ in cases()} == set(ALL)


# ---- the same refusals through the real CLI (exit 2, one line, no traceback) ------------------------------
def _campaign(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    import yaml
    from conftest import ROOT

    data = yaml.safe_load((ROOT / "campaigns" / "quickstart.yaml").read_text())
    data.update({"sweep": {"axes": {"model.moe.top_k": [1]}}, "wandb": {"mode": "disabled"},
                 "cluster": {"gpus": False}, **changes})  # fmt: skip
    return data


@pytest.mark.parametrize(
    ("changes", "args", "says"),
    [
        ({"container": {"image": "img\ntouch MBXPWN"}}, ["validate"], "container.image"),
        ({"cluster": {"gpus": False, "partition": "p\rx"}}, ["validate"], "cluster.partition"),
        ({"launchers": {"submitit": {"srun_args": ["--x\n"]}}, "launcher": "submitit"}, ["run", "--dry-run"],
         "launchers.submitit.srun_args"),
        ({"launcher": "submitit"}, ["run", "--dry-run", "--workspace", "{tmp}/w\ntouch MBXPWN"], "workspace"),
    ],
    ids=["image-newline", "partition-cr", "srun-args-newline", "workspace-newline"],
)
def test_cli_refuses_with_one_line(tmp_path: Path, mbx, write_campaign, changes, args, says) -> None:
    file = write_campaign(_campaign(tmp_path, **changes))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--workspace" not in argv:
        argv += ["--workspace", str(tmp_path / "ws")]
    if argv[0] == "validate":
        argv = ["validate", str(file)]
    else:
        argv = [argv[0], str(file), *argv[1:]]
    result = mbx("campaign", *argv, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr + result.stdout and "Traceback" not in result.stderr, result.stderr
    assert not list(tmp_path.rglob(MARKER))


def test_cli_nemo_run_refuses_a_workspace_it_cannot_quote(tmp_path: Path, mbx, write_campaign) -> None:
    pytest.importorskip("nemo_run", reason="pip install 'mbx[nemo]' (nemo-run==0.11.1, leptonai==0.27.3)")
    file = write_campaign(_campaign(tmp_path, launcher="nemo-run"))
    workspace = tmp_path / "my runs $(touch MBXPWN)"
    result = mbx("campaign", "run", str(file), "--dry-run", "--workspace", str(workspace), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--workspace" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not list(tmp_path.rglob(MARKER))


def main() -> None:
    """Run the whole matrix outside pytest and print its size (for the README's Reliability section)."""
    import tempfile

    tally: Counter[str] = Counter()
    failures: list[str] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for index, (backend, fld) in enumerate(cases()):
            if backend == "nemo-run" and not _has_nemo():
                continue
            tally["fields"] += 1
            failures += run_field(backend, fld, Path(tmp) / str(index), tally)
    took = time.perf_counter() - start
    print(f"{tally['fields']} (backend, field) routes x {len(PAYLOADS)} payloads = {tally['cases']} cases: "
          f"{tally['refused']} refused, {tally['rendered']} rendered and executed ({tally['job scripts']} job "
          f"scripts and {tally['printed commands']} printed submit commands under bash, {tally['local argv']} "
          f"local argv); {len(failures)} failures; {took:.1f} s")  # fmt: skip
    for failure in failures:
        print(failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
