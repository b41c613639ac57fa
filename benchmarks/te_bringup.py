"""Bring Transformer Engine 2.20.2 (and megatron-core 0.19.2) to a GPU machine that has no network.

Two steps, one command each side:

    # here (network, no GPU): wheels into .whl/, the 276 MB TE wheel cut in parts, the device calls printed
    python benchmarks/te_bringup.py prepare --dest /work/main/.whl

    # there (GPU, no network), after the parts were copied to /root/te by the printed calls, back to back:
    python3 benchmarks/te_bringup.py install --parts /root/te --whl ../.whl --target /root/te-site \
        --deps-target /root/mbx-site
    export PYTHONPATH=/root/te-site:$PYTHONPATH      # (/root/mbx-site alone: the trainer without TE)

`install` joins the parts (checked against the sha256 that `prepare` recorded), installs every wheel in one
`pip install --no-index --no-deps --target` (separate installs into one target replace each other's
folders), builds the transformer_engine_torch extension from its source for sm_90 (C++ only, ~2 min on 16
cores) and installs it into the same target (transformer_engine must be one folder), then imports
`transformer_engine.pytorch` and prints its version. The machine is given back ~30 s after a call ends and
/root/te goes with it: the part calls must follow each other without a pause.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

TE_VERSION = "2.20.2"
BIG_WHEEL = f"transformer-engine-cu13=={TE_VERSION}"
# Small wheels installed next to TE: its metapackage and Python needs, the cuDNN frontend (its C++ headers
# build the torch extension), the trainer's pydantic set (absent from the GPU image), megatron-core (a peer).
SMALL_WHEELS = [
    f"transformer-engine=={TE_VERSION}",
    "nvdlfw-inspect==0.2.2",
    "importlib-metadata==10.2.0",
    "zipp==4.1.2",
    "nvidia-cudnn-frontend==1.32.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",
    "megatron-core==0.19.2",
]
TRAINER_DEPS = {"pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions"}
PLATFORM_ARGS = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    *[
        arg
        for plat in (
            "manylinux_2_28_x86_64",
            "manylinux_2_27_x86_64",
            "manylinux_2_24_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
            "manylinux1_x86_64",
        )
        for arg in ("--platform", plat)
    ],
]
PART_PREFIX = "te-part-"
SRC_TGZ = "te_torch_src.tgz"
MANIFEST = "te_manifest.json"
MIB = 1 << 20


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(8 * MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def split_file(path: Path, dest: Path, part_bytes: int) -> list[str]:
    """Cut `path` into dest/te-part-NN files of part_bytes (the last shorter); their names in order."""
    names = []
    with path.open("rb") as fh:
        index = 0
        while chunk := fh.read(part_bytes):
            name = f"{PART_PREFIX}{index:02d}"
            (dest / name).write_bytes(chunk)
            names.append(name)
            index += 1
    return names


def join_parts(parts_dir: Path, names: list[str], out: Path) -> None:
    with out.open("wb") as fh:
        for name in names:
            with (parts_dir / name).open("rb") as part:
                shutil.copyfileobj(part, fh, 16 * MIB)


def pip_download(specs: list[str], dest: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM_ARGS, "-d", str(dest), *specs],
        check=True,
    )


def fetch_torch_extension_source(dest: Path) -> None:
    """transformer-engine-torch's sdist cannot be `pip download`ed plainly (its metadata step imports torch and
    fails without CUDA); with --no-clean the unpacked source stays in TMPDIR: tar it up."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary=:all:",
                "--no-clean",
                "--no-build-isolation",
                "-d",
                str(Path(tmp) / "dl"),
                f"transformer-engine-torch=={TE_VERSION}",
            ],
            env=env,
            capture_output=True,
        )
        setups = sorted(Path(tmp).glob("**/transformer-engine-torch*/setup.py")) or sorted(
            Path(tmp).glob("**/transformer_engine_torch*/setup.py")
        )
        if not setups:
            raise SystemExit("transformer-engine-torch source not found after pip download --no-clean")
        with tarfile.open(dest / SRC_TGZ, "w:gz") as tar:
            tar.add(setups[0].parent, arcname="transformer_engine_torch_src")


def device_calls(names: list[str], dest_rel: str) -> list[dict]:
    """The `run` calls that bring the parts over (each part copied out of the tree) and install on the last."""
    calls = []
    for name in names[:-1]:
        calls.append(
            {
                "carry": [f"{dest_rel}/{name}"],
                "command": f"mkdir -p /root/te && cp {dest_rel}/{name} /root/te/ && ls -la /root/te",
            }
        )
    last = names[-1]
    calls.append(
        {
            "carry": [
                ".h4",
                f"{dest_rel}/{last}",
                f"{dest_rel}/wheels",
                f"{dest_rel}/{SRC_TGZ}",
                f"{dest_rel}/{MANIFEST}",
            ],
            "command": (
                f"mkdir -p /root/te && cp {dest_rel}/{last} /root/te/ && cd .h4 && "
                f"python3 benchmarks/te_bringup.py install --parts /root/te --whl ../{dest_rel} "
                "--target /root/te-site --deps-target /root/mbx-site"
            ),
        }
    )
    return calls


def prepare(args: argparse.Namespace) -> None:
    dest: Path = args.dest.resolve()
    (dest / "wheels").mkdir(parents=True, exist_ok=True)
    cache = args.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    big = sorted(cache.glob(f"transformer_engine_cu13-{TE_VERSION}-*.whl"))
    if not big:
        pip_download([BIG_WHEEL], cache)
        big = sorted(cache.glob(f"transformer_engine_cu13-{TE_VERSION}-*.whl"))
    pip_download(SMALL_WHEELS, dest / "wheels")
    if not (dest / SRC_TGZ).exists():
        fetch_torch_extension_source(dest)
    for old in dest.glob(f"{PART_PREFIX}*"):
        old.unlink()
    names = split_file(big[0], dest, args.part_mib * MIB)
    manifest = {"wheel": big[0].name, "sha256": sha256(big[0]), "parts": names}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    rel = os.path.relpath(dest, args.repo.resolve())
    print(json.dumps({"manifest": manifest, "device_calls": device_calls(names, rel)}, indent=1))


def purelib_nvidia(python: str) -> Path:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Path(out) / "nvidia"


def install(args: argparse.Namespace) -> None:
    whl: Path = args.whl.resolve()
    target: Path = args.target.resolve()
    manifest = json.loads((whl / MANIFEST).read_text())
    missing = [n for n in manifest["parts"] if not (args.parts / n).exists()]
    if missing:
        raise SystemExit(
            f"parts missing under {args.parts}: {missing} (the machine was given back between calls?)"
        )
    work = Path(tempfile.mkdtemp(prefix="te-install-"))
    wheel = work / manifest["wheel"]
    join_parts(args.parts, manifest["parts"], wheel)
    if sha256(wheel) != manifest["sha256"]:
        raise SystemExit("joined wheel's sha256 does not match the manifest")
    wheels = [wheel, *sorted((whl / "wheels").glob("*.whl"))]
    if target.exists():
        shutil.rmtree(target)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
    ]
    subprocess.run([*pip, str(target), *map(str, wheels)], check=True)
    if args.deps_target:  # the trainer's own needs alone (pydantic set): runs "without TE" still need them
        deps = [w for w in wheels[1:] if w.name.split("-")[0].lower() in TRAINER_DEPS]
        subprocess.run([*pip, str(args.deps_target), *map(str, deps)], check=True)
    with tarfile.open(whl / SRC_TGZ) as tar:
        tar.extractall(work, filter="data")
    src = work / "transformer_engine_torch_src"
    built = work / "ext"
    nvidia = purelib_nvidia(sys.executable)
    env = dict(
        os.environ,
        NVTE_PYTORCH_FORCE_BUILD="TRUE",
        NVTE_CUDA_ARCHS=args.archs,
        MAX_JOBS=str(args.jobs),
        CUDNN_PATH=str(nvidia / "cudnn"),
        CUDNN_HOME=str(nvidia / "cudnn"),
        PYTHONPATH=os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    subprocess.run(
        [*pip[:-1], "--no-build-isolation", "--target", str(built), "."], cwd=src, env=env, check=True
    )
    for (
        item
    ) in built.iterdir():  # merge: transformer_engine_torch*.so and its dist-info next to transformer_engine
        dst = target / item.name
        if item.is_dir():
            shutil.copytree(item, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(item, dst)
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import transformer_engine.pytorch as te, transformer_engine as t; "
            "print('transformer_engine', t.__version__, te.__file__)",
        ],
        env=dict(os.environ, PYTHONPATH=env["PYTHONPATH"]),
        capture_output=True,
        text=True,
    )
    print(check.stdout.strip() or check.stderr.strip()[-2000:])
    shutil.rmtree(work, ignore_errors=True)
    print(f"export PYTHONPATH={target}:$PYTHONPATH")
    if check.returncode:
        raise SystemExit(check.returncode)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="here: download, split, print the device calls")
    p.add_argument("--dest", type=Path, default=Path(".whl"))
    p.add_argument("--repo", type=Path, default=Path("."), help="the checkout the device calls send")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "te-wheel-cache")
    p.add_argument(
        "--part-mib", type=int, default=50, help="part size; a call carries ≤ 64 MiB with the tree (60 left too little room once the tree grew)"
    )
    i = sub.add_parser("install", help="there: join, install, build the torch extension")
    i.add_argument("--parts", type=Path, default=Path("/root/te"))
    i.add_argument("--whl", type=Path, default=Path("../.whl"))
    i.add_argument("--target", type=Path, default=Path("/root/te-site"))
    i.add_argument(
        "--deps-target",
        type=Path,
        default=None,
        help="also install the trainer's pydantic set alone here (for runs without TE on the path)",
    )
    i.add_argument("--archs", default="90")
    i.add_argument("--jobs", type=int, default=os.cpu_count() or 8)
    args = parser.parse_args(argv)
    prepare(args) if args.step == "prepare" else install(args)


if __name__ == "__main__":
    main()
