"""The typed errors a user can cause (bottom layer: imports nothing from the package).

The CLI (:func:`horizonrl.cli.main`) turns every error in :data:`USER_ERRORS`
into one line ``horizonrl: error: ...`` and exit status 2; anything else is a
bug and keeps its traceback. Each message names what is wrong: the config
field and value, or the file, line and field of a data record.
"""

from __future__ import annotations

import errno


class ConfigError(ValueError):
    """A config value is missing, unknown or out of range (the message names the field and value)."""


class DataError(ValueError):
    """A data file or record is malformed (the message names the file, line and field)."""


class CheckpointError(RuntimeError):
    """No usable checkpoint to resume from, or one could not be written."""


class NonFiniteError(FloatingPointError):
    """A loss, gradient or parameter became NaN or infinite during training."""


class HorizonWarning(UserWarning):
    """Something was skipped or recovered (a torn last line, a checkpoint fallback); the CLI prints
    these as ``horizonrl: warning: ...``."""


#: Errors caused by the user's input or machine; the CLI reports them in one line.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    DataError,
    CheckpointError,
    NonFiniteError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)

#: ``OSError.errno`` values that are the machine's state, not a bug (full disk, quota, read-only).
USER_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def is_user_error(e: BaseException) -> bool:
    """Whether ``e`` is reported in one line by the CLI (see :data:`USER_ERRORS`)."""
    return isinstance(e, USER_ERRORS) or (isinstance(e, OSError) and e.errno in USER_ERRNOS)
