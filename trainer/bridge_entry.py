"""Megatron-Bridge pretraining through its public API: recipe function → ConfigContainer → overrides → pretrain.

    python3 -m trainer.bridge_entry --recipe qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config \
        -mb 1 -gb 8 model.num_layers=4 model.expert_model_parallel_size=1 dataset.mock=true

The command line is the grammar of Bridge's own `scripts/training/run_recipe.py` (r0.6: `--recipe`, `--mode`, the
common short options such as `-mb`/`-gb`/`-sl`/`-ep`, then Hydra-style `a.b.c=value` overrides, which win over
the short options), so a campaign written for one runs with the other: swap the first two argv items. This
entry exists because run_recipe.py lives in the Bridge repository, not in the megatron-bridge wheel. It runs
one process per rank (torchrun or srun set RANK/WORLD_SIZE; alone it is rank 0 of 1), prints Bridge's own log
lines (mbx parses them: reports/parsers/megatron_bridge.py) and keeps the resolved configuration where
`logger.save_config_filepath` says (the mbx campaigns point it into the run directory).

Only the standard library is imported at module level; Bridge (and torch) are imported after the environment is
set, so the recipe's `env_vars` (CUDA_DEVICE_MAX_CONNECTIONS, NVTE_*) reach CUDA and Transformer Engine.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import socket
import sys
from collections.abc import Callable
from typing import Any

from trainer.bridge_args import SHORT_OPTIONS

RECIPE_PACKAGES = ("megatron.bridge.perf_recipes", "megatron.bridge.recipes")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(options, overrides): every trailing `key=value` item is an override, applied after the short options."""
    parser = argparse.ArgumentParser(
        prog="python3 -m trainer.bridge_entry", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--recipe", required=True, help="a recipe function's name, e.g. qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config")
    parser.add_argument("--mode", default="pretrain", choices=["pretrain"], help="only pretraining is run here")
    parser.add_argument("--dataset", choices=["mock"], help="mock: synthetic tokens (dataset.mock=true)")
    parser.add_argument("--step-func", "--step_func", dest="step_func", default="gpt_step", choices=["gpt_step"])
    parser.add_argument("--dryrun", action="store_true", help="resolve and save the config, train nothing")
    for short, long, field in SHORT_OPTIONS:
        parser.add_argument(short, long, type=int, metavar="N", help=f"sets {field}")
    options, rest = parser.parse_known_args(argv)
    unknown = [item for item in rest if "=" not in item or item.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (overrides are written key.path=value)")
    return options, rest


def override_list(options: argparse.Namespace, overrides: list[str]) -> list[str]:
    """The short options as overrides, then the trailing ones (Hydra applies them in order: the last wins)."""
    derived = [f"{field}={getattr(options, long[2:])}" for _, long, field in SHORT_OPTIONS
               if getattr(options, long[2:]) is not None]  # fmt: skip
    if options.dataset == "mock":
        derived.append("dataset.mock=true")
    return [*derived, *overrides]


def find_recipe(name: str) -> Callable[[], Any]:
    """The recipe function `name`: the benchmark recipes (megatron.bridge.perf_recipes.<family>) first, then the
    library recipes, as run_recipe.py looks them up."""
    for package_name in RECIPE_PACKAGES:
        package = importlib.import_module(package_name)
        if callable(getattr(package, name, None)):
            return getattr(package, name)
        families = sorted(
            (info.name for info in pkgutil.iter_modules(package.__path__) if info.ispkg),
            key=lambda family: not name.startswith(family.split("_")[0]),
        )
        for family in families:
            try:
                module = importlib.import_module(f"{package_name}.{family}")
            except ImportError:
                continue
            if callable(getattr(module, name, None)):
                return getattr(module, name)
    raise SystemExit(f"bridge_entry: no recipe function {name!r} in {' or '.join(RECIPE_PACKAGES)}")


def single_rank_defaults(environ: dict[str, str]) -> None:
    """Alone (no torchrun, no srun), a run is rank 0 of 1 on this host; torch.distributed still wants an address."""
    if environ.get("WORLD_SIZE", "1") != "1":
        return
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        environ.setdefault(name, value)
    if "MASTER_PORT" not in environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            environ["MASTER_PORT"] = str(probe.getsockname()[1])


def resolve(options: argparse.Namespace, overrides: list[str]) -> Any:
    """The recipe's ConfigContainer with the overrides applied and the model's sequence length synchronized."""
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    config = find_recipe(options.recipe)()
    config = process_config_with_overrides(config, cli_overrides=override_list(options, overrides) or None)
    seq = getattr(config.dataset, "seq_length", None)
    if seq is not None and getattr(config.model, "seq_length", seq) != seq:
        config.model.seq_length = seq  # the dataset owns the sequence length (run_recipe.py does the same)
    return config


def main(argv: list[str] | None = None) -> None:
    options, overrides = parse(sys.argv[1:] if argv is None else argv)
    single_rank_defaults(os.environ)  # type: ignore[arg-type]
    config = resolve(options, overrides)
    from megatron.bridge.training.config import apply_environment_variables

    apply_environment_variables(config)  # the recipe's env_vars; values already set in the environment stay
    if options.dryrun:
        path = config.logger.save_config_filepath or "ConfigContainer.yaml"
        config.to_yaml(path)
        print(f"bridge_entry: resolved config written to {path}")
        return
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    pretrain(config, forward_step)
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
