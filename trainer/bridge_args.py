"""The command-line grammar of Megatron-Bridge's scripts/training/run_recipe.py (r0.6) that mbx relies on: the short
options and the ConfigContainer field each one sets. Standard library only: the Bridge entry (trainer/bridge_entry.py)
parses with it on the node, the login side (orchestrator/spec/bridge_config.py) reads a point's argv with it."""

from __future__ import annotations

# (short, long, ConfigContainer field); a trailing `field=value` override wins over the short option.
SHORT_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("-ms", "--max_steps", "train.train_iters"),
    ("-gb", "--global_batch_size", "train.global_batch_size"),
    ("-mb", "--micro_batch_size", "train.micro_batch_size"),
    ("-sl", "--seq_length", "dataset.seq_length"),
    ("-tp", "--tensor_model_parallel_size", "model.tensor_model_parallel_size"),
    ("-pp", "--pipeline_model_parallel_size", "model.pipeline_model_parallel_size"),
    ("-cp", "--context_parallel_size", "model.context_parallel_size"),
    ("-vp", "--virtual_pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"),
    ("-ep", "--expert_model_parallel_size", "model.expert_model_parallel_size"),
    ("-etp", "--expert_tensor_parallel_size", "model.expert_tensor_parallel_size"),
)
# Options that take a value but set no ConfigContainer field here (skipped with their value when reading an argv).
VALUED_OPTIONS = ("--recipe", "--model", "--mode", "--dataset", "--step-func", "--step_func")


def field_overrides(argv: list[str]) -> list[tuple[str, str]]:
    """(field, value text) in argv order: each short option as its field, each `a.b=value` item as written;
    `--dataset mock` is `dataset.mock=true`. Later items win, as Hydra applies them in order."""
    by_option = {name: field for short, long, field in SHORT_OPTIONS for name in (short, long)}
    found: list[tuple[str, str]] = []
    items = iter(argv)
    for item in items:
        name, eq, text = item.partition("=")
        if name in by_option:
            value = text if eq else next(items, "")
            found.append((by_option[name], value))
        elif name in VALUED_OPTIONS:
            value = text if eq else next(items, "")
            if name == "--dataset" and value == "mock":
                found.append(("dataset.mock", "true"))
        elif eq and not item.startswith("-") and name and not name.startswith(("+", "~")):
            found.append((name, text))
        elif eq and name.startswith("+"):
            found.append((name[1:], text))
    return found
