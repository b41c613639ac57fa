"""The quickstart campaign through NeMo-Run over a real SSH tunnel: run.SlurmExecutor + run.SSHTunnel to a private
sshd on 127.0.0.1 (own port, host key, user key, config, all in a temp dir), sbatch on the real one-node Slurm."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest_plugins = ["slurm_cluster"]
pytestmark = pytest.mark.slurm

SECRET = "nemo-ssh-s3cr3t"
# NeMo-Run's SSH path needs the client binaries too: Experiment.run rsyncs the experiment dir over `ssh`
NEEDED = {"sshd": "openssh-server", "ssh-keygen": "openssh-client", "ssh": "openssh-client", "rsync": "rsync"}


def _which(name: str) -> str | None:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    return str(Path(found).resolve()) if found else None  # sshd re-execs itself: it needs an absolute path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Sshd:
    """A private sshd on 127.0.0.1:port that lets `user` in with the key `identity` (and nothing else)."""

    port: int
    user: str
    identity: Path  # private key, authorized through the temp dir's authorized_keys
    fingerprint: str
    log: Path  # sshd -E
    commands: Path  # every command run through it, one per line (the ForceCommand wrapper writes it)
    client_bin: Path  # a dir with an `ssh` for rsync: this host key only, strict checking, no user config


def _sshd_config(root: Path, port: int, env: dict[str, str]) -> str:
    # The remote side's environment: sshd passes nothing of ours (not SLURM_CONF), and the client side cannot
    # help (NeMo-Run's SSHTunnel sends no env, and sshd would drop it without AcceptEnv). sshd_config `SetEnv`
    # (OpenSSH >= 8.7) sets it for every session of this sshd only, with no file in anyone's home and without
    # PermitUserEnvironment (which reads ~/.ssh/environment, outside the temp dir). It is what a login node's
    # profile does for real users: SLURM_CONF points sbatch/squeue at the test cluster, MBX_CACHE_DIR keeps the
    # ranks' JIT caches in the temp dir, and TEST_SECRET is a value that only the login node has.
    set_env = " ".join(f"{k}={v}" for k, v in env.items())
    return f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {root}/host_ed25519
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
# the keys live under /tmp, which StrictModes (group/world-writable parents) refuses
StrictModes no
X11Forwarding no
AllowTcpForwarding no
PrintMotd no
Subsystem sftp {_which("sftp-server") or "/usr/lib/openssh/sftp-server"}
ForceCommand {root}/logged-command
SetEnv {set_env}
LogLevel VERBOSE
"""


# Runs in place of each client command (ForceCommand): logs it, then runs it as sshd would have ($SHELL -c).
LOGGED_COMMAND = """\
#!/bin/sh
printf '%s\\n' "$SSH_ORIGINAL_COMMAND" >> {commands}
if [ "$SSH_ORIGINAL_COMMAND" = sftp ] || [ "$SSH_ORIGINAL_COMMAND" = internal-sftp ]; then
  exec {sftp}
fi
exec "${{SHELL:-/bin/sh}}" -c "$SSH_ORIGINAL_COMMAND"
"""


@pytest.fixture
def sshd(slurm, tmp_path: Path) -> Iterator[Sshd]:
    """sshd as a subprocess (not a service) with everything under tmp_path; killed at teardown."""
    missing = [f"{name} ({package})" for name, package in NEEDED.items() if _which(name) is None]
    if missing:
        pytest.skip(f"the SSH tunnel test needs {', '.join(missing)}: apt-get install openssh-server rsync "
                    "(.ci/run does it)")  # fmt: skip
    root = tmp_path / "sshd"
    root.mkdir()
    keygen = _which("ssh-keygen")
    for name in ("host_ed25519", "id_ed25519"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"mbx-test-{name}", "-f", str(root / name)],
                       check=True, capture_output=True, timeout=30)  # fmt: skip
    (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())
    fingerprint = subprocess.run([keygen, "-l", "-f", str(root / "id_ed25519.pub")], check=True,
                                 capture_output=True, text=True, timeout=30).stdout.split()[1]  # fmt: skip
    commands = root / "commands.log"
    sftp = _which("sftp-server") or "/usr/lib/openssh/sftp-server"
    wrapper = root / "logged-command"
    wrapper.write_text(LOGGED_COMMAND.format(commands=commands, sftp=sftp))
    wrapper.chmod(0o755)
    port = _free_port()
    env = {"SLURM_CONF": str(slurm.conf), "MBX_CACHE_DIR": str(tmp_path / "cache"), "TEST_SECRET": SECRET}
    config = root / "sshd_config"
    config.write_text(_sshd_config(root, port, env))

    # rsync runs the `ssh` client (NeMo-Run gives it -i KEY -p PORT, with strict host key checking): this one trusts
    # exactly our host key and reads no ~/.ssh or /etc/ssh config. It is on mbx's PATH only.
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {(root / 'host_ed25519.pub').read_text()}")
    (root / "ssh_config").write_text(f"""\
Host *
  UserKnownHostsFile {root}/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  IdentitiesOnly yes
""")  # fmt: skip
    client_bin = root / "bin"
    client_bin.mkdir()
    (client_bin / "ssh").write_text(f'#!/bin/sh\nexec {_which("ssh")} -F {root}/ssh_config "$@"\n')
    (client_bin / "ssh").chmod(0o755)

    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # sshd's privilege separation dir
    log = root / "sshd.log"
    out = (root / "sshd.out").open("wb")
    proc = subprocess.Popen([_which("sshd"), "-D", "-E", str(log), "-f", str(config)], stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.time() + 20
        while "Server listening on 127.0.0.1" not in (log.read_text() if log.exists() else ""):
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {proc.returncode}: {(root / 'sshd.out').read_text()}"
                                   f"{log.read_text() if log.exists() else ''}")  # fmt: skip
            if time.time() > deadline:
                raise TimeoutError(f"sshd not listening after 20 s; see {log}")
            time.sleep(0.1)
        yield Sshd(port, getpass.getuser(), root / "id_ed25519", fingerprint, log, commands, client_bin)
    finally:
        from slurm_cluster import stop_process  # the plugin module, imported by pytest by now

        stop_process(proc)
        out.close()


def test_quickstart_through_nemo_run_ssh_tunnel(
    slurm, sshd: Sshd, mbx, tmp_path: Path, cache_env: dict[str, str], write_campaign
) -> None:
    pytest.importorskip("nemo_run", reason="NeMo-Run is optional: pip install 'mbx[nemo]'")
    workspace = tmp_path / "ws"
    job_dir = tmp_path / "login-node-jobs"  # NeMo-Run's remote job_dir: only rsync over SSH writes there
    data = slurm.campaign("qs-nemo-ssh", env={"pass": ["TEST_SECRET"]})
    # fabric's host shorthand carries the port ("host:port"); mbx's settings have no port field of their own
    data["launchers"]["nemo-run"].update(tunnel="ssh", host=f"127.0.0.1:{sshd.port}", user=sshd.user,
                                         identity=str(sshd.identity), job_dir=str(job_dir))  # fmt: skip
    file = write_campaign(data)
    path = os.pathsep.join([str(sshd.client_bin), os.environ["PATH"]])
    # no SLURM_CONF here: everything Slurm is asked, it is asked over SSH (where sshd's SetEnv provides it)
    env = {
        **cache_env,
        "PATH": path,
        "TEST_SECRET": SECRET,
        "SLURM_CONF": "/nonexistent/slurm.conf",
        "NEMORUN_HOME": str(tmp_path / "nemo-run-home"),
    }  # its job list (.slurm_jobs) stays out of ~/.nemo_run

    result = mbx("campaign", "run", str(file), "--launcher", "nemo-run", "--workspace", str(workspace), env=env,
                 timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr + sshd.log.read_text()
    assert "PASS 2/2 completed" in result.stdout, result.stdout

    db = sqlite3.connect(workspace / "mbx.sqlite")
    rows = db.execute("SELECT cell_id, attempt, state, job_id, job_info_json, run_dir FROM attempts "
                      "WHERE campaign='qs-nemo-ssh'").fetchall()  # fmt: skip
    assert len(rows) == 2 and {r[2] for r in rows} == {"completed"} and {r[1] for r in rows} == {1}
    assert all(r[3].isdigit() for r in rows) and len({r[3] for r in rows}) == 2, "one sbatch job per task"
    assert len({json.loads(r[4])["experiment"] for r in rows}) == 1, "one Experiment per submission batch"

    # submitted over SSH: our key logged in, and every sbatch ran through sshd on a script that rsync put in job_dir
    log = sshd.log.read_text()
    assert f"Accepted publickey for {sshd.user} from 127.0.0.1" in log and sshd.fingerprint in log, log
    commands = sshd.commands.read_text().splitlines()
    assert any(c.startswith("rsync --server") for c in commands), commands
    assert any(c.startswith("squeue ") or c.startswith("sacct ") for c in commands), "polled over SSH too"
    for cell_id, _, _, job_id, info_json, run_dir in rows:
        info = json.loads(info_json)
        remote = Path(info["argv"][-1])
        assert remote.is_relative_to(job_dir) and remote.name.startswith(cell_id), info["argv"]
        assert f"sbatch --requeue --parsable {remote}" in commands, commands
        assert remote.read_text() == Path(info["script"]).read_text(), "rsync copied the rendered script"
        run = workspace / run_dir  # the store keeps it relative to the workspace
        status = json.loads((run / "status.json").read_text())
        assert status["state"] == "completed" and status["world_size"] == 2, status
        assert (run / "logs" / "rank-1.log").exists()
        launch = json.loads((run / "launch.json").read_text())
        node = json.loads((run / "node.json").read_text())
        assert launch["launcher"] == "nemo-run" and node["job"]["slurm"]["SLURM_JOB_ID"] == job_id

    # the secret (on both sides) is passed by name only: no file of the run, the job dir or the SSH log has it
    for path in [*workspace.rglob("*"), *job_dir.rglob("*"), sshd.commands, sshd.log]:
        if path.is_file() and path.suffix != ".sqlite":
            assert SECRET not in path.read_text(errors="replace"), path
    assert (workspace / "qs-nemo-ssh" / "report" / "index.html").exists()
