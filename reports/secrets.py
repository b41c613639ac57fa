"""The one secret scanner of mbx: detect-secrets' plugins (a maintained set of token formats and keyword rules)
plus the project's rules for what they miss; every string mbx refuses (campaign validate, cards, freeze) or writes
(reports, summary, W&B, status.json's log tail, launch.json) goes through it.

The project's rules: a value after a credential-like name (`WANDB_API_KEY=…`, `HF_TOKEN: …`, `"api_key": "…"`,
`--wandb-key …`, `password=hunter2`, `DB_PASS=…`, with `_`, `-` and `.` as word boundaries), the password in a URL
(`https://user:pass@host`), `[Proxy-]Authorization: Bearer …` (quoted or not), `wandb login [--host URL] KEY`
and `wandb.login(key=…)`, `-p PASS` / `-pPASS` of a login command (docker [global options] login, sshpass, mysql,
mysqladmin, singularity registry login: elsewhere `-p` is a port or `mkdir -p`), curl's `-u user:PASS`, a PEM private
key from BEGIN to END (across lines), the token formats detect-secrets lacks (`hf_…`,
`nvapi-…`, `sk-…`), and values under a credential-like key of a document. Any real value counts under a password
name (`-hunter2`, `--hunter2`, `HUNTER_TWO_2024`; an unquoted passphrase to its last word). Not secrets: a NAME
without a value (`env.pass: [WANDB_API_KEY]`), a NAME of a credential under a key/token name (`token: HF_TOKEN`;
`CLIENT_SECRET: HUNTER_TWO_2024` is a value) or a key path (`steps_key: trainer.params.train_iters`), a reference
(`$HF_TOKEN`, `${HF_TOKEN}`), a placeholder (`<your key>`, `***`), the next flag after a flag and a space
(`--token --next`, `--token -v`; `--password=--x`, `PASSWORD: --x` and `--password --Hunter2` are values), a short
number under a key/token name (`EOD_TOKEN=0`; one of 16 or more digits is a key), and bare hex (git SHAs, cell-id
hashes: only a credential-like name before a hex string makes it a key). Findings carry the kind and where (a key
path, itself masked where a mapping key is the secret), never the value (see `mask`).

Speed: texts are scanned line by line, each distinct line once, and many texts at a time (`scan_many`): every
detector has a gate, a plain pattern that any line it could flag must contain (a literal such as `://` or `eyJ`,
a credential word), searched once over all the lines joined; a detector runs only on the lines its gate marked.
Within a line every pattern is linear (tests/test_secrets.py feeds each one hostile 4 KB lines): a name and its
separator are found first, the value after it by a bisection over the line's value ends (never a read to the end of
the line per name); a value a 4 KiB window cuts is read on to its end in the whole line.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import re
import string
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

MASK = "<redacted>"

# Names whose value is a credential. `key` needs a word before it and a separator (MONKEY, hotkey, `--key` are not
# keys; APIKEY is); the other words end a name by themselves (HFTOKEN, authtoken, dbpassword).
_CREDENTIAL_NAME = re.compile(
    r"(?i)(?:[_.-]key|(?:^|[_.-])(?:(?:api|access|secret|private|auth|client|service|account)key|pwd|credentials?|"
    r"auth)|[_-]pass|token|secret|password|passwd|passphrase)$"
)
# `DB_PASS` is a password name, `env.pass` (the list of names mbx passes) is not; `-p` is one only where a login
# command gives it that meaning (see _LOGIN_PROGRAM); `wandb login` is followed by a W&B key
_PASSWORD_NAME = re.compile(r"(?i)(?:passw(?:or)?d|passphrase|pwd|[_-]pass|^-p)$")
_CONTEXT_NAMES = frozenset(
    {"-p", "wandb login", "curl -u"}
)  # names whose value a command's context makes secret
# names a value under which is a credential whatever its form, even one lower-case word (`HF_TOKEN: abcdefghijk`,
# `CLIENT_SECRET: supersecretvalue`); under any other credential-like name (`steps_key`, `sort_key`) such a word is
# a key path. The special tokens of a tokenizer (`eos_token: endoftext`) are no credentials.
_STRONG_NAME = re.compile(
    r"(?i)(?:token|secret|passw(?:or)?d|passphrase|pwd|[_-]pass|"
    r"(?:^|[_.-])(?:api|access|secret|private|auth|client|service|account|wandb|encryption|signing|master)[_.-]?key)$"
)
_SPECIAL_TOKEN = re.compile(
    r"(?i)(?:^|[_.-])(?:bos|eos|eod|pad|unk|sep|cls|mask|start|end|image|video|audio)[_-]?token$"
)
# the start of a name: not after a word character, '-' or '.', nor after '$' / '{' (a reference like ${HF_TOKEN});
# a name is at most 128 characters (no line of any length makes the search slow)
_NAME = r"(?<![\w.$\{-])(?P<name>[A-Za-z_][\w.-]{0,127}?)"
# a name and its separator (`NAME=`, `name: `, `"name": `); the value after it is read by _Values
_ASSIGNMENT = re.compile(_NAME + r"[\"']?\s*(?::=|=|:)[ \t]*")
_FLAG = re.compile(r"(?<![\w-])--(?P<name>[A-Za-z][\w-]{0,127})(?P<sep>=|[ \t]+)")
_BARE_END = re.compile(r"[\s\"',;)\]}]")  # what ends an unquoted value
# the further words of a passphrase (`PASSWORD=correct horse battery staple`), up to a flag, an assignment, a
# quote or a shell operator
_MORE_WORDS = re.compile(r"(?:[ \t]++[^\s\"'`=;&|<>-][^\s\"'`=;&|<>]*+(?![^\s]))*+")
_URL_PASSWORD = re.compile(r"://[^\s:/?#@\[\]]+:(?P<password>[^\s/?#@\[\]]+)@")
_AUTHORIZATION = re.compile(  # `Authorization: Bearer …` (any scheme, the value quoted or not), a lone `Bearer …`
    r"(?i)(?<![\w-])(?:(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
    r"(?:(?:bearer|basic|token|bot|digest)[ \t]+[\"']?)?|bearer[ \t]+[\"']?)(?P<value>[A-Za-z0-9._~+/=-]+)"
)
# `wandb login [--relogin] [--host URL] KEY`: the words after `wandb login` are read one by one (_shell_words), never
# by one pattern repeating a group whose branches overlap (`--host=x` matched both ways: exponential time)
_WANDB_LOGIN = re.compile(r"(?i)(?<![\w-])wandb[ \t]+login(?![\w-])")
_WANDB_LOGIN_VALUED = frozenset({"--host"})  # its options that take the next word as their value
_WANDB_CALL = re.compile(
    r"(?<![\w.])wandb\.login\((?:[^()\n]{0,200}?[(, \t])?key[ \t]*=[ \t]*"
)  # wandb.login(key=…)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+$")  # an unquoted literal key, not a Python expression
_SHELL_WORD = re.compile(
    r"[ \t]++(?:\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'`;|&<>]++)"
)  # the next word, quoted or bare
# commands whose `-p` is a password (docker login -u me -p …, sshpass -p …, mysql -p…); elsewhere `-p` is a port,
# a path option (mkdir -p) or anything else
_LOGIN_PROGRAMS = ("sshpass", "mysql", "mysqldump", "mysqladmin", "mysqlcheck", "mysqlimport", "mysqlshow",
                   "mysqlpump", "mariadb", "mariadb-dump", "mariadb-admin")  # fmt: skip
_REGISTRY_CLIENTS = ("docker", "podman", "nerdctl", "buildah", "skopeo", "helm", "oras", "apptainer", "singularity",
                     "oc", "cf", "az")  # fmt: skip
_LOGIN_SUBCOMMANDS = ("registry", "acr")  # `singularity registry login`, `az acr login`
# a registry client's `login`, after at most 4 global options (`docker --config /x -H tcp://h login`), each option
# one word with at most one argument that does not start with '-' (no two ways to read the same words)
_LOGIN_PROGRAM = re.compile(
    rf"(?<![\w.-])(?:{'|'.join(_LOGIN_PROGRAMS)}|(?:{'|'.join(_REGISTRY_CLIENTS)})"
    rf"(?:[ \t]+-[^\s;|&]+(?:[ \t]+[^\s;|&-][^\s;|&]*)?){{0,4}}?[ \t]+(?:(?:{'|'.join(_LOGIN_SUBCOMMANDS)})[ \t]+)?"
    r"login)(?![\w.-])"
)
_COMMAND_END = re.compile(r"[;|&\n]")  # a shell command ends here: a `-p` after it is another command's
_P_FLAG = re.compile(
    r"(?<!\S)-p(?:[ \t]*(?:\"(?P<dq>[^\"\n]*)\"|'(?P<sq>[^'\n]*)')|[ \t]+(?P<spaced>[^\s\"'`;|&<>]+)|"
    r"(?P<joined>[^\s\"'`;|&<>-][^\s\"'`;|&<>]*))"
)
_CURL = re.compile(r"(?<![\w.-])curl(?![\w.-])")
# curl's `-u user:password` (`--user`, `--proxy-user`, `-U`): the password after the first ':'
_USER_FLAG = re.compile(
    r"(?<!\S)(?:-[uU][ \t]*|--(?:proxy-)?user(?:=|[ \t]+))(?:\"(?P<dq>[^\"\n]*)\"|'(?P<sq>[^'\n]*)'|"
    r"(?P<bare>[^\s\"'`;|&<>-][^\s\"'`;|&<>]*))"
)
_USER_FLAGS = ("-u", "-U", "--user", "--proxy-user")
# a PEM private key: from its BEGIN line to its END line (a body of base64 lines names nothing a rule would see)
_PEM_BEGIN = re.compile(r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_TOKENS = (  # formats detect-secrets 1.5 does not know
    (re.compile(r"(?<![\w-])hf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
    (re.compile(r"(?<![\w-])nvapi-[A-Za-z0-9_-]{20,}"), "an NGC API key"),
    (re.compile(r"(?<![\w-])sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"), "an API secret key (sk-…)"),
    (re.compile(r"(?<![\w-])github_pat_\w{20,}|(?<![\w-])gh[pousr]_[A-Za-z0-9]{30,}"), "a GitHub token"),
)
_REFERENCE = re.compile(r"^(?:\$\{?\w+\}?|%\(\w+\)s|\{\{.*\}\}|<[^<>]*>|\*+|x{3,}|\.{3}|…|none|null|true|false)$",
                        re.IGNORECASE)  # fmt: skip
_VARIABLE_NAME = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")  # a NAME (HF_TOKEN), not a value
_KEY_PATH = re.compile(
    r"^[a-z]+(?:[_.-][a-z]+)*$"
)  # `steps_key: trainer.params.train_iters`: a name, not a key
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?$", re.IGNORECASE)  # `\d+\.?\d*`: quadratic
# after a flag and a space, the next flag (`--token --next-flag`, `--token -v`): no value given; a value that only
# starts with dashes (`--db-password=--hunter2`, `DB_PASSWORD: --hunter2`, `--password --Hunter2`) is one
_NEXT_FLAG = re.compile(r"^--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*(?:=.*)?$|^-[A-Za-z]$")
MIN_TEXT = 6  # the shortest text that can hold a secret with its name (pwd=x1) or a token
MIN_KEY_LENGTH = 8  # a value after a key/token/secret name shorter than this is a word, not a credential
MIN_WORD_KEY = (
    12  # letters: one lower-case word this long under a token/secret name is a key (shorter: a word)
)
MIN_NUMERIC_KEY = 16  # digits: a number this long under a key/token name is a key (an all-digit API key)
# detect-secrets plugins not used: IPPublicDetector (addresses are not credentials; version strings match it),
# HexHighEntropyString (a git SHA is high-entropy hex), KeywordDetector's unquoted rules (prose such as
# "secrets: passed by name" matches them; the project's rules cover unquoted assignments precisely).
# NpmDetector and OpenAIDetector (`//.+/:_authToken`, `sk-[…]*[…]{20}T3BlbkFJ` read from every `//` or `sk-` to the
# line's end: quadratic; the project's rules find `_authToken=…` by its name and `sk-…` by its format).
_SKIPPED_PLUGINS = {"IPPublicDetector", "HexHighEntropyString", "Base64HighEntropyString", "KeywordDetector",
                    "NpmDetector", "OpenAIDetector"}  # fmt: skip
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_LETTER = re.compile(r"[A-Za-z]")


# Gates of detect-secrets 1.5's regex plugins: texts every match of the plugin contains, found by `str.find` (a
# `_Fold` text in the lower-cased lines) or a plain pattern (no anchors, no look-around, never a newline), keyed by
# the fingerprint of the plugin's patterns; a plugin whose patterns changed (another detect-secrets) has no gate
# and runs on every line.
class _Fold(str):
    """A gate text found whatever its case."""


def _folded(*words: str) -> tuple[_Fold, ...]:
    return tuple(_Fold(w) for w in words)


@dataclass(frozen=True)
class _Low:
    """A gate pattern searched in the lower-cased lines."""

    pattern: re.Pattern[str]


def _low(pattern: str) -> _Low:
    return _Low(re.compile(pattern))


# between a keyword and its value in the plugins below (their ` *(?:=|:| +|…) *` backtracks in cubic time over a
# run of spaces; this reads each space once and matches all they match)
_OPERATOR = r"[\"']?\]? *+(?:(?:=|:|:=|=>|::) *+)?[\"']?"
Probe = str | re.Pattern[str] | _Low
_CREDENTIAL_PROBES = _folded("key", "token", "secret", "pass", "pwd", "credential", "auth", "contrase")
_CREDENTIAL_WORD = re.compile("|".join(_CREDENTIAL_PROBES))  # in lower-cased text
_RULE_GATE = (  # a name ending in a credential word, then an assignment (`=`, `:`) or a flag's `=` or space
    _low(
        r"(?:key|token|secret|pass|passwd|passphrase|password|pwd|credentials?|auth)(?:[\"']?\s*+[:=]|[ \t])"
    ),
)
_PLUGIN_GATES: dict[str, tuple[str, tuple[Probe, ...]]] = {
    "AWSKeyDetector": ("a3de395ccbea", ("A3T", "ABIA", "ACCA", "AKIA", "ASIA", _Fold("aws"))),
    "ArtifactoryDetector": ("0c5c39fd5128", (re.compile(r"AKC[a-zA-Z0-9]{10}"), re.compile(r"AP[0-9A-F][a-zA-Z0-9]{8}"))),
    "AzureStorageKeyDetector": ("9ee83ce9f5d7", ("AccountKey=",)),
    "BasicAuthDetector": ("8feccd16a017", ("://",)),
    "CloudantDetector": ("85a2ec165338", (_low(r"cl(?:oudant|ou)?[_-]?(?:api)?(?:key|pw|pass|token)"),
                                          _Fold("cloudant.com"))),
    "DiscordBotTokenDetector": ("63144c6b4246", (re.compile(r"\.[a-zA-Z0-9_-]{6}\."),)),
    "GitHubTokenDetector": ("71f04fb52374", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    "GitLabTokenDetector": ("e4080592beaf", ("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "GR1348941", "glcbt-",
                                             "glimt-", "glptt-", "glagent-")),
    "IbmCloudIamDetector": ("60bd1dd078d5", (_low(r"(?:key|pwd|password|pass|token)" + _OPERATOR + r"[a-z0-9_-]{44}"),)),
    "IbmCosHmacDetector": ("c28db5195f6c", (_low(r"secret[-_]?(?:access)?[-_]?key" + _OPERATOR + r"[a-f0-9]{48}"),)),
    "JwtTokenDetector": ("5b431cb0e5b6", ("eyJ",)),
    "MailchimpDetector": ("5ecaecf8ee35", ("-us",)),
    "PrivateKeyDetector": ("36155a4d3106", ("BEGIN",)),
    "PypiTokenDetector": ("b7dc9b5b2e1f", ("pypi-Ag",)),
    "SendGridDetector": ("aaa7166b7908", ("SG.",)),
    "SlackDetector": ("87010511eb46", _folded("xox", "hooks.slack.com")),
    "SoftlayerDetector": ("5097ccd63f05", (_low(r"softlayer|sl[_-]?(?:api)?[_-]?(?:key|pwd|pass|token)"),)),
    "SquareOAuthDetector": ("e3ab08a5c9f2", ("sq0csp-",)),
    "StripeDetector": ("e2e384dcf3be", ("k_live_",)),
    "TelegramBotTokenDetector": ("2e096b281cd1", (re.compile(r":[0-9A-Za-z_-]{35}"),)),
    "TwilioKeyDetector": ("581d0291eff5", (re.compile(r"AC[a-z0-9]{32}"), re.compile(r"SK[a-z0-9]{32}"))),
}  # fmt: skip
# KeywordDetector's patterns: a word holding one of its keywords (api_key, db_pass, password, secret, …), then `:`,
# `=`, `=>`, `==`, `!=` and a quote, or a quoted value compared (`==`) with one, or a quoted value and `;` after one.
_KEYWORD_PROBES = _folded(*(f"{word}{sep}{tail}" for word in ("api", "auth", "service", "account", "db", "database",
                                                              "priv", "private", "client") for sep in ("", "_")
                            for tail in ("key",)), "db_pass", "dbpass", "database_pass", "databasepass", "key_pass",
                          "keypass", "passw", "pwd", "secret", "contrase")  # fmt: skip
_KEYWORD_WORDS = re.compile("|".join(_KEYWORD_PROBES))  # in a lower-cased word
# a word (each word read once: a keyword then `\w*` from every keyword of a long word is quadratic) and the
# assignment after it
_KEYWORD_ASSIGNMENT = re.compile(r"(?<!\w)(\w++)[\]'\"]{0,2}\s*+[:=!>]{1,3}\s*+[\"'`]")
_WORD_RUN = re.compile(r"\w{257,}+")
MAX_KEYWORDS_IN_A_WORD = (
    8  # more in one long word: KeywordDetector's patterns take quadratic time, no name is one
)
_KEYWORD_ALSO = (('"', "'", "`"), (":", "=", ";"))  # ... in a line with a quote and one of these
# Base64HighEntropyString reads quoted base64 strings; an entropy above its limit (4.5 bits) needs 23 characters.
_QUOTED_RUNS = (re.compile(r"\"[A-Za-z0-9+/\\_=-]{23}"), re.compile(r"'[A-Za-z0-9+/\\_=-]{23}"))
_SPACE_RUN = re.compile(r"   +")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

Hit = tuple[str, int, int, str]  # (kind, start, end, the name the value was under or "") within one line


class Finding(NamedTuple):
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


@lru_cache(maxsize=1 << 14)
def credential_name(name: str) -> bool:
    """Whether `name` (an env variable, a key, a flag with or without its dashes) names a credential."""
    if name in _CONTEXT_NAMES:
        return True
    if len(name) > 256 or not _CREDENTIAL_WORD.search(name.lower()):
        return False  # every credential name holds one of these words (and the search for them is quicker)
    return bool(_CREDENTIAL_NAME.search(name.strip().strip("\"'[]").lstrip("-")))


def secret_value(name: str, value: str) -> bool:
    """Whether `value` under the credential-like `name` is a secret: not a reference or placeholder, nor the next
    flag where `name` is a flag followed by a space (`--token --next`: a name starting with '-'); under a password
    name any other value; under a key/token name not a NAME passed by name (`token: HF_TOKEN`, `wandb_api_key`; a
    NAME that names no credential, `HUNTER_TWO_2024`, is a value), a dotted key path (`model.key_size`), a short
    number or a short word; one lower-case word is a key path only under a name that is not clearly a credential's
    (`steps_key: iteration`; `HF_TOKEN: abcdefghijklm` is a key)."""
    value = value.strip().strip("`")  # `token: HF_TOKEN` in Markdown: the backticks are not the value's
    if not value or _REFERENCE.match(value) or (name.startswith("-") and _NEXT_FLAG.match(value)):
        return False
    if name == "curl -u":  # `user:password`: a secret where a password follows the user
        return ":" in value and secret_value("password", value.split(":", 1)[1])
    if _PASSWORD_NAME.search(name):
        return True
    if (
        (_VARIABLE_NAME.match(value.upper()) and credential_name(value))
        or (_KEY_PATH.match(value) and ("." in value or len(value) < MIN_WORD_KEY or not _strong_name(name)))
        or (_NUMBER.match(value) and len(value) < MIN_NUMERIC_KEY)
    ):
        return False
    return len(value) >= MIN_KEY_LENGTH


def _strong_name(name: str) -> bool:
    """A name whose value is a credential whatever its form (see _STRONG_NAME)."""
    name = name.strip().strip("\"'[]").lstrip("-")
    return bool(_STRONG_NAME.search(name)) and not _SPECIAL_TOKEN.search(name)


# ---- detectors: a gate and what finds the secrets of one line --------------------------------------------------
@dataclass(frozen=True)
class _Detector:
    gate: tuple[Probe, ...] | None  # a line it can flag holds one of these; None: every line
    find: Callable[[str], Iterable[Hit]]
    also: tuple[tuple[Probe, ...], ...] = ()  # ... and one of each of these too


class _Values:
    """Where the value after a position of one line is, from the line's quotes and value ends indexed once: finding
    a value costs a bisection, never a read to its end (a line of nested `a=b=c=…` stays linear)."""

    def __init__(self, line: str):
        self.line = line
        self.ends = [m.start() for m in _BARE_END.finditer(line)]
        self.quotes: dict[str, list[int]] = {}

    def at(self, pos: int) -> tuple[int, int, bool] | None:
        """(start, end, unquoted) of the value at `pos`: a quoted string (an unclosed quote: to the line's end, as
        where a window cut the line) or a bare run."""
        quote = self.line[pos : pos + 1]
        if quote in ('"', "'"):
            if quote not in self.quotes:
                self.quotes[quote] = [m.start() for m in re.finditer(quote, self.line)]
            quotes = self.quotes[quote]
            close = bisect.bisect_right(quotes, pos)
            return (pos + 1, quotes[close] if close < len(quotes) else len(self.line), False)
        after = bisect.bisect_left(self.ends, pos)
        end = self.ends[after] if after < len(self.ends) else len(self.line)
        return (pos, end, True) if end > pos else None


def _rule_hits(line: str) -> Iterator[Hit]:
    """Credential-like names with a value: assignments (`NAME=v`, `name: v`, `"name": "v"`) and flags; an unquoted
    password runs to the end of its words (`PASSWORD=correct horse battery staple`)."""
    values: _Values | None = None
    for pattern, flag in ((_ASSIGNMENT, False), (_FLAG, True)):
        resume = 0  # the end of the last secret: a name inside it is part of it
        for head in pattern.finditer(line):  # `stderr: HF_TOKEN=…`: a plain name's value holds one
            name = head.group("name")
            if head.start() < resume or not credential_name(name):
                continue
            values = values or _Values(line)
            found = values.at(head.end())
            if found is None:
                continue
            start, end, unquoted = found
            spaced = flag and unquoted and head.group("sep") != "="  # `--token --next`: may be the next flag
            if secret_value(f"--{name}" if spaced else name, line[start:end]):
                if unquoted and _PASSWORD_NAME.search(name):
                    end = _MORE_WORDS.match(line, end).end()  # type: ignore[union-attr]  # always matches
                yield "a credential", start, end, f"--{name}" if flag else name
                resume = end


def _context_hits(line: str) -> Iterator[Hit]:
    """Secrets a command's words make: `Authorization: Bearer …`, `wandb login KEY`, `wandb.login(key=…)`, `-p PASS`
    of a login command (docker login, sshpass, mysql) and curl's `-u user:PASS` in the same shell command."""
    for match in _AUTHORIZATION.finditer(line):
        if secret_value("Authorization", match.group("value")):  # a lower-case word: prose (`bearer tokens`)
            yield "an HTTP credential", match.start("value"), match.end("value"), "Authorization"
    yield from _wandb_login_hits(line)
    logins = [m.start() for m in _LOGIN_PROGRAM.finditer(line)]
    if logins:
        for _, start, end in _flags_in_command(line, logins, _P_FLAG, ("dq", "sq", "spaced", "joined")):
            if secret_value("-p", line[start:end]):
                yield "a password (-p of a login command)", start, end, "-p"
    curls = [m.start() for m in _CURL.finditer(line)]
    if curls:
        for _, start, end in _flags_in_command(line, curls, _USER_FLAG, ("dq", "sq", "bare")):
            colon = line.find(":", start, end)
            if colon >= 0 and secret_value("password", line[colon + 1 : end]):
                yield "a password (curl -u user:password)", colon + 1, end, ""


def _wandb_login_hits(line: str) -> Iterator[Hit]:
    """The key of `wandb login [options] KEY` (quoted or not; `--host URL` skipped) and of `wandb.login(key=…)`."""
    for match in _WANDB_LOGIN.finditer(line):
        pos, skip = match.end(), False
        while (
            word := _SHELL_WORD.match(line, pos)
        ) is not None:  # to the first word that is no option: linear
            pos, text = word.end(), word.group().lstrip(" \t")
            if skip or text.startswith("-"):  # an option, or the value of one (`--host URL`)
                skip = not skip and text.lower() in _WANDB_LOGIN_VALUED
                continue
            quoted = text[0] in "\"'"
            start, end = word.end() - len(text) + quoted, word.end() - quoted
            if secret_value("wandb login", line[start:end]):
                yield "a W&B API key", start, end, "wandb login"
            break
    values: _Values | None = None
    for match in _WANDB_CALL.finditer(line):
        values = values or _Values(line)
        found = values.at(match.end())
        literal = found and (
            not found[2] or _BARE_KEY.match(line, found[0], found[1])
        )  # not `key=os.environ[…]`
        if literal and secret_value("wandb login", line[found[0] : found[1]]):
            yield "a W&B API key", found[0], found[1], "wandb.login(key=…)"


def _flags_in_command(
    line: str, programs: list[int], flag: re.Pattern[str], groups: tuple[str, ...]
) -> Iterator[tuple[re.Match[str], int, int]]:
    """(match, value start, value end) of each `flag` that follows one of `programs` (their starts) in its shell
    command (after the last `;`, `|`, `&` before it)."""
    ends = [m.start() for m in _COMMAND_END.finditer(line)]
    for match in flag.finditer(line):
        command_start = ends[i - 1] if (i := bisect.bisect_left(ends, match.start())) else -1
        program = bisect.bisect_left(programs, command_start)
        if program == len(programs) or programs[program] > match.start():
            continue  # no such program before this flag in its shell command
        group = next(g for g in groups if match.group(g) is not None)
        yield match, match.start(group), match.end(group)


def _url_hits(line: str) -> Iterator[Hit]:
    for match in _URL_PASSWORD.finditer(line):
        if not _REFERENCE.match(match.group("password")):
            yield (
                "a password in a URL (user:password@host)",
                match.start("password"),
                match.end("password"),
                "",
            )


PEM_KIND = "a private key (PEM)"


def _pem_hits(line: str) -> Iterator[Hit]:
    """A PEM private key within a line (a JSON string's `\\n`): from its BEGIN to its END or to the line's end."""
    for start, end, kind, name, _ in _pem_blocks(line):
        yield kind, start, end, name


def _token_hits(line: str) -> Iterator[Hit]:
    for pattern, kind in _TOKENS:
        for match in pattern.finditer(line):
            yield kind, match.start(), match.end(), ""


def _value_hits(line: str, values: Iterable[str], kind: str) -> Iterator[Hit]:
    for value in set(values):
        start = line.find(value) if value else -1
        while start >= 0:
            yield kind, start, start + len(value), ""
            start = line.find(value, start + len(value))


def _keyword_assignment(line: str) -> bool:
    """Whether a word holding one of KeywordDetector's keywords is followed by an assignment and a quote."""
    return any(_KEYWORD_WORDS.search(m.group(1).lower()) for m in _KEYWORD_ASSIGNMENT.finditer(line))


def _keyword_bomb(line: str) -> bool:
    r"""A word of over 256 characters holding many keywords (`secretsecret…: "x"`): KeywordDetector's `keyword\w*`
    would read it from each keyword to its end (seconds a line); no credential's name looks like that."""
    return any(
        sum(word.count(k) for k in _KEYWORD_PROBES) > MAX_KEYWORDS_IN_A_WORD
        for word in (m.group().lower() for m in _WORD_RUN.finditer(line))
    )


def _entropy_above(plugin: Any, value: str) -> bool:
    """detect-secrets' Shannon entropy of `value` above the plugin's limit; a string of k distinct characters has at
    most log2(k) bits, so most short strings need no count (the plugin counts each of its 64 characters)."""
    return math.log2(len(set(value))) > plugin.entropy_limit and (
        plugin.calculate_shannon_entropy(value) > plugin.entropy_limit
    )


def _plugin_detector(plugin: Any) -> _Detector:
    """One detect-secrets plugin as a detector: its findings less references, NAMEs (keywords) and pure hex or
    low-entropy strings (base64), with its gate."""
    name = type(plugin).__name__
    kind = f"a secret ({plugin.secret_type})"
    if name == "KeywordDetector":  # its rules need a quoted value after a keyword (and take ~40 µs a line)

        def keyword(line: str) -> Iterator[Hit]:
            if not (_keyword_assignment(line) or "==" in line or ";" in line) or _keyword_bomb(line):
                return  # none of its patterns can match (they take ~40 µs a line to say so), or they would be slow
            found = [v for v in plugin.analyze_string(line)
                     if v.strip() and not _REFERENCE.match(v.strip()) and not _VARIABLE_NAME.match(v)]  # fmt: skip
            yield from _value_hits(line, found, kind)

        return _Detector(_KEYWORD_PROBES, keyword, also=_KEYWORD_ALSO)
    if name == "Base64HighEntropyString":

        def base64(line: str) -> Iterator[Hit]:
            found = [v for v in plugin.analyze_string(line) if v and not _REFERENCE.match(v.strip())
                     and not _HEX.match(v) and _entropy_above(plugin, v)]  # fmt: skip
            yield from _value_hits(line, found, kind)

        return _Detector(_QUOTED_RUNS, base64)
    patterns = repr([(r.pattern, r.flags) for r in getattr(plugin, "denylist", ())])
    fingerprint, gate = _PLUGIN_GATES.get(name, ("", ()))
    known = gate and hashlib.sha256(patterns.encode()).hexdigest()[:12] == fingerprint
    if name == "JwtTokenDetector" and known:
        return _Detector(gate, _jwt_findings(plugin, kind))

    def findings(line: str) -> Iterator[Hit]:
        spaced = _SPACE_RUN.sub("  ", line)  # their values hold no spaces; their `' *'`s are cubic over many
        found = [v for v in plugin.analyze_string(spaced) if v and not _REFERENCE.match(v.strip())]
        yield from _value_hits(line, found, kind)

    return _Detector(gate if known else None, findings)


_RULES = (  # a token's format says more than the name it is under: first, where both find one value
    _Detector(("hf_", "nvapi-", "sk-", "github_pat_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_"), _token_hits),
    _Detector(_RULE_GATE, _rule_hits),
    _Detector(("://",), _url_hits),
    _Detector(_folded("bearer", "authorization", "login", "curl", *_LOGIN_PROGRAMS), _context_hits),
    _Detector(("PRIVATE KEY",), _pem_hits),
)
# Without detect-secrets imported: a line its plugins may flag holds one of these (with keyword's `also`).
_PLUGIN_GATES_UNLOADED = (*((gate, ()) for _, gate in _PLUGIN_GATES.values()), (_KEYWORD_PROBES, _KEYWORD_ALSO),
                          (_QUOTED_RUNS, ()))  # fmt: skip


_JWT_HEAD = re.compile(r"[A-Za-z0-9_=-]+")  # the characters of a JWT's first part, up to its `.`


def _jwt_findings(plugin: Any, kind: str) -> Callable[[str], Iterator[Hit]]:
    """detect-secrets' JWT plugin read in linear time: its pattern (`eyJ[…]+\\.[…]+…`) tried from every `eyJ` of a
    run reads on to the run's end (quadratic over `eyJeyJ…`); here it is matched once, from the first `eyJ` of each
    run that a `.` ends, and the plugin checks only what that match covers (its JSON header)."""
    pattern = plugin.denylist[0]

    def findings(line: str) -> Iterator[Hit]:
        found: list[str] = []
        done = 0
        for run in _JWT_HEAD.finditer(line):
            start = line.find("eyJ", run.start(), run.end())
            if run.start() < done or start < 0 or line[run.end() : run.end() + 1] != ".":
                continue
            match = pattern.match(line, start)
            if match is not None:
                done = match.end()
                found += [v for v in plugin.analyze_string(match.group()) if v and not _REFERENCE.match(v.strip())]
        yield from _value_hits(line, found, kind)

    return findings


@lru_cache(maxsize=1)
def _plugin_detectors() -> tuple[_Detector, ...]:
    """detect-secrets' plugins as detectors (imported here, once: the package loads requests, ~0.5 s); none where
    the package is missing (a compute node's Python masking a log tail: the project's rules alone)."""
    try:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
        from detect_secrets.plugins.keyword import KeywordDetector
    except ImportError:
        return ()

    classes = get_mapping_from_secret_type_to_class().values()
    plugins = [c() for c in sorted(classes, key=lambda c: c.__name__) if c.__name__ not in _SKIPPED_PLUGINS]
    return tuple(_plugin_detector(p) for p in (*plugins, KeywordDetector(), Base64HighEntropyString()))


GATES_WRITTEN_FOR = "1.5.0"  # the detect-secrets whose plugins _PLUGIN_GATES describes


@lru_cache(maxsize=1)
def _gates_fit_installed_plugins() -> bool:
    """Whether the installed detect-secrets is the one the gates were written for (read without importing it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("detect-secrets") == GATES_WRITTEN_FOR
    except PackageNotFoundError:
        return False


# ---- scanning lines, each distinct line once ---------------------------------------------------------------------
_MEMO: dict[str, tuple[Hit, ...]] = {}  # line -> its hits (a report shows the same labels and ids many times)
MEMO_LINES = 1 << 16
# A line longer than WINDOW is scanned as overlapping windows (a secret with its name is far shorter than the
# overlap): no detector's pattern ever runs over more than WINDOW characters, so no line makes a scan slow.
WINDOW = 4096
WINDOW_STEP = 3072


def _pieces(text: str) -> Iterator[tuple[int, str]]:
    """(offset, piece) of every line of `text`, a long line as overlapping windows."""
    for offset, piece, _ in _windows(text):
        yield offset, piece


def _windows(text: str) -> Iterator[tuple[int, str, int]]:
    """(offset, piece, the end of its line) of every line of `text`, a long line as overlapping windows."""
    offset = 0
    for line in text.split("\n") if "\n" in text else (text,):
        end = offset + len(line)
        if len(line) <= WINDOW:
            yield offset, line, end
        else:
            for start in range(0, len(line) - WINDOW + WINDOW_STEP, WINDOW_STEP):  # the last reaches the end
                yield offset + start, line[start : start + WINDOW], end
        offset = end + 1


def _hits_of(texts: Iterable[str]) -> dict[str, tuple[Hit, ...]]:
    """line -> its hits, for every line of `texts` that holds a secret. Each gate probe is searched once over the
    distinct texts joined (no probe matches a newline); a detector runs on the lines one of its probes marked,
    each line once (and a line seen before not again: _MEMO). Texts no gate marks need no detect-secrets import."""
    texts = texts if isinstance(texts, list) else list(texts)
    short = [text for text in texts if len(text) <= WINDOW and "\n" not in text]  # the common case: one piece
    long = [piece for text in texts if len(text) > WINDOW or "\n" in text for _, piece in _pieces(text)]
    if len(short) + len(long) <= FEW_LINES:  # a page's one value: each line alone, remembered (_line_hits)
        return {line: hits for line in (*short, *long) if (hits := _line_hits(line))}
    lines = _Lines(short + long if long else short)
    plugins = not _gates_fit_installed_plugins() or any(
        lines.marked(gate, also) for gate, also in _PLUGIN_GATES_UNLOADED
    )
    marked: dict[int, list[_Detector]] = {}
    for detector in (*_RULES, *(_plugin_detectors() if plugins else ())):
        for index in lines.marked(detector.gate, detector.also):
            marked.setdefault(index, []).append(detector)
    known: dict[str, tuple[Hit, ...]] = {}
    for index, detectors in marked.items():
        line = lines.lines[index]
        if not _worth(line):
            continue
        hits = _MEMO.get(line)
        if hits is None:
            hits = tuple(_merged_hits([hit for detector in detectors for hit in detector.find(line)]))
            if len(_MEMO) >= MEMO_LINES:
                _MEMO.clear()
            _MEMO[line] = hits
        if hits:
            known[line] = hits
    return known


FEW_LINES = 16  # fewer lines than this are scanned one by one (the batch's joining costs more)


@lru_cache(maxsize=1 << 14)
def _line_hits(line: str) -> tuple[Hit, ...]:
    """The hits of one line (at most WINDOW characters, no newline), each gate tested on it directly."""
    if not _worth(line):
        return ()
    lowered = line.lower() if line.isascii() else line.translate(_ASCII_LOWER)

    def holds(probes: tuple[Probe, ...]) -> bool:
        for probe in probes:
            if isinstance(probe, _Fold):
                found = probe in lowered
            elif isinstance(probe, str):
                found = probe in line
            else:
                found = (
                    probe.pattern.search(lowered) if isinstance(probe, _Low) else probe.search(line)
                ) is not None
            if found:
                return True
        return False

    def marked(gate: tuple[Probe, ...] | None, also: tuple[tuple[Probe, ...], ...]) -> bool:
        return (gate is None or holds(gate)) and all(holds(group) for group in also)

    plugins = not _gates_fit_installed_plugins() or any(marked(g, a) for g, a in _PLUGIN_GATES_UNLOADED)
    detectors = [d for d in (*_RULES, *(_plugin_detectors() if plugins else ())) if marked(d.gate, d.also)]
    return tuple(_merged_hits([hit for detector in detectors for hit in detector.find(line)]))


class _Lines:
    """The lines of the distinct texts, joined (and lower-cased) once, with the lines each gate probe marks."""

    def __init__(self, texts: Iterable[str]):
        self.joined = "\n".join(dict.fromkeys(texts))
        self.lowered = self.joined.lower() if self.joined.isascii() else self.joined.translate(_ASCII_LOWER)
        self.lines = self.joined.split("\n")
        self.starts = list(itertools.accumulate((len(line) + 1 for line in self.lines), initial=0))
        self._lowered_lines: list[str] = []
        self._marks: dict[Probe, set[int]] = {}

    def marked(self, gate: tuple[Probe, ...] | None, also: tuple[tuple[Probe, ...], ...] = ()) -> set[int]:
        """The indexes of the lines holding one of the gate's probes and one of each `also` group's; every line
        without a gate."""
        out = set(range(len(self.lines))) if gate is None else self._any(gate)
        for group in also:
            out &= self._any(group) if out else set()
        return out

    def _any(self, probes: tuple[Probe, ...]) -> set[int]:
        out: set[int] = set()
        for probe in probes:
            if probe not in self._marks:
                self._marks[probe] = self._probe(probe)
            out |= self._marks[probe]
        return out

    def _probe(self, probe: Probe) -> set[int]:
        fold = isinstance(probe, (_Fold, _Low))
        text = self.lowered if fold else self.joined
        probe = probe.pattern if isinstance(probe, _Low) else probe
        if isinstance(probe, str) and len(self.lines) > 64:
            count = text.count(probe)
            if count == 0:
                return set()
            if count > len(self.lines) // 8:  # in many lines: test each line (cheaper than a find per hit)
                if fold and not self._lowered_lines:
                    self._lowered_lines = self.lowered.split("\n")
                return {
                    i for i, line in enumerate(self._lowered_lines if fold else self.lines) if probe in line
                }
        marks: set[int] = set()
        pos = 0
        while True:
            if isinstance(probe, str):
                at = text.find(probe, pos)
            else:
                match = probe.search(text, pos)
                at = -1 if match is None else match.start()
            if at < 0:
                return marks
            index = bisect.bisect_right(self.starts, at) - 1
            marks.add(index)
            pos = self.starts[index + 1]


def _worth(line: str) -> bool:
    """A line too short or without a letter holds no secret (a lone number is not one without its name)."""
    return len(line) >= MIN_TEXT and _LETTER.search(line) is not None


def _merged_hits(hits: list[Hit]) -> list[Hit]:
    """The hits in order, overlapping ones joined (the first, widest names it; the union is masked)."""
    merged: list[Hit] = []
    for hit in sorted(hits, key=lambda h: (h[1], -(h[2] - h[1]))):
        if merged and hit[1] < merged[-1][2]:
            if hit[2] > merged[-1][2]:  # across the end of one already found: the union is the secret
                merged[-1] = (*merged[-1][:2], hit[2], merged[-1][3])
            continue
        merged.append(hit)
    return merged


def _text_findings(text: str, where: str, key: str, hits: dict[str, tuple[Hit, ...]]) -> list[Finding]:
    """The findings of one text from its lines' hits, in order; a whole value under a credential-like key when
    no line holds one."""
    found: list[Finding] = []
    if hits and len(text) <= WINDOW and "\n" not in text:  # one piece (the common case)
        found = [Finding(kind, where, start, end, name) for kind, start, end, name in hits.get(text, ())]
    elif hits:
        found = _long_text_findings(text, where, hits)
    if not found and key and credential_name(key) and secret_value(key, text):
        start = len(text) - len(text.lstrip())
        found.append(Finding("a value under a credential-like key", where, start, len(text.rstrip()), key))
    return found


def _long_text_findings(text: str, where: str, hits: dict[str, tuple[Hit, ...]]) -> list[Finding]:
    """The findings of a text of several lines or windows: a value a window cut at its end read on to its end in
    the whole line (`_value_end`), a private key from its BEGIN to its END line, overlaps joined."""
    spans = []  # (start, end, kind, name, cut: the hit reaches the end of a window that does not end its line)
    for offset, piece, line_end in _windows(text):
        cut = offset + len(piece) < line_end
        spans += [(offset + start, offset + end, kind, name, cut and end == len(piece))
                  for kind, start, end, name in hits.get(piece, ())]  # fmt: skip
    if "PRIVATE KEY" in text:
        spans += _pem_blocks(text)
    spans.sort(key=lambda s: (s[0], -s[1]))
    found: list[Finding] = []
    for start, end, kind, name, cut in spans:
        last = found[-1].end if found else -1
        if cut and end >= last:
            end = _value_end(text, start, end, name)
        if start < last:  # inside or across one already found (windows overlap): the union is the secret
            found[-1] = found[-1]._replace(end=max(last, end))
        else:
            found.append(Finding(kind, where, start, end, name))
    return found


def _value_end(text: str, start: int, end: int, name: str) -> int:
    """Where a value that a window cut at `end` ends in its whole line: a quoted one at its closing quote, a bare
    one at its end, a passphrase after its last word (each a search from `end` on: linear)."""
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    quote = text[start - 1] if start else ""
    if quote in ('"', "'"):
        close = text.find(quote, end, line_end)
        return line_end if close < 0 else close
    bare = _BARE_END.search(text, end, line_end)
    stop = bare.start() if bare else line_end
    if name and _PASSWORD_NAME.search(name):
        stop = _MORE_WORDS.match(text, stop, line_end).end()  # type: ignore[union-attr]  # always matches
    return stop


def _pem_blocks(text: str) -> Iterator[tuple[int, int, str, str, bool]]:
    """A PEM private key of a text from its BEGIN line to its END line (to the text's end without one)."""
    pos = 0
    while (begin := _PEM_BEGIN.search(text, pos)) is not None:
        end = _PEM_END.search(text, begin.end())
        pos = end.end() if end else len(text)
        yield begin.start(), pos, PEM_KIND, "", False


def scan_many(items: Iterable[tuple[str, str, str]]) -> list[list[Finding]]:
    """The findings of each (where, key, text): `key` is the document key the text is the value of, if any. All
    the texts are scanned together, each distinct line once."""
    items = [(where, key, text) for where, key, text in items if isinstance(text, str)]
    hits = _hits_of([text for _, _, text in items])
    return [_text_findings(text, where, key, hits) for where, key, text in items]


def scan_text(text: str, where: str = "", key: str = "") -> list[Finding]:
    """Every secret in `text` (`key`: the document key it is the value of, if any), in order, overlaps merged."""
    if not isinstance(text, str) or not text.strip():
        return []
    return scan_many([(where, key, text)])[0]


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


def mask_many(texts: list[str]) -> list[str]:
    """`mask` of each text, all scanned together."""
    found = scan_many(("", "", text) for text in texts)
    return [mask(text, findings) for text, findings in zip(texts, found, strict=True)]


# ---- documents ---------------------------------------------------------------------------------------------------
_LONE_FLAG = re.compile(r"^--?([A-Za-z][\w-]*)$")


def item_keys(items: list[Any] | tuple[Any, ...], key: str) -> list[str]:
    """The key each item of a list is under: the list's, or for an argv the flag before it with its dashes
    (`--wandb-key`, X: a value that may be the next flag), `-p` of a login command (docker [options] login, sshpass,
    mysql; `-pPASS` joined too), curl's `-u user:password`, or the first word after `wandb login`'s options."""
    reader = _Argv(key)
    return [reader.key_of(items, i) for i in range(len(items))]


_SHELL_SEPARATORS = frozenset({";", "&&", "||", "|"})


class _Argv:
    """Reads an argv left to right: which command each item belongs to, and so what a value in it is."""

    def __init__(self, key: str):
        self.key = key
        self._reset()

    def _reset(self) -> None:
        self.login = False  # in a login command whose `-p` is a password
        self.client = False  # after a registry client (docker), its global options, before its `login`
        self.curl = False  # in a curl command: `-u user:password`
        self.wandb = (
            False  # after `wandb login`: the first word that is no option (nor an option's value) is its key
        )
        self.host = False  # the next word is the value of `wandb login --host`

    def key_of(self, items: list[Any] | tuple[Any, ...], i: int) -> str:
        item, before = items[i], items[i - 1] if i else None
        under = self._under(item, before)
        if not isinstance(item, str):
            return under
        if item in _SHELL_SEPARATORS:
            self._reset()  # the next command starts afresh
        else:
            self._advance(item, before, under)
        return under

    def _under(self, item: Any, before: Any) -> str:
        flag = _LONE_FLAG.match(before) if isinstance(before, str) else None
        text = item if isinstance(item, str) else ""
        if flag and credential_name(flag.group(1)):
            return before
        if self.wandb and not self.host and text and not text.startswith("-"):
            return "wandb login"
        if self.login and (before == "-p" or (text.startswith("-p") and len(text) > 2)):
            return "-p"  # `-p PASS` or `-pPASS`
        joined_user = text.startswith(("-u", "-U", "--user=", "--proxy-user=")) and text not in _USER_FLAGS
        if self.curl and (before in _USER_FLAGS or joined_user):
            return "curl -u"
        return self.key

    def _advance(self, item: str, before: Any, under: str) -> None:
        program = _program(item)
        if self.wandb:
            self.wandb = under != "wandb login"
            self.host = self.wandb and not self.host and item.lower() in _WANDB_LOGIN_VALUED
        if item == "login" and _program(before) == "wandb":
            self.wandb = True
        if program in _LOGIN_PROGRAMS:
            self.login = True
        elif program == "curl":
            self.curl = True
        elif program in _REGISTRY_CLIENTS and not self.client:
            self.client = True
        elif self.client and item == "login":
            self.login, self.client = True, False
        elif self.client and not item.startswith("-") and item not in _LOGIN_SUBCOMMANDS:
            # a global option's value (`docker --config /x login`) keeps the client; another word is its command
            self.client = isinstance(before, str) and before.startswith("-") and "=" not in before


def _program(item: Any) -> str:
    """The program an argv item names (`/usr/bin/mysql` → mysql); "" for anything else."""
    return item.rsplit("/", 1)[-1] if isinstance(item, str) else ""


def _under_credential(node: Any, key: str) -> bool:
    """An integer under a credential-like key (`WANDB_API_KEY: 1234…` unquoted in YAML) is scanned as text."""
    return isinstance(node, int) and not isinstance(node, bool) and bool(key) and credential_name(key)


def strings(document: Any, path: str = "", key: str = "") -> list[tuple[str, str, str]]:
    """(key path, the key the text is under, text) of every string in a document, mapping keys included (a list's
    items are under the list's key, an argv's value under the flag before it; an integer under a credential-like
    key counts as its text): what `scan_tree` scans, and what cards check for accounts and paths."""
    out: list[tuple[str, str, str]] = []
    _collect(document, path, key, out)
    return out


def _collect(node: Any, path: str, key: str, out: list[tuple[str, str, str]]) -> None:
    if isinstance(node, dict):
        for k, value in node.items():
            name = str(k)
            child = f"{path}.{name}" if path else name
            out.append((child, "", name))
            if value.__class__ is str:
                out.append((child, name, value))
            else:
                _collect(value, child, name, out)
    elif isinstance(node, (list, tuple)):
        for i, (value, under) in enumerate(zip(node, item_keys(node, key), strict=True)):
            if value.__class__ is str:
                out.append((f"{path}[{i}]", under, value))
            else:
                _collect(value, f"{path}[{i}]", under, out)
    elif isinstance(node, str):
        out.append((path, key, node))
    elif _under_credential(node, key):
        out.append((path, key, str(node)))


def scan_tree(document: Any, path: str = "") -> list[Finding]:
    """Every secret in a document (cards, campaigns, configs): in each string, and each value under a
    credential-like key; `where` is the key path."""
    return scan_and_redact(document, path)[0]


def scan_and_redact(document: Any, path: str = "") -> tuple[list[Finding], Any]:
    """`scan_tree` and, when it finds any, the document masked (`redact_tree`; else the document itself), from one
    scan."""
    items = strings(document, path)
    hits = _hits_of([text for _, _, text in items])
    found = [f for where, key, text in items
             if text in hits or (key and credential_name(key)) or len(text) > WINDOW or "\n" in text
             for f in _text_findings(text, where, key, hits)]  # fmt: skip
    return masked_paths(found), (_redacted(document, "", hits) if found else document)


def masked_paths(findings: list[Finding]) -> list[Finding]:
    """`findings` with their key paths masked: a mapping key can be a secret itself (`env.values.hf_…: x`), and
    the path of a finding under it would show it."""
    paths = list(dict.fromkeys(f.where for f in findings if f.where))
    shown = dict(zip(paths, mask_many(paths), strict=True))
    return [f._replace(where=shown[f.where]) if f.where else f for f in findings]


def redact_tree(document: Any, key: str = "") -> Any:
    """A copy of `document` with every secret value masked (strings keep their non-secret parts): the one way mbx
    masks what it writes (W&B, launch.json, status.json's log tail, pages, summaries)."""
    return _redacted(document, key, _hits_of([text for _, _, text in strings(document, "", key)]))


_DISTINCT: dict[str, int] = {}  # raw value -> its number in `redact_distinct` (this process's memory only)


def redact_distinct(document: Any) -> Any:
    """`redact_tree`, each masked value told apart: `<redacted #N>`, the same N for the same raw value in this
    process (compare's config diff: a difference only in a secret still shows as one, the secret never does)."""
    return _numbered(document, redact_tree(document))


def _numbered(raw: Any, masked: Any) -> Any:
    if isinstance(raw, dict) and isinstance(masked, dict) and len(raw) == len(masked):
        pairs = zip(raw.values(), masked.items(), strict=True)
        return {key: _numbered(value, shown) for value, (key, shown) in pairs}
    if isinstance(raw, (list, tuple)) and isinstance(masked, list) and len(raw) == len(masked):
        return [_numbered(value, shown) for value, shown in zip(raw, masked, strict=True)]
    if isinstance(masked, str) and masked != raw and MASK in masked:
        number = _DISTINCT.setdefault(str(raw), len(_DISTINCT) + 1)
        return masked.replace(MASK, f"<redacted #{number}>")
    return masked


def _redacted(document: Any, key: str, hits: dict[str, tuple[Hit, ...]]) -> Any:
    if (
        document.__class__ is str
        and document not in hits
        and len(document) <= WINDOW
        and "\n" not in document
    ):
        return (
            MASK if key and credential_name(key) and secret_value(key, document) else document
        )  # the common case
    if isinstance(document, dict):
        return {(mask(k, _text_findings(k, "", "", hits)) if isinstance(k, str) else k): _redacted(v, str(k), hits)
                for k, v in document.items()}  # fmt: skip
    if isinstance(document, (list, tuple)):
        return [_redacted(v, k, hits) for v, k in zip(document, item_keys(document, key), strict=True)]
    if isinstance(document, str):
        return mask(document, _text_findings(document, "", key, hits))
    if _under_credential(document, key) and _text_findings(str(document), "", key, hits):
        return MASK
    return document


def problems(document: Any, what: str) -> list[str]:
    """`key.path: contains a credential (HF_TOKEN=<redacted>): <what>` for each secret in `document`."""
    return [f"{f.where or 'text'}: contains {f.describe()}: {what}" for f in scan_tree(document)]
