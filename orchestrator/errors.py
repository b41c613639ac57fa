"""mbx's exception tree: configuration/usage errors exit 2, runtime failures exit 1; and mbx's exit codes."""

from __future__ import annotations

# mbx's exit codes, the one table (README's; orchestrator/judge/outcome.py maps verdicts onto them): 0 every
# verdict passed, 1 something failed (or an error while running), 2 bad input, 3 inconclusive (nothing failed,
# something undecided; `--inconclusive-ok` makes it 0).
EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3


def printable(text: str) -> str:
    """`text` on one line: control and other non-printable characters as escapes (\\n, \\x1b, \\u202e)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class MbxError(Exception):
    """Root of every error mbx reports as a clean message (no traceback unless MBX_DEBUG=1)."""

    exit_code = EXIT_FAIL

    def lines(self) -> list[str]:
        return [str(self)]


class ConfigError(MbxError):
    """A campaign file, recipe or option is invalid. Each problem is `file: key.path: what is allowed`."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problems: list[str] | str, file: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.file = file
        super().__init__("; ".join(self.problems))

    def lines(self) -> list[str]:
        prefix = f"{self.file}: " if self.file else ""
        return [prefix + p for p in self.problems]


class UsageError(ConfigError):
    """The command line asks for something that does not exist (unknown campaign, launcher, ...)."""


class RunError(MbxError):
    """Something failed while running or collecting a campaign."""


class StoreDamaged(RunError):
    """The workspace's run store (mbx.sqlite) is truncated or corrupt: `mbx store rebuild` makes a new one."""

    def __init__(self, path: object, detail: str):
        self.path = path
        self.detail = detail
        workspace = getattr(path, "parent", path)
        super().__init__(
            f"{path}: the run store is damaged ({detail}); rebuild it from the run directories with "
            f"`mbx store rebuild --workspace {workspace}` (the damaged file is kept aside)"
        )


class StoreTooNew(RunError):
    """The run store was written by a newer mbx (a higher schema version)."""
