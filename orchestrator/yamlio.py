"""Load YAML strictly: duplicate keys and syntax errors become ConfigErrors naming file, line and column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise ConfigError(f"line {mark.line + 1}, column {mark.column + 1}: duplicate key {key!r}")
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_file(path: Path) -> Any:
    """Parse a YAML file, raising ConfigError (with the file name) on any problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except OSError as err:
        raise ConfigError(f"cannot read: {err.strerror}", file=str(path)) from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except ConfigError as err:
        raise ConfigError(err.problems, file=str(path)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{where}invalid YAML: {problem}", file=str(path)) from None


def dump_yaml(data: Any) -> str:
    """YAML text with keys in the given order."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
