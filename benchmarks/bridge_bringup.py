"""Bring Megatron-Bridge 0.6.2 (with megatron-core 0.19.2, Transformer Engine 2.20.2 and mbx's own needs) to a GPU
machine that has no network, and write the HF config cache its Qwen3 recipes read.

    # here (network, no GPU): every wheel into one tar, cut in parts of ≤ 55 MiB; the device calls printed
    python benchmarks/bridge_bringup.py prepare --dest .whl/bridge

    # there, after the part calls (one part each, copied to /root/bridge-parts, back to back):
    python3 benchmarks/bridge_bringup.py install --parts /root/bridge-parts --target /root/bridge-site \
        --hf-home /root/hf
    export PYTHONPATH=/root/bridge-site HF_HOME=/root/hf

    # anywhere: only the HF cache (Qwen/Qwen3-30B-A3B's public config.json at the recipe's revision)
    python3 benchmarks/bridge_bringup.py hf-cache /root/hf

Which packages: what Bridge's pretraining path really imports, found by installing the wheels with `--no-deps`
and importing `megatron.bridge.training.pretrain`, `megatron.bridge.training.gpt_step` and the Qwen3 perf recipes
until nothing failed (BENCHMARKS.md lists them and why; Bridge's declared requirements are far wider: mlflow,
comet-ml, flashinfer, timm, open-clip ... are never imported there). `install` skips every wheel whose
distribution the machine already has (the GPU image's transformers, numpy, ... stay), installs the rest with
one `pip install --no-deps --target`, builds TE's torch extension (benchmarks/te_bringup.py) unless a prebuilt
one came along, and imports the training path. On a cluster the NeMo container has all of it: no bring-up.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import te_bringup  # noqa: E402  (same folder: TE's wheels, the torch-extension build, splitting and joining)

BRIDGE_WHEELS = [
    # Bridge and its own stack
    "megatron-bridge==0.6.2", "megatron-energon==7.4.1", "nvidia-modelopt==0.47.0",
    "nvidia-resiliency-ext==0.7.0", "hydra-core==1.3.8", "omegaconf==2.3.0",  # hydra 1.3 needs omegaconf < 2.4
    # imported at module level on the pretraining path (Bridge data/, energon, HF datasets, diffusers)
    "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19", "diffusers==0.42.1",
    "multi-storage-client==1.3.1", "rapidyaml==0.15.2", "webdataset==1.0.2", "braceexpand==0.1.7",
    "filetype==1.2.0", "xattr==1.3.1", "cffi==2.1.1", "wcmatch==10.1", "bracex==3.2.4", "lark==1.3.1",
    "jmespath==1.1.0", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "referencing==0.37.0",
    "rpds-py==2026.9.1", "prettytable==3.19.0", "wcwidth==0.9.5", "pulp==3.3.2", "defusedxml==0.7.1",
    "deprecation==2.1.0", "opentelemetry-api==1.45.2", "opentelemetry-sdk==1.45.2",
    "opentelemetry-semantic-conventions==0.66b2", "opentelemetry-exporter-otlp-proto-http==1.45.2",
    "opentelemetry-exporter-otlp-proto-common==1.45.2", "opentelemetry-proto==1.45.2",
    "googleapis-common-protos==1.76.0", "toml==0.10.2", "more-itertools==11.2.1", "platformdirs==4.14.9",
    # mbx itself on the node (the image has typer, rich, jinja2, pyyaml, numpy, scipy)
    "wandb==0.31.0", "cwevals==0.0.1b1", "sentry-sdk==2.76.0", "gitpython==3.2.1", "gitdb==4.0.12",
    "smmap==5.0.3", "plotly==7.1.0", "submitit==1.5.4", "detect-secrets==1.5.0",
]  # fmt: skip
# Also imported on that path, but the device image already had them on 2026-12-06
# (benchmarks/data/gpu_image_pip_list_2026-12-06.txt); `prepare --with-image-packages` carries them too.
IMAGE_PACKAGES = [
    "pyarrow==26.0.1", "pandas==3.1.1", "python-dateutil==2.9.0.post0", "xxhash==4.1.0", "tensorboard==2.21.0",
    "absl-py==2.5.1", "markdown==3.11.3", "werkzeug==3.1.9", "grpcio==1.85.4", "tensorboard-data-server==0.7.2",
    "attrs==26.1.0", "einops==0.8.2", "psutil==7.2.2", "pillow==13.0.0", "protobuf==7.36.2", "requests==2.34.2",
    "urllib3==2.8.0", "charset-normalizer==3.5.3", "idna==3.21", "certifi==2026.10.19.post1", "six==1.17.0",
    "narwhals==2.29.0", "cloudpickle==3.1.3",
]  # fmt: skip
SDIST_WHEELS = ["antlr4-python3-runtime==4.9.3"]  # hydra's parser runtime: an sdist only (pure Python)
IMPORT_CHECK = (
    "import transformer_engine.pytorch, megatron.bridge.training.pretrain, megatron.bridge.training.gpt_step, "
    "megatron.bridge.perf_recipes.qwen.h100.qwen3_moe; import megatron.bridge as b; print('megatron-bridge', "
    "b.__version__)"
)
BUNDLE = "bundle.tar"
MANIFEST = "bridge_manifest.json"
PART_PREFIX = "bridge-part-"
PREBUILT_EXT = "te_torch_ext.tgz"  # the TE torch extension built on a first install, carried on later ones

# Qwen/Qwen3-30B-A3B's config.json (public), at the revision megatron-bridge 0.6.2's recipes pin.
QWEN3_30B_A3B = ("Qwen/Qwen3-30B-A3B", "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39")
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip


def pip_download(specs: list[str], dest: Path) -> None:
    """Wheels for the GPU image's Python 3.12 on x86-64 (glibc 2.39 there: nvidia-resiliency-ext is 2_39 only)."""
    newer = [arg for tag in ("manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64",
                             "manylinux_2_31_x86_64") for arg in ("--platform", tag)]  # fmt: skip
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *te_bringup.PLATFORM_ARGS, *newer,
                    "-d", str(dest), *specs], check=True)  # fmt: skip


def write_hf_cache(hf_home: Path) -> Path:
    """The HF hub cache layout with the recipe's config.json, so `from_hf_pretrained` resolves offline."""
    model_id, revision = QWEN3_30B_A3B
    repo = hf_home / "hub" / ("models--" + model_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN3_30B_A3B_CONFIG, indent=1) + "\n")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot / "config.json"


def distribution(wheel: Path) -> str:
    """A wheel file's distribution name, normalized (PEP 503)."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def prepare(args: argparse.Namespace) -> None:
    dest: Path = args.dest.resolve()
    stage = Path(tempfile.mkdtemp(prefix="bridge-stage-"))
    wheels = stage / "wheels"
    wheels.mkdir()
    cache = args.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    big = sorted(cache.glob(f"transformer_engine_cu13-{te_bringup.TE_VERSION}-*.whl"))
    if not big:
        te_bringup.pip_download([te_bringup.BIG_WHEEL], cache)
        big = sorted(cache.glob(f"transformer_engine_cu13-{te_bringup.TE_VERSION}-*.whl"))
    extra = IMAGE_PACKAGES if args.with_image_packages else []
    pip_download([*te_bringup.SMALL_WHEELS, *BRIDGE_WHEELS, *extra], wheels)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), *SDIST_WHEELS],
                   check=True)  # fmt: skip
    te_bringup.fetch_torch_extension_source(stage)
    with tarfile.open(stage / BUNDLE, "w") as tar:  # wheels are zip-compressed already
        tar.add(big[0], arcname=f"te/{big[0].name}")
        tar.add(stage / te_bringup.SRC_TGZ, arcname=te_bringup.SRC_TGZ)
        for wheel in sorted(wheels.glob("*.whl")):
            tar.add(wheel, arcname=f"wheels/{wheel.name}")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob(f"{PART_PREFIX}*"):
        old.unlink()
    names = [name.replace(te_bringup.PART_PREFIX, PART_PREFIX) for name in
             te_bringup.split_file(stage / BUNDLE, dest, args.part_mib * te_bringup.MIB)]  # fmt: skip
    for name in names:
        (dest / name.replace(PART_PREFIX, te_bringup.PART_PREFIX)).rename(dest / name)
    manifest = {"bundle_sha256": te_bringup.sha256(stage / BUNDLE), "parts": names, "te_wheel": big[0].name}
    if args.prebuilt_ext:  # carried with the manifest in the install call
        (dest / PREBUILT_EXT).write_bytes(Path(args.prebuilt_ext).read_bytes())
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    rel = os.path.relpath(dest, args.repo.resolve())
    calls = [{"carry": [f"{rel}/{name}"], "command": f"mkdir -p /root/bridge-parts && cp {rel}/{name} "
              "/root/bridge-parts/"} for name in names[:-1]]  # fmt: skip
    last = [f"{rel}/{names[-1]}", f"{rel}/{MANIFEST}", *([f"{rel}/{PREBUILT_EXT}"] if args.prebuilt_ext else [])]
    calls.append({"carry": last, "command": f"cp {rel}/{names[-1]} /root/bridge-parts/ && "
                  "bash benchmarks/bridge_session.sh go"})  # fmt: skip
    print(json.dumps({"manifest": manifest, "device_calls": calls}, indent=1))


def present(wheels: list[Path]) -> tuple[list[Path], list[str]]:
    """(wheels to install, distributions this interpreter already has, with their versions)."""
    install, have = [], []
    for wheel in wheels:
        try:
            have.append(f"{distribution(wheel)}=={importlib.metadata.version(distribution(wheel))}")
        except importlib.metadata.PackageNotFoundError:
            install.append(wheel)
    return install, have


def install(args: argparse.Namespace) -> None:
    manifest = json.loads((args.manifest_dir / MANIFEST).read_text())
    work = Path(tempfile.mkdtemp(prefix="bridge-install-"))
    bundle = work / BUNDLE
    te_bringup.join_parts(args.parts, manifest["parts"], bundle)
    if te_bringup.sha256(bundle) != manifest["bundle_sha256"]:
        raise SystemExit("joined bundle's sha256 does not match the manifest (a part missing or cut short?)")
    with tarfile.open(bundle) as tar:
        tar.extractall(work, filter="data")
    bundle.unlink()
    wheels, have = present(sorted((work / "wheels").glob("*.whl")))
    target: Path = args.target.resolve()
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target", str(target)]  # fmt: skip
    subprocess.run([*pip, str(work / "te" / manifest["te_wheel"]), *map(str, wheels)], check=True)
    print(json.dumps({"installed": [w.name for w in wheels], "already_there": have}, indent=1))
    write_dataset_makefile(target)
    prebuilt = args.manifest_dir / PREBUILT_EXT
    if prebuilt.exists():
        with tarfile.open(prebuilt) as tar:
            tar.extractall(target, filter="data")
    else:
        build_te_extension(work, target, args)
    if args.hf_home:
        print("hf cache:", write_hf_cache(args.hf_home))
    env = dict(os.environ, PYTHONPATH=str(target), HF_HOME=str(args.hf_home or ""), HF_HUB_OFFLINE="1")
    check = subprocess.run([sys.executable, "-c", IMPORT_CHECK], env=env, capture_output=True, text=True)
    print(check.stdout.strip() or check.stderr.strip()[-3000:])
    if check.returncode:
        raise SystemExit(check.returncode)


DATASET_MAKEFILE = """\
# Written by mbx's benchmarks/bridge_bringup.py: megatron-core's wheel ships the dataset index helper prebuilt
# (helpers_cpp*.so) but not the Makefile that Megatron's start-up (compile_helpers) runs `make` on.
default:
\t@ls helpers_cpp*.so > /dev/null
"""


def write_dataset_makefile(target: Path) -> None:
    """Megatron runs `make -C megatron/core/datasets` at start-up (seen failing on 2026-12-06: "No targets
    specified and no makefile found"); with the helper prebuilt in the wheel, a Makefile that checks it is enough."""
    folder = target / "megatron" / "core" / "datasets"
    if folder.is_dir() and not (folder / "Makefile").exists() and list(folder.glob("helpers_cpp*.so")):
        (folder / "Makefile").write_text(DATASET_MAKEFILE)


def build_te_extension(work: Path, target: Path, args: argparse.Namespace) -> None:
    """TE's torch extension built from its source for sm_90 into `target`; a tgz of it kept in $OUT for later."""
    with tarfile.open(work / te_bringup.SRC_TGZ) as tar:
        tar.extractall(work, filter="data")
    built = work / "ext"
    nvidia = te_bringup.purelib_nvidia(sys.executable)
    env = dict(os.environ, NVTE_PYTORCH_FORCE_BUILD="TRUE", NVTE_CUDA_ARCHS=args.archs, MAX_JOBS=str(args.jobs),
               CUDNN_PATH=str(nvidia / "cudnn"), CUDNN_HOME=str(nvidia / "cudnn"), PYTHONPATH=str(target))  # fmt: skip
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    "--target", str(built), "."], cwd=work / "transformer_engine_torch_src", env=env, check=True)  # fmt: skip
    out = Path(os.environ["OUT"]) / PREBUILT_EXT if os.environ.get("OUT") else None
    tar = tarfile.open(out, "w:gz") if out else None
    for item in built.iterdir():
        subprocess.run(["cp", "-r", str(item), str(target)], check=True)
        if tar:
            tar.add(item, arcname=item.name)
    if tar:
        tar.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="here: download, bundle, split, print the device calls")
    p.add_argument("--dest", type=Path, default=Path(".whl/bridge"))
    p.add_argument("--repo", type=Path, default=Path("."), help="the checkout the device calls send")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "te-wheel-cache")
    p.add_argument("--part-mib", type=int, default=55, help="part size; a call carries ≤ 64 MiB with the tree")
    p.add_argument("--with-image-packages", action="store_true",
                   help="also carry what the device image already had (pyarrow, pandas, tensorboard, ...)")
    p.add_argument("--prebuilt-ext", type=Path, default=None,
                   help="a te_torch_ext.tgz an earlier install left in $OUT (skips the ~2 min extension build)")
    i = sub.add_parser("install", help="there: join, install what the image lacks, build TE's extension, import")
    i.add_argument("--parts", type=Path, default=Path("/root/bridge-parts"))
    i.add_argument("--manifest-dir", type=Path, default=Path(".whl/bridge"))
    i.add_argument("--target", type=Path, default=Path("/root/bridge-site"))
    i.add_argument("--hf-home", type=Path, default=None)
    i.add_argument("--archs", default="90")
    i.add_argument("--jobs", type=int, default=os.cpu_count() or 8)
    h = sub.add_parser("hf-cache", help="write the Qwen3-30B-A3B config.json into an HF cache folder")
    h.add_argument("hf_home", type=Path)
    args = parser.parse_args(argv)
    if args.step == "prepare":
        prepare(args)
    elif args.step == "install":
        install(args)
    else:
        print(write_hf_cache(args.hf_home))


if __name__ == "__main__":
    main()
