"""Every error a user can reach, in one place: each is an Error, its message one line naming the
file or flag at fault; a command's main prints it as `error: ...` (no traceback) and exits 1.
Stopped is no error: a run or a search that a signal or a limit ended, its work saved, its message
saying how to go on. The modules that raise an error import it from here (data.DataError,
bert.CheckpointError and the others are the same classes). Imports nothing of the project."""


class Error(ValueError):
    """A refusal or a failure the user can act on. A ValueError, so that callers of the library
    that catch ValueError go on working."""


class DataError(Error):
    """Bad or missing data; the message is one line, 'path:line: what is wrong'."""


class CheckpointError(Error):
    """A model file that cannot be used (weights, config.json, the tokenizer); the message is one
    line naming the file (and key)."""


class ConfigError(Error):
    """A PALT configuration that cannot work with this model (one line)."""


class FlagError(Error):
    """A flag, or a combination of flags, that cannot work; the message is one line naming it."""


class OutputError(Error):
    """An output folder or file that cannot be used or written (not a folder, in use by another
    process, a damaged state of ours, a full disk); the message is one line naming it."""


class ScoreError(Error):
    """Scores that cannot be ranked (NaN or inf): a broken checkpoint or an overflow."""


class DownloadError(Error):
    """A model or data file that cannot be had (a download failed or did not check out, no such
    model folder): one line naming it, and where to put the files instead."""


class TuneError(Error):
    """A search that cannot start or go on (one line)."""


class Stopped(Exception):
    """Work ended early, its finished part saved (a ranking's queries, a search's trials): the
    message says how to resume. Not an Error: the commands print it as it is."""


# What the commands catch and print as one line; everything above derives from Error.
ERRORS = (Error,)
