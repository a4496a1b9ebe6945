"""User-facing errors.

Every mistake a user can make (a bad file, a bad option) is raised as
`SpeedrunError` with a one-line message that names the file or option and
what is wrong. The CLI prints that line and exits non-zero; anything else is
a bug and keeps its traceback.
"""


class SpeedrunError(Exception):
    """A user error: the message is one line naming the culprit."""

    exit_code = 2


class DataError(SpeedrunError):
    """A shard, corpus or download is missing, malformed or too small."""


class ConfigError(SpeedrunError):
    """A config field, preset or command-line value is not valid."""
