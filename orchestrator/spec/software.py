"""Software versions per point: a git ref of a repository on disk (a worktree per ref), pip pins (an overlay per
pin set) and container images, addressable as sweep axes and bisected by `mbx bisect`.

Expansion (`point_software`) resolves each point's refs to full SHAs and records them in the point's env, so the
cell id names the commit, not the ref: `MBX_SOFTWARE_<NAME>_SHA`, the pins as `MBX_PIP_PINS`, a swept image as
`MBX_CONTAINER_IMAGE`. Where the repository and the pip options live (`MBX_SOFTWARE_<NAME>_REPO`,
`MBX_PIP_ARGS`) is recorded too but is no part of the identity. At launch (`launch_env`) the paths under
`<workspace>/.mbx/software/` are added (`MBX_SOFTWARE_<NAME>`, PYTHONPATH); the worktrees and overlays are
built (`ensure_built`) when an attempt's inputs are written, never at validation or in a dry run: built
once, under a lock, with a marker written last so a half-built one is built again.

These env names are reserved (orchestrator/spec/reserved_env.py): only `SoftwareResolver` writes them, from the
checked `software:` section. What acts on them checks them again (`checked_builds`): a repo name and a full
hex SHA are the only parts of a worktree's path, pins are `PACKAGE==VERSION` as `software.pip` allows them,
pip options come from an allowlist (`check_pip_args`: no requirement, file or editable can ride along), and a
half-built directory is removed only through orchestrator/owned_dirs.py (inside `.mbx/software/`, marked).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from launchers.profile import IMAGE_ENV
from launchers.safety import control_problem, refuse_control, shown
from orchestrator.errors import ConfigError
from orchestrator.owned_dirs import NotOwned, make_owned_dir, mark_owned, remove_owned_dir

NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
PACKAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")
SHA_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a full git object name (SHA-1 or SHA-256)
# pip options software.pip_args may hold: switches, and options taking one value (the next item, or `--opt=v`).
PIP_SWITCHES = frozenset({
    "--no-index", "--pre", "--prefer-binary", "--no-cache-dir", "--no-build-isolation", "--use-pep517",
    "--ignore-requires-python", "--no-compile", "--force-reinstall", "--upgrade", "-U", "--isolated",
    "--quiet", "-q", "--verbose", "-v",
})  # fmt: skip
PIP_VALUED = frozenset({
    "--find-links", "-f", "--index-url", "-i", "--extra-index-url", "--trusted-host", "--platform",
    "--python-version", "--implementation", "--abi", "--only-binary", "--no-binary", "--timeout", "--retries",
    "--cert", "--client-cert", "--proxy", "--progress-bar",
})  # fmt: skip
SHA_SUFFIX, REPO_SUFFIX, PREFIX = "_SHA", "_REPO", "MBX_SOFTWARE_"
PIP_PINS, PIP_ARGS, IMAGE = "MBX_PIP_PINS", "MBX_PIP_ARGS", IMAGE_ENV
NOT_IDENTITY_SUFFIXES = (REPO_SUFFIX,)  # where things live: no part of what runs
MARKER = ".mbx-built"
SWEEP_KEYS = ("software.repos.NAME.ref", "software.pip.PACKAGE", "container.image")


class BuildError(OSError):
    """A worktree or overlay could not be built (an OSError: the engine fails that attempt with the reason)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GitRepo(_Strict):
    """A git repository on disk: every point gets a worktree of `ref`, resolved to a full SHA at expansion."""

    path: str = Field(..., description="The repository (relative to the campaign file, or absolute).")
    ref: str = Field(
        "HEAD",
        description="Branch, tag or commit; sweep `software.repos.NAME.ref` to vary it (the cell id names the SHA).",
    )
    pythonpath: bool = Field(
        False,
        description="Prepend the worktree to the trainer's PYTHONPATH (e.g. a Python package checkout).",
    )

    @field_validator("path", "ref")
    @classmethod
    def _no_control(cls, value: str) -> str:
        return refuse_control(value)


class Software(_Strict):
    """The `software:` section: git refs (a worktree per ref) and pip pins (an overlay per pin set) per point.

    The trainer sees a repo's worktree as $MBX_SOFTWARE_<NAME> (a command trainer's argv also as
    `{software.NAME}`) and its SHA as $MBX_SOFTWARE_<NAME>_SHA; the pip overlay is prepended to PYTHONPATH.
    Sweep keys: software.repos.NAME.ref, software.pip.PACKAGE, container.image (Slurm launchers only).
    Worktrees and overlays are built under <workspace>/.mbx/software/ before the first attempt that needs
    them, once, and reused by later runs (`mbx bisect` too)."""

    repos: dict[str, GitRepo] = Field(
        default_factory=dict,
        description="NAME → {path, ref, pythonpath}: a worktree per distinct SHA ($MBX_SOFTWARE_<NAME>).",
    )
    pip: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "PACKAGE → VERSION pins installed with `pip install --target OVERLAY --no-deps` (one overlay per "
            "distinct pin set, prepended to PYTHONPATH); sweep software.pip.PACKAGE to vary one."
        ),
    )
    pip_args: list[str] = Field(
        default_factory=list,
        description=(
            "Extra pip arguments, e.g. [--no-index, --find-links, wheels/] (a relative --find-links directory "
            "is taken relative to the campaign file)."
        ),
    )

    @field_validator("repos")
    @classmethod
    def _repo_names(cls, repos: dict[str, GitRepo]) -> dict[str, GitRepo]:
        for name in repos:
            if not NAME_RE.fullmatch(name):
                raise ValueError(f"{name!r} is not a repo name (a letter, then letters, digits and _)")
        return repos

    @field_validator("pip")
    @classmethod
    def _pins(cls, pins: dict[str, Any]) -> dict[str, str]:
        return {check_package(name): check_version(name, version) for name, version in pins.items()}

    @field_validator("pip_args")
    @classmethod
    def _pip_args(cls, args: list[str]) -> list[str]:
        return check_pip_args(args)


def check_package(name: str) -> str:
    if not PACKAGE_RE.fullmatch(str(name)):
        raise ValueError(f"{name!r} is not a pip package name (letters, digits, . _ -)")
    return str(name)


def check_version(name: str, version: Any) -> str:
    text = str(version)
    if isinstance(version, bool) or not VERSION_RE.fullmatch(text):
        raise ValueError(f"pip pin {name}: {shown(text)} is not a version (e.g. 1.2.3)")
    return text


def check_pin(spec: str) -> str:
    """One `PACKAGE==VERSION` pin as the overlay installs it, checked as `software.pip` checks its entries."""
    name, sep, version = str(spec).partition("==")
    if not sep:
        raise ValueError(f"pip pin {shown(spec)} is not PACKAGE==VERSION")
    return f"{check_package(name)}=={check_version(name, version)}"


def check_pip_args(args: list[Any]) -> list[str]:
    """pip options from the allowlist (PIP_SWITCHES, PIP_VALUED with one value each), no control character: no
    requirement, requirements file, constraint or editable install can be added beside the checked pins."""
    allowed = f"allowed: {', '.join(sorted(PIP_SWITCHES | PIP_VALUED))}; packages go under software.pip"
    out, expect_value, at = [], None, 0
    for index, arg in enumerate(args):
        text = str(arg)
        if problem := control_problem(text):
            raise ValueError(f"item {index}: {problem}")
        if expect_value is not None:
            if not text or text.startswith("-"):
                raise ValueError(f"item {index}: {expect_value} needs a value, got {shown(text)}")
            expect_value = None
        elif text in PIP_SWITCHES:
            pass
        elif text in PIP_VALUED:
            expect_value, at = text, index
        elif not (text.startswith("--") and text.partition("=")[0] in PIP_VALUED and text.partition("=")[2]):
            raise ValueError(f"item {index}: {shown(text)} is not an allowed pip option ({allowed})")
        out.append(text)
    if expect_value is not None:
        raise ValueError(f"item {at}: {expect_value} needs a value (it is the last item)")
    return out


LOCAL_SOURCES = ("--find-links", "-f", "--no-index", "--no-build-isolation")
# the options that name where pip looks for packages
LOCATION_OPTIONS = ("--find-links", "-f", "--index-url", "-i", "--extra-index-url")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)  # URL schemes are case-insensitive (FILE://)


def _locations(args: list[str]) -> list[str]:
    """The values of pip's location options, given as `--opt VALUE` or `--opt=VALUE`."""
    found = [args[i + 1] for i, a in enumerate(args[:-1]) if a in LOCATION_OPTIONS]
    return found + [a.partition("=")[2] for a in args if a.partition("=")[0] in LOCATION_OPTIONS and "=" in a]


def is_local_location(location: str) -> bool:
    """A directory or a file:// URL (any case), where pip may find source packages; not http(s)."""
    return not _SCHEME.match(location) or location.lower().startswith("file://")


def local_source_notes(software: Software) -> list[str]:
    """What a plan says of pip options that install from local sources (allowed, but a source package found there
    runs its own build script, setup.py or a build backend, where the overlay is built: the login node)."""
    args = software.pip_args
    local = [d for d in _locations(args) if is_local_location(d)]  # a folder or file:// of any option
    notes = []
    if local or "--no-index" in args:
        where = ", ".join(local) if local else "--no-index"
        notes.append(f"software.pip_args install from local sources ({where}): a source package there runs its own "
                     "build script (setup.py, a build backend) with your permissions where the overlay is built (the "
                     "login node); use wheels you trust, or drop the option")  # fmt: skip
    if "--no-build-isolation" in args:
        notes.append("software.pip_args: --no-build-isolation builds with the packages of the environment that runs "
                     "pip, not a clean one")  # fmt: skip
    return notes


# ---- sweep keys ------------------------------------------------------------------------------------------
def is_software_key(key: str) -> bool:
    """Whether a sweep key addresses the software or container namespace (handled here for every kind)."""
    return key.split(".", 1)[0] in ("software", "container")


def key_problem(software: Software, key: str) -> str | None:
    """None for a valid software/container sweep key; else what is wrong and what is allowed."""
    parts = key.split(".")
    allowed = f"sweepable keys there: {', '.join(SWEEP_KEYS)}"
    if parts[0] == "container":
        return None if parts[1:] == ["image"] else f"{key!r}: only container.image is sweepable; {allowed}"
    if len(parts) == 4 and parts[1] == "repos" and parts[3] == "ref":
        if parts[2] in software.repos:
            return None
        known = ", ".join(software.repos) or "none: add it under software.repos first"
        return f"{key!r}: no repo {parts[2]!r} in software.repos (known: {known})"
    if len(parts) == 3 and parts[1] == "pip":
        return None if PACKAGE_RE.fullmatch(parts[2]) else f"{key!r}: {parts[2]!r} is not a pip package name"
    return f"{key!r} is not a software key; {allowed}"


# ---- expansion: refs → SHAs, the point's env --------------------------------------------------------------
def _repo_dir(repo: GitRepo, campaign_file: Path | None) -> Path:
    root = campaign_file.resolve().parent if campaign_file else Path.cwd()
    return (root / Path(repo.path).expanduser()).resolve()


def resolve_ref(repo_dir: Path, ref: str, name: str) -> str:
    """The full SHA of `ref` in the repository; ConfigError naming the repo and ref when it does not resolve."""
    if not (repo_dir / ".git").exists() and not (repo_dir / "HEAD").exists():
        raise ConfigError(f"software.repos.{name}.path: {repo_dir} is not a git repository")
    done = subprocess.run(
        ["git", "-C", str(repo_dir), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        raise ConfigError(f"software.repos.{name}.ref: {ref!r} does not name a commit in {repo_dir}")
    return done.stdout.strip()


def _pip_args(software: Software, campaign_file: Path | None) -> list[str]:
    """pip_args with relative --find-links / -f directories made absolute (relative to the campaign file)."""
    root = campaign_file.resolve().parent if campaign_file else Path.cwd()
    args, links = [], False
    for arg in software.pip_args:
        if links and not _SCHEME.match(arg):  # a file:// (or FILE://) URL is kept as written
            arg = str((root / arg).resolve())
        args.append(arg)
        links = arg in ("--find-links", "-f")
    return args


class SoftwareResolver:
    """Resolves the software of points (each distinct ref once) into env entries."""

    def __init__(self, software: Software, campaign_file: Path | None):
        self.software = software
        self.file = campaign_file
        self.shas: dict[tuple[str, str], str] = {}
        self.pip_args = _pip_args(software, campaign_file)

    def repo_dir(self, name: str) -> Path:
        """Where repo `name` is on disk (its path is relative to the campaign file)."""
        return _repo_dir(self.software.repos[name], self.file)

    def env(self, assignment: dict[str, Any]) -> dict[str, str]:
        """The point's software env (refs resolved); ConfigError for a ref that does not resolve, and for a swept
        `env.NAME` that mbx reserves (the loader refuses those first; this keeps every other route honest)."""
        from orchestrator.spec.reserved_env import name_problem

        for key in assignment:
            if key.startswith("env.") and (problem := name_problem(key[len("env.") :])):
                raise ConfigError(f"{key}: {problem}")
        env: dict[str, str] = {}
        for name, repo in self.software.repos.items():
            ref = str(assignment.get(f"software.repos.{name}.ref", repo.ref))
            if (name, ref) not in self.shas:
                self.shas[(name, ref)] = resolve_ref(_repo_dir(repo, self.file), ref, name)
            env[f"{PREFIX}{name.upper()}{SHA_SUFFIX}"] = self.shas[(name, ref)]
            env[f"{PREFIX}{name.upper()}{REPO_SUFFIX}"] = str(_repo_dir(repo, self.file))
        pins = dict(self.software.pip)
        for key, value in assignment.items():
            if key.startswith("software.pip."):
                try:
                    pins[key.split(".", 2)[2]] = check_version(key, value)
                except ValueError as err:
                    raise ConfigError(str(err)) from None
        if pins:
            env[PIP_PINS] = ",".join(f"{k}=={v}" for k, v in sorted(pins.items()))
            env[PIP_ARGS] = json.dumps(self.pip_args)
        if "container.image" in assignment:
            env[IMAGE] = str(assignment["container.image"])
        return env


def identity_env(env: dict[str, str]) -> dict[str, str]:
    """The env entries that are part of a point's identity (not where a repository or wheelhouse lives)."""
    return {k: v for k, v in env.items()
            if k != PIP_ARGS and not (k.startswith(PREFIX) and k.endswith(NOT_IDENTITY_SUFFIXES))}  # fmt: skip


# ---- launch: paths, PYTHONPATH, building -----------------------------------------------------------------
def software_root(workspace: Path) -> Path:
    return Path(workspace) / ".mbx" / "software"


def worktree_dir(workspace: Path, name: str, sha: str) -> Path:
    """<workspace>/.mbx/software/git/<name>-<sha12>; BuildError for a name or SHA that is not one (its only
    path components: nothing like `..` or `/` can ever come through)."""
    if not NAME_RE.fullmatch(name) or not SHA_RE.fullmatch(sha):
        raise BuildError(f"software: refusing repo {shown(name)} at {shown(sha)}: a worktree needs a repo name "
                         "(letters, digits, _) and a full hex commit SHA")  # fmt: skip
    return software_root(workspace) / "git" / f"{name.lower()}-{sha[:12]}"


def overlay_dir(workspace: Path, pins: str, args: str) -> Path:
    digest = hashlib.sha256(f"{pins}\n{args}".encode()).hexdigest()[:12]
    return software_root(workspace) / "pip" / digest


def repos_of(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """NAME (lower case) → (repo dir, sha) of the repos a point's env records."""
    found = {}
    for key, sha in env.items():
        if key.startswith(PREFIX) and key.endswith(SHA_SUFFIX):
            upper = key[len(PREFIX) : -len(SHA_SUFFIX)]
            found[upper.lower()] = (env.get(f"{PREFIX}{upper}{REPO_SUFFIX}", ""), sha)
    return found


def placeholder_paths(env: dict[str, str], workspace: Path) -> dict[str, str]:
    """`software.NAME` → the worktree path, for command argv templates."""
    return {
        f"software.{name}": str(worktree_dir(workspace, name, sha))
        for name, (_, sha) in repos_of(env).items()
    }


def launch_env(env: dict[str, str], workspace: Path, on_path: set[str]) -> dict[str, str]:
    """The point's env with the worktree and overlay paths added (`on_path`: repo names put on PYTHONPATH)."""
    out = dict(env)
    path: list[str] = []
    if env.get(PIP_PINS):
        path.append(str(overlay_dir(workspace, env[PIP_PINS], env.get(PIP_ARGS, "[]"))))
    for name, (_, sha) in repos_of(env).items():
        where = str(worktree_dir(workspace, name, sha))
        out[f"{PREFIX}{name.upper()}"] = where
        if name in on_path:
            path.append(where)
    if path:
        out["PYTHONPATH"] = ":".join([*path, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return out


def planned_builds(env: dict[str, str], workspace: Path) -> list[str]:
    """What `ensure_built` would build for this env now (lines for a dry run)."""
    lines = []
    for name, (repo, sha) in repos_of(env).items():
        where = worktree_dir(workspace, name, sha)
        if not (where / MARKER).exists():
            lines.append(f"git worktree {where} of {repo} at {sha}")
    if env.get(PIP_PINS):
        where = overlay_dir(workspace, env[PIP_PINS], env.get(PIP_ARGS, "[]"))
        if not (where / MARKER).exists():
            lines.append(f"pip overlay {where}: {env[PIP_PINS]}")
    return lines


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (waits for another orchestrator building the same thing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def checked_builds(env: dict[str, str]) -> tuple[list[tuple[str, Path, str]], list[str], list[str]]:
    """What `ensure_built` would act on, each part checked as the `software:` section checks it, before anything
    is built: (name, repository, SHA) per repo, the pins and the pip options. BuildError names what is wrong."""
    repos = []
    for name, (repo, sha) in repos_of(env).items():
        worktree_dir(Path("."), name, sha)  # the name and SHA check
        where = Path(repo)
        if not where.is_absolute() or not ((where / ".git").exists() or (where / "HEAD").exists()):
            raise BuildError(f"software: repo {name}: {shown(repo)} is not a git repository (an absolute path)")
        repos.append((name, where, sha))
    pins: list[str] = []
    args: list[str] = []
    if env.get(PIP_PINS):
        try:
            pins = [check_pin(pin) for pin in env[PIP_PINS].split(",")]
            loaded = json.loads(env.get(PIP_ARGS, "[]"))
            args = check_pip_args(loaded if isinstance(loaded, list) else [loaded])
        except (ValueError, TypeError) as err:
            raise BuildError(f"software: refusing pip install: {err}") from None
    return repos, pins, args


def ensure_built(env: dict[str, str], workspace: Path) -> list[Path]:
    """Build every worktree and overlay this env needs and is not built yet; the paths built now. Everything is
    checked first (`checked_builds`): a refused value builds nothing."""
    repos, pins, args = checked_builds(env)
    built = []
    for name, repo, sha in repos:
        where = worktree_dir(workspace, name, sha)
        if build_worktree(repo, sha, where, root=software_root(workspace)):
            built.append(where)
    if pins:
        where = overlay_dir(workspace, env[PIP_PINS], env.get(PIP_ARGS, "[]"))
        if build_overlay(pins, args, where, root=software_root(workspace)):
            built.append(where)
    return built


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise BuildError(f"{what} failed (exit {done.returncode}): {' | '.join(tail)}")


def _start_again(where: Path, root: Path) -> None:
    """Remove a half-built worktree or overlay (no build marker) through owned_dirs: only inside `root`, only
    when mbx's ownership marker is in it; BuildError (the attempt fails with the reason) otherwise."""
    try:
        remove_owned_dir(where, root=root)
    except NotOwned as err:
        raise BuildError(str(err)) from None


def build_worktree(repo: Path, sha: str, where: Path, *, root: Path) -> bool:
    """A detached worktree of `sha` at `where` (inside `root`), once; False when it was built already.

    `git worktree add --no-checkout` makes the directory, the ownership marker goes in before any file is
    checked out, and the build marker is written last."""
    with _locked(where.with_name(where.name + ".lock")):
        if (where / MARKER).exists():
            return False
        if where.exists() or where.is_symlink():  # half-built: start again
            _start_again(where, root)
        _run(["git", "-C", str(repo), "worktree", "prune"], f"git worktree prune in {repo}")
        _run(["git", "-C", str(repo), "worktree", "add", "--no-checkout", "--detach", "--force", str(where), sha],
             f"git worktree add of {sha} from {repo}")  # fmt: skip
        mark_owned(where)
        _run(["git", "-C", str(where), "checkout", "--force", "--quiet", "--detach", sha],
             f"git checkout of {sha} in {where}")  # fmt: skip
        (where / MARKER).write_text(json.dumps({"repo": str(repo), "sha": sha}) + "\n")
        return True


def build_overlay(pins: list[str], args: list[str], where: Path, *, root: Path) -> bool:
    """`pip install --target` of the checked pins (no dependencies) into `where` (inside `root`), once; False when
    built already."""
    with _locked(where.with_name(where.name + ".lock")):
        if (where / MARKER).exists():
            return False
        if where.exists() or where.is_symlink():
            _start_again(where, root)
        make_owned_dir(where)
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                "--target", str(where), *args, *pins]  # fmt: skip
        _run(argv, f"pip install of {', '.join(pins)}")
        (where / MARKER).write_text(json.dumps({"pins": pins, "args": args}) + "\n")
        return True


def record(env: dict[str, str]) -> dict[str, Any]:
    """What a point runs, for launch.json (`software` key): repo SHAs, pip pins, its own container image."""
    found: dict[str, Any] = {}
    repos = {name: sha for name, (_, sha) in repos_of(env).items()}
    if repos:
        found["repos"] = repos
    if env.get(PIP_PINS):
        found["pip"] = env[PIP_PINS].split(",")
    if env.get(IMAGE):
        found["container_image"] = env[IMAGE]
    return found
