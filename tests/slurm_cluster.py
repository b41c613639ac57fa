"""A real one-node Slurm (munged + slurmctld + slurmd) in a temp dir, as a session fixture `slurm`."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "scontrol")
INSTALL_HINT = "apt-get install slurm-wlm munge (Debian; .ci/run does it)"


@dataclass
class SlurmCluster:
    """A running local cluster: its config file, the environment that points Slurm commands at it."""

    root: Path
    conf: Path
    partition: str = "debug"
    cpus: int = 6
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """Variables a process needs to talk to this cluster (merge into os.environ for subprocesses)."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.env}
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=check, timeout=timeout)

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until no job of this cluster is queued or running (cancels nothing)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = self.run("squeue", "-h", "-o", "%i %T", check=False).stdout.split("\n")
            if not [line for line in out if line.strip() and "COMPLET" not in line]:
                return
            time.sleep(0.5)
        raise TimeoutError("jobs still queued or running: " + " ".join(out))

    def campaign(self, name: str, steps: int = 14, **overrides: object) -> dict:
        """A small quickstart campaign for this cluster (see quickstart_campaign)."""
        return quickstart_campaign(name, steps, **overrides)

    def campaign_in_background(self, file: Path, workspace: Path, env: dict[str, str],
                               launcher: str = "submitit") -> contextlib.AbstractContextManager[subprocess.Popen]:
        """`mbx campaign run FILE` against this cluster as a separate process (see campaign_in_background)."""
        return campaign_in_background(file, workspace, {**self.env, **env}, launcher)

    @contextlib.contextmanager
    def partition_down(self) -> Iterator[None]:
        """The partition DOWN while the block runs: jobs submitted meanwhile queue (reason PartitionDown) and
        start only after it, so a test can act between a submission and the job's start on a machine of any
        speed, instead of racing a job that might already have finished."""
        self.run("scontrol", "update", f"PartitionName={self.partition}", "State=DOWN")
        try:
            yield
        finally:
            self.run("scontrol", "update", f"PartitionName={self.partition}", "State=UP")

    def cancel_all(self) -> None:
        self.run("scancel", "--user", getpass.getuser(), check=False)


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _slurm_conf(root: Path, user: str, cpus: int, partition: str, munge_socket: Path) -> str:
    return f"""\
ClusterName=mbxtest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
KillWait=5
MinJobAge=600
InactiveLimit=0
MessageTimeout=10
MaxArraySize=4001
MaxJobCount=20000
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=8000 State=UNKNOWN
PartitionName={partition} Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def start_cluster(root: Path, cpus: int = 6, partition: str = "debug", timeout: float = 60) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under `root` (own key, socket, ports, state); wait until the node is idle.

    `cpus` is what slurm.conf declares (config_overrides lets it exceed the real cores), so a few tiny jobs run
    side by side on a 2-core machine.
    """
    root = Path(root)
    for sub in ("state", "spool", "log", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "munge", 0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    munge_socket = root / "munge" / "munge.socket"
    conf = root / "slurm.conf"
    user = getpass.getuser()
    conf.write_text(_slurm_conf(root, user, cpus, partition, munge_socket))
    cluster = SlurmCluster(root=root, conf=conf, partition=partition, cpus=cpus)
    env = {**os.environ, **cluster.env}
    log = (root / "log" / "daemons.out").open("ab")
    munge = [
        _binary("munged"), "--foreground", "--force", f"--socket={munge_socket}", f"--key-file={key}",
        f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/log/munged.log",
        f"--seed-file={root}/munge/munged.seed",
    ]  # fmt: skip
    try:
        cluster.processes.append(subprocess.Popen(munge, stdout=log, stderr=log, env=env))
        _wait_for(lambda: munge_socket.exists(), timeout, "munged socket", cluster)
        ctld = [_binary("slurmctld"), "-D", "-i", "-f", str(conf)]
        cluster.processes.append(subprocess.Popen(ctld, stdout=log, stderr=log, env=env))
        _wait_for(lambda: cluster.run("scontrol", "ping", check=False).stdout.count("UP") > 0, timeout,
                  "slurmctld", cluster)  # fmt: skip
        slurmd = [_binary("slurmd"), "-D", "-N", "localhost", "-f", str(conf)]
        cluster.processes.append(subprocess.Popen(slurmd, stdout=log, stderr=log, env=env))
        _wait_for(lambda: _node_ready(cluster), timeout, "slurmd (node idle)", cluster)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def _node_ready(cluster: SlurmCluster) -> bool:
    out = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
    return out in ("idle", "mixed", "allocated")


def _wait_for(predicate, timeout: float, what: str, cluster: SlurmCluster) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for proc in cluster.processes:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}; see {cluster.root}/log/")
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s; see {cluster.root}/log/")


def stop_cluster(cluster: SlurmCluster) -> None:
    """Cancel every job, then stop slurmd, slurmctld and munged (the processes this module started)."""
    if len(cluster.processes) >= 2:
        cluster.cancel_all()
        deadline = time.time() + 15
        while time.time() < deadline and cluster.run("squeue", "-h", check=False).stdout.strip():
            time.sleep(0.5)
    for proc in reversed(cluster.processes):
        stop_process(proc, grace_s=15)
    cluster.processes.clear()


def stop_process(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL after `grace_s` if it is still there."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real one-node Slurm for the whole test session; SLURM_CONF is set in os.environ while it runs."""
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}): {INSTALL_HINT}")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm runs slurmd, which needs root (CI and the dev machines are root)")
    root = Path(tmp_path_factory.mktemp("slurm", numbered=True))
    cluster = start_cluster(root)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        stop_cluster(cluster)


def quickstart_campaign(name: str, steps: int = 14, **overrides: object) -> dict:
    """campaigns/quickstart.yaml made small for the Slurm tests: 2 points (top-k 1, 2), 2 ranks each, gloo on CPU."""
    import sys

    data = yaml.safe_load((ROOT / "campaigns" / "quickstart.yaml").read_text())
    data["name"] = name
    data["trainer"]["recipe"]["training"]["steps"] = steps
    data["resources"] = {"nodes": 1, "gpus_per_node": 2}
    data["sweep"] = {"axes": {"model.moe.top_k": [1, 2]}}
    data["cluster"] = {"gpus": False, "python": sys.executable}
    data["launchers"] = {"submitit": {"poll_interval_s": 1, "poll_max_interval_s": 4},
                         "nemo-run": {"poll_interval_s": 1, "poll_max_interval_s": 4}}  # fmt: skip
    data["wandb"] = {"mode": "disabled"}
    data.update(overrides)
    return data


@contextlib.contextmanager
def campaign_in_background(file: Path, workspace: Path, env: dict[str, str], launcher: str = "submitit"
                           ) -> Iterator[subprocess.Popen]:
    """`mbx campaign run FILE` as a separate process (stdout+stderr piped); Ctrl-C'ed on the way out if still alive."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "campaign", "run", str(file), "--launcher", launcher,
         "--workspace", str(workspace)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONFAULTHANDLER": "1", **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            interrupt(proc, timeout=30)


def interrupt(proc: subprocess.Popen, timeout: float = 60) -> int:
    """Ctrl-C a background `mbx` and return its exit code. One that does not exit in `timeout` is aborted
    (SIGABRT: PYTHONFAULTHANDLER prints where every thread stood) and the test fails with that output."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        output = proc.communicate(timeout=30)[0] or ""
        raise AssertionError(f"mbx did not exit {timeout:.0f} s after Ctrl-C; its output:\n{output[-6000:]}") from None
