"""The one secret scanner of mbx: detect-secrets' plugins (a maintained set of token formats and keyword rules)
plus the project's rules for what they miss; used for cards, freeze output, W&B configs and the report.

The project's rules: a value after a credential-like name (`WANDB_API_KEY=…`, `HF_TOKEN: …`, `--wandb-key …`,
`password=hunter2`, with `_`, `-` and `.` as word boundaries), the token formats detect-secrets lacks (`hf_…`,
`nvapi-…`, `sk-…`), and values under a credential-like key of a document. Not secrets: a NAME without a value
(`env.pass: [WANDB_API_KEY]`), a reference (`$HF_TOKEN`, `${HF_TOKEN}`), a placeholder (`<your key>`, `***`),
a number under a key/token name (`EOD_TOKEN=0`), and bare hex (git SHAs, cell-id hashes: only a credential-like
name before a hex string makes it a key). Findings carry the kind and where, never the value (see `mask`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

MASK = "<redacted>"

# Names whose value is a credential. `key` needs a word before it and a separator (MONKEY, hotkey, `--key` are not
# keys; APIKEY is); the other words end a name by themselves (HFTOKEN, authtoken, dbpassword).
_CREDENTIAL_NAME = re.compile(
    r"(?i)(?:[_.-]key|(?:^|[_.-])(?:(?:api|access|secret|private|auth|client|service|account)key|pwd|credentials?|"
    r"auth)|token|secret|password|passwd|passphrase)$"
)
_CREDENTIAL_WORD = re.compile(r"(?i)key|token|secret|passw|passphrase|pwd|credential|auth")  # a cheap pre-check
_PASSWORD_NAME = re.compile(r"(?i)(?:passw(?:or)?d|passphrase|pwd)$")
# the start of a name: not after a word character, '-' or '.', nor after '$' / '{' (a reference like ${HF_TOKEN})
_NAME = r"(?<![\w.$\{-])(?P<name>[A-Za-z_][\w.-]*?)"
_VALUE = r"(?:\"(?P<dq>[^\"\n]*)\"|'(?P<sq>[^'\n]*)'|(?P<bare>[^\s\"',;)\]}]+))"
_ASSIGNMENT = re.compile(_NAME + r"\s*(?::=|=|:)[ \t]*" + _VALUE)
_FLAG = re.compile(r"(?<![\w-])--(?P<name>[A-Za-z][\w-]*)(?:=|[ \t]+)" + _VALUE)
_TOKENS = (  # formats detect-secrets 1.5 does not know
    (re.compile(r"(?<![\w-])hf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
    (re.compile(r"(?<![\w-])nvapi-[A-Za-z0-9_-]{20,}"), "an NGC API key"),
    (re.compile(r"(?<![\w-])sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"), "an API secret key (sk-…)"),
    (re.compile(r"(?<![\w-])github_pat_\w{20,}|(?<![\w-])gh[pousr]_[A-Za-z0-9]{30,}"), "a GitHub token"),
)
_REFERENCE = re.compile(r"^(?:\$\{?\w+\}?|%\(\w+\)s|\{\{.*\}\}|<[^<>]*>|\*+|x{3,}|\.{3}|…|none|null|true|false)$",
                        re.IGNORECASE)  # fmt: skip
_VARIABLE_NAME = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")  # a NAME (HF_TOKEN), not a value
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?$", re.IGNORECASE)
MIN_TEXT = 6  # the shortest text that can hold a secret with its name (pwd=x1) or a token
MIN_KEY_LENGTH = 8  # a value after a key/token/secret name shorter than this is a word, not a credential
# detect-secrets plugins not used: IPPublicDetector (addresses are not credentials; version strings match it),
# HexHighEntropyString (a git SHA is high-entropy hex), KeywordDetector's unquoted rules (prose such as
# "secrets: passed by name" matches them; the project's rules cover unquoted assignments precisely).
_SKIPPED_PLUGINS = {"IPPublicDetector", "HexHighEntropyString", "Base64HighEntropyString", "KeywordDetector"}
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_LETTER = re.compile(r"[A-Za-z]")


@dataclass(frozen=True)
class Finding:
    """A secret in a text: what kind, where (a key path; "" for a lone text), and its span in the text."""

    kind: str
    where: str
    start: int
    end: int
    name: str = ""  # the name or flag the value was under, when one was (shown instead of the value)

    def describe(self) -> str:
        """`a W&B-style credential (WANDB_API_KEY=<redacted>)`: the kind and the name, never the value."""
        shown = f" ({self.name}={MASK})" if self.name else ""
        return f"{self.kind}{shown}"


def credential_name(name: str) -> bool:
    """Whether `name` (an env variable, a key, a flag without its dashes) names a credential."""
    return bool(_CREDENTIAL_NAME.search(name.strip().strip("\"'[]")))


def secret_value(name: str, value: str) -> bool:
    """Whether `value` under the credential-like `name` is a secret (not a reference, placeholder, NAME, number
    or a word too short to be a key; any real value counts for a password)."""
    value = value.strip()
    if not value or _REFERENCE.match(value) or _VARIABLE_NAME.match(value) or value.startswith("-"):
        return False
    if _PASSWORD_NAME.search(name):
        return True
    return len(value) >= MIN_KEY_LENGTH and not _NUMBER.match(value)


@lru_cache(maxsize=1)
def _plugins() -> tuple[Any, ...]:
    """detect-secrets' plugins, instantiated once (imported here: the package loads requests, ~0.5 s)."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
    from detect_secrets.plugins.keyword import KeywordDetector

    classes = get_mapping_from_secret_type_to_class().values()
    chosen = [c() for c in sorted(classes, key=lambda c: c.__name__) if c.__name__ not in _SKIPPED_PLUGINS]
    return (*chosen, KeywordDetector(), Base64HighEntropyString())


def _plugin_findings(text: str, where: str) -> Iterator[Finding]:
    """detect-secrets' findings: its token formats, quoted keyword assignments and quoted high-entropy
    base64 strings (not pure hex: those are SHAs and hashes)."""
    quoted = any(q in text for q in "\"'`")
    keywords = quoted and bool(_CREDENTIAL_WORD.search(text))
    for plugin in _plugins():
        name = type(plugin).__name__
        if name == "KeywordDetector" and not keywords:
            continue  # its rules need a quoted value after a keyword (and take 100 µs a text)
        if name == "Base64HighEntropyString" and not quoted:
            continue  # it reads quoted strings only
        for value in set(plugin.analyze_string(text)):
            if not value or _REFERENCE.match(value.strip()):
                continue
            if name == "Base64HighEntropyString" and (
                _HEX.match(value) or plugin.calculate_shannon_entropy(value) <= plugin.entropy_limit
            ):
                continue
            if name == "KeywordDetector" and (_VARIABLE_NAME.match(value) or not value.strip()):
                continue
            start = text.find(value)
            while start >= 0:
                yield Finding(f"a secret ({plugin.secret_type})", where, start, start + len(value))
                start = text.find(value, start + len(value))


def _rule_findings(text: str, where: str) -> Iterator[Finding]:
    """The project's rules: credential-like names with a value (assignments and flags) and token formats."""
    for pattern, kind in _TOKENS:
        for match in pattern.finditer(text):
            yield Finding(kind, where, match.start(), match.end())
    if not _CREDENTIAL_WORD.search(text):
        return
    for pattern, flag in ((_ASSIGNMENT, False), (_FLAG, True)):
        pos = 0
        while (match := pattern.search(text, pos)) is not None:
            name = match.group("name")
            group = next(g for g in ("dq", "sq", "bare") if match.group(g) is not None)
            value = match.group(group)
            if credential_name(name) and secret_value(name, value):
                yield Finding("a credential", where, match.start(group), match.end(group),
                              f"--{name}" if flag else name)  # fmt: skip
                pos = match.end()
            else:  # `stderr: HF_TOKEN=…`: the value of a plain name may hold an assignment itself
                pos = match.start(group)


_TOKEN_RUN = re.compile(r"[A-Za-z0-9_+/=-]{20,}")


def may_hold_secret(text: str, key: str = "") -> bool:
    """A cheap pre-check (no detect-secrets import): False only for texts that no rule or plugin can flag — no
    credential-like word, no token-like run of 20+ characters mixing letters and digits (bare hex aside)."""
    if not isinstance(text, str) or len(text) < MIN_TEXT:
        return False
    if key and credential_name(key):
        return True
    if _CREDENTIAL_WORD.search(text) and any(credential_name(m.group("name")) for pattern in (_ASSIGNMENT, _FLAG)
                                             for m in pattern.finditer(text)):  # fmt: skip
        return True  # prose that merely says "token" (MoE: token dropping) is not scanned
    return any(_LETTER.search(run) and re.search(r"\d", run) and not _HEX.match(run)
               for run in _TOKEN_RUN.findall(text))  # fmt: skip


def scan_text(text: str, where: str = "", key: str = "") -> list[Finding]:
    """Every secret in `text` (`key`: the document key it is the value of, if any), in order, overlaps merged."""
    if not isinstance(text, str) or not text.strip():
        return []
    found = [replace(f, where=where) for f in _scan(str(text))]
    if key and credential_name(key) and secret_value(key, text) and not found:
        start = len(text) - len(text.lstrip())
        found.append(Finding("a value under a credential-like key", where, start, len(text.rstrip()), key))
    return _merged(found)


def _merged(found: list[Finding]) -> list[Finding]:
    merged: list[Finding] = []
    for f in sorted(found, key=lambda f: (f.start, -(f.end - f.start))):
        if merged and f.start < merged[-1].end:
            continue  # inside (or across) one already found: the first, widest says it
        merged.append(f)
    return merged


@lru_cache(maxsize=8192)
def _scan(text: str) -> tuple[Finding, ...]:
    """The findings of one text (cached: a report shows the same labels and ids many times); a text too short
    or without a letter holds none."""
    if len(text) < MIN_TEXT or not _LETTER.search(text):
        return ()
    return tuple(_merged([*_rule_findings(text, ""), *_plugin_findings(text, "")]))


def mask(text: str, findings: list[Finding] | None = None) -> str:
    """`text` with every secret's value replaced by '<redacted>' (the names and the rest kept)."""
    if not isinstance(text, str):
        return text
    findings = scan_text(text) if findings is None else findings
    if not findings:
        return text
    out, last = [], 0
    for f in sorted(findings, key=lambda f: f.start):
        out += [text[last : f.start], MASK]
        last = f.end
    return "".join([*out, text[last:]])


_LONE_FLAG = re.compile(r"^--?([A-Za-z][\w-]*)$")


def item_keys(items: list[Any] | tuple[Any, ...], key: str) -> list[str]:
    """The key each item of a list is under: the list's, or for an argv the flag before it (`--wandb-key`, X)."""
    keys = []
    for i, _ in enumerate(items):
        before = items[i - 1] if i else None
        flag = _LONE_FLAG.match(before) if isinstance(before, str) else None
        keys.append(flag.group(1) if flag and credential_name(flag.group(1)) else key)
    return keys


def _walk(node: Any, path: str = "", key: str = "") -> Iterator[tuple[str, str, str]]:
    """(key path, the key the text is under, text) of every string in a document, mapping keys included."""
    if isinstance(node, dict):
        for k, value in node.items():
            child = f"{path}.{k}" if path else str(k)
            yield child, "", str(k)
            yield from _walk(value, child, str(k))
    elif isinstance(node, (list, tuple)):
        for i, (value, under) in enumerate(zip(node, item_keys(node, key), strict=True)):
            yield from _walk(value, f"{path}[{i}]", under)
    elif isinstance(node, str):
        yield path, key, node


def scan_tree(document: Any, path: str = "") -> list[Finding]:
    """Every secret in a document (cards, campaigns, configs): in each string, and each value under a
    credential-like key; `where` is the key path."""
    return [f for where, key, text in _walk(document, path) for f in scan_text(text, where, key)]


def redact_tree(document: Any, key: str = "") -> Any:
    """A copy of `document` with every secret value masked (strings keep their non-secret parts)."""
    if isinstance(document, dict):
        return {k: redact_tree(v, str(k)) for k, v in document.items()}
    if isinstance(document, (list, tuple)):
        return [redact_tree(v, k) for v, k in zip(document, item_keys(document, key), strict=True)]
    if isinstance(document, str):
        return mask(document, scan_text(document, key=key))
    return document


def problems(document: Any, what: str) -> list[str]:
    """`key.path: contains a credential (HF_TOKEN=<redacted>): <what>` for each secret in `document`."""
    return [f"{f.where or 'text'}: contains {f.describe()}: {what}" for f in scan_tree(document)]
