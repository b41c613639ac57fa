"""Load YAML strictly: bad bytes, syntax, duplicate keys, deep nesting, huge files and alias bombs become
ConfigErrors.

Limits (reports/limits.py; a campaign or recipe file is a few KB, these only stop hostile or broken files):
`MAX_FILE_BYTES` (4 MiB), `MAX_VALUES` (250,000 values spelled out), `MAX_DEPTH` (64 levels of nesting,
counted through aliases) and `MAX_ALIAS_NODES` (aliases may add at most 100,000 values to what the file
itself spells out). Values are JSON's kinds only: strings, numbers, booleans, null, lists and mappings with
scalar keys (a date such as 2026-12-03 stays a string; !!binary, !!set, !!omap, !!timestamp are refused).

Speed: a pre-scan of the event stream (libyaml's, when PyYAML has it) counts values and nesting and stops at
a limit before anything is composed; a file that passes is composed by libyaml (`_CStrictLoader`) and
constructed by the same Python constructors as the pure-Python `_StrictLoader`. Any syntax error is reported
by the pure-Python loader, so both paths give the same messages (tests/test_trust_limits.py runs both).
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import ConfigError
from reports import limits

MAX_FILE_BYTES = limits.MAX_YAML_BYTES
MAX_DEPTH = limits.MAX_YAML_DEPTH
MAX_VALUES = limits.MAX_YAML_VALUES
MAX_ALIAS_NODES = limits.MAX_YAML_ALIAS_VALUES
HAS_LIBYAML = bool(getattr(yaml, "__with_libyaml__", False))
PURE_PYTHON_VALUES = 10_000  # a syntax error after more values is reported as libyaml words it (no slow re-parse)
_SCALAR_KEYS = (str, int, float, bool, type(None))
_REFUSED_TAGS = ("binary", "set", "omap", "pairs", "timestamp")


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


class _StrictResolver(yaml.resolver.Resolver):
    """YAML 1.1 implicit types without timestamps: `2026-12-03` stays the string it looks like."""


_StrictResolver.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}


class _StrictConstructor(yaml.constructor.SafeConstructor):
    """SafeConstructor whose values name their line when Python cannot hold them (both loaders use it)."""

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        """Construct one value; a value Python cannot hold (a 5,000-digit int, ...) names its line."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError, RecursionError) as err:
            problem = _value_problem(err)
            raise ConfigError(f"{_where(node.start_mark)}cannot read this value ({problem}): write it differently") from None


class _StrictLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    _StrictConstructor,
    _StrictResolver,
):
    """SafeLoader that refuses duplicate keys, nesting deeper than MAX_DEPTH and non-JSON values."""

    def __init__(self, stream: str):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _StrictConstructor.__init__(self)
        _StrictResolver.__init__(self)
        self._depth = 0
        self._values = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Compose one node, refusing to nest deeper than MAX_DEPTH (PyYAML recurses once per level) and more
        than MAX_VALUES nodes (the same checks, at the same marks, as `_prescan`)."""
        self._depth += 1
        self._values += 1
        try:
            _check_node(self.peek_event().start_mark, self._depth, self._values)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_node(mark: Any, depth: int, values: int) -> None:
    """Refuse a node nested deeper than MAX_DEPTH or past the MAX_VALUES-th value of the file."""
    if depth > MAX_DEPTH:
        raise ConfigError(f"{_where(mark)}nested more than {MAX_DEPTH} levels deep: flatten the file")
    if values > MAX_VALUES:
        raise ConfigError(
            f"{_where(mark)}too many values (more than {MAX_VALUES:,} scalars, lists and mappings; the limit "
            "for a YAML file): a campaign is a few hundred lines, generate the sweep with fewer values"
        )


_STEP = {yaml.ScalarEvent: 0, yaml.AliasEvent: 0, yaml.SequenceStartEvent: 1, yaml.MappingStartEvent: 1,
         yaml.SequenceEndEvent: -1, yaml.MappingEndEvent: -1}  # event type -> change of depth after it


def _prescan(text: str) -> tuple[int, int]:
    """Walk the event stream (libyaml's when there is one: nothing is composed) and refuse, at the offending
    node, nesting past MAX_DEPTH or a value past MAX_VALUES; (values, aliases) otherwise. YAMLError on bad
    syntax (with `values_before`, the values seen before it)."""
    parser = yaml.cyaml.CParser(text) if HAS_LIBYAML else yaml.SafeLoader(text)
    get_event, step_of = parser.get_event, _STEP.get
    depth = values = aliases = 0
    try:
        while (event := get_event()) is not None:
            kind = type(event)
            step = step_of(kind)
            if step is None:
                if kind is yaml.StreamEndEvent:
                    break
            elif step >= 0:
                values += 1
                aliases += kind is yaml.AliasEvent
                if depth >= MAX_DEPTH or values > MAX_VALUES:
                    _check_node(event.start_mark, depth + 1, values)
                depth += step
            else:
                depth -= 1
    except yaml.YAMLError as err:
        err.values_before = values  # type: ignore[attr-defined]
        raise
    finally:
        parser.dispose()
    return values, aliases


if HAS_LIBYAML:

    class _CStrictLoader(yaml.cyaml.CParser, _StrictConstructor, _StrictResolver):
        """libyaml composes (after `_prescan` has bounded the values and the depth); the constructors are
        `_StrictLoader`'s."""

        def __init__(self, stream: str):
            yaml.cyaml.CParser.__init__(self, stream)
            _StrictConstructor.__init__(self)
            _StrictResolver.__init__(self)

    _LOADERS: tuple[type, ...] = (_StrictLoader, _CStrictLoader)
else:  # pragma: no cover - PyYAML built without libyaml
    _LOADERS = (_StrictLoader,)


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    """A mapping whose own keys are scalars and distinct (keys merged in with `<<:` may be overridden)."""
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, _SCALAR_KEYS):
            raise ConfigError(f"{_where(key_node.start_mark)}a mapping key must be a string or a number")
        if key in seen:
            raise ConfigError(f"{_where(key_node.start_mark)}duplicate key {key!r}")
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


def _refuse_tag(loader: Any, node: yaml.Node) -> Any:
    tag = node.tag.rsplit(":", 1)[-1]
    raise ConfigError(
        f"{_where(node.start_mark)}the YAML tag !!{tag} is not supported: use strings, numbers, booleans, "
        "null, lists and mappings"
    )


for _loader in _LOADERS:
    _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    for _tag in _REFUSED_TAGS:
        _loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_tag)


def _check_expansion(root: yaml.Node) -> None:
    """Refuse recursive aliases, nesting deeper than MAX_DEPTH through aliases, and alias bombs.

    Aliases share one node, so each node is measured once: (values it expands to, its depth)."""
    measured: dict[int, tuple[int, int]] = {}
    open_nodes: set[int] = set()
    distinct = 0

    def measure(node: yaml.Node) -> tuple[int, int]:
        nonlocal distinct
        if id(node) in measured:
            return measured[id(node)]
        if id(node) in open_nodes:
            raise ConfigError(f"{_where(node.start_mark)}an alias refers to a section that contains it")
        open_nodes.add(id(node))
        distinct += 1
        children = node.value if isinstance(node, yaml.CollectionNode) else []
        size, depth = 1, 1
        for child in children:
            for part in child if isinstance(child, tuple) else (child,):
                part_size, part_depth = measure(part)
                size, depth = size + part_size, max(depth, part_depth + 1)
        if depth > MAX_DEPTH:
            raise ConfigError(
                f"{_where(node.start_mark)}nested more than {MAX_DEPTH} levels deep (through aliases): "
                "flatten the file"
            )
        open_nodes.discard(id(node))
        measured[id(node)] = (size, depth)
        return size, depth

    size, _ = measure(root)
    if size - distinct > MAX_ALIAS_NODES:
        raise ConfigError(
            f"aliases (*name) expand the file to {size:,} values, {size - distinct:,} more than it spells out "
            f"(at most {MAX_ALIAS_NODES:,}): write the repeated sections out or use fewer aliases"
        )


def _read_text(path: Path) -> str:
    """The file's text: a regular file (never a directory, FIFO or device) of at most MAX_FILE_BYTES, UTF-8."""
    file = str(path)
    try:
        if path.is_dir():
            raise ConfigError("is a directory, not a YAML file: give the path of a file", file=file)
        if not stat.S_ISREG(path.stat().st_mode):
            raise ConfigError("is not a regular file (a device, FIFO or socket): give a YAML file", file=file)
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("file not found: check the path", file=file) from None
    except OSError as err:
        reason = err.strerror or str(err)
        raise ConfigError(f"cannot read ({reason}): check the path and its permissions", file=file) from None
    except ValueError as err:  # e.g. a NUL byte in the path
        raise ConfigError(f"cannot open: {err}", file=file) from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"larger than {MAX_FILE_BYTES >> 20} MiB: is this a YAML file?", file=file)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ConfigError(
            f"line {line}, column {column}: not UTF-8 text (byte 0x{data[err.start]:02x}): save the file as UTF-8",
            file=file,
        ) from None


def _yaml_problem(err: yaml.YAMLError, text: str) -> str:
    """One line for a PyYAML error: where, and what."""
    if isinstance(err, yaml.reader.ReaderError):
        line = text.count("\n", 0, err.position) + 1
        column = err.position - (text.rfind("\n", 0, err.position) + 1) + 1
        return f"line {line}, column {column}: control character #x{err.character:04x} is not allowed in YAML: remove it"
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{_where(mark)}invalid YAML: {problem}"


def _value_problem(err: Exception) -> str:
    return str(err).split(";")[0].splitlines()[0]


class _SyntaxProblem(ConfigError):
    """A YAMLError as a ConfigError: the default route words it through the pure-Python parser."""


def _loader_for(text: str) -> tuple[type, int, bool]:
    """(loader, values the pre-scan counted, whether aliases must be measured): libyaml's after a clean pre-scan; the pure-Python one for control
    characters (its message) and a syntax error early in the file. A syntax error after more than
    PURE_PYTHON_VALUES values is reported as libyaml words it: the pure-Python parser would take seconds."""
    if not HAS_LIBYAML or yaml.reader.Reader.NON_PRINTABLE.search(text):
        return _StrictLoader, 0, True
    try:
        values, aliases = _prescan(text)
    except yaml.YAMLError as err:
        values = getattr(err, "values_before", 0)
        if values > PURE_PYTHON_VALUES:
            raise ConfigError(_yaml_problem(err, text)) from None
        return _StrictLoader, values, True
    return _CStrictLoader, values, aliases > 0


def load_yaml_text(text: str, loader_class: type | None = None) -> Any:
    """Parse YAML text strictly (see the module docstring); ConfigError without a file name on any problem.
    `loader_class` (tests) forces `_StrictLoader` or `_CStrictLoader` (after the pre-scan)."""
    if loader_class is not None:
        if loader_class is not _StrictLoader:
            _prescan_checked(text)
        return _load(text, loader_class)
    loader_class, values, aliased = _loader_for(text)
    try:
        return _load(text, loader_class, aliased)
    except _SyntaxProblem:  # libyaml's composer (an undefined alias...): the pure-Python words, when cheap
        if loader_class is _StrictLoader or values > PURE_PYTHON_VALUES:
            raise
        return _load(text, _StrictLoader)


def _prescan_checked(text: str) -> None:
    try:
        _prescan(text)
    except yaml.YAMLError as err:
        raise _SyntaxProblem(_yaml_problem(err, text)) from None


def _load(text: str, loader_class: type, aliased: bool = True) -> Any:
    """Compose, check aliases (`aliased`: the pre-scan saw one, or there was no pre-scan), construct."""
    loader = None
    try:
        loader = loader_class(text)
        node = loader.get_single_node()
        if node is None:
            return None
        if aliased:
            _check_expansion(node)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise _SyntaxProblem(_yaml_problem(err, text)) from None
    except RecursionError:
        raise ConfigError(f"nested too deeply (more than {MAX_DEPTH} levels): flatten the file") from None
    except (ValueError, TypeError, OverflowError) as err:
        raise ConfigError(f"cannot read a value ({_value_problem(err)}): write it differently") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml_file(path: Path) -> Any:
    """Parse a YAML file, raising ConfigError (with the file name) on any problem."""
    path = Path(path)
    text = _read_text(path)
    try:
        return load_yaml_text(text)
    except ConfigError as err:
        raise ConfigError(err.problems, file=str(path)) from None


def dump_yaml(data: Any) -> str:
    """YAML text with keys in the given order."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
