"""python tests/crash_at_step.py N ARGS...: train.py ARGS as its command line runs it, except that the
process dies unsaved (exit code 3) during its Nth training step, as a kill or a power cut would end
it: the tests' way to check what --resume makes of a run that was never told to stop."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train  # noqa: E402

CRASHED = 3
STEPS = []


def crashing_step(*args, _real=train.train_step, **kwargs):
    """train.train_step, except that the Nth call exits the process at once."""
    STEPS.append(1)
    if len(STEPS) == int(sys.argv[1]):
        os._exit(CRASHED)
    return _real(*args, **kwargs)


if __name__ == "__main__":
    train.train_step = crashing_step
    train.command_line(sys.argv[2:])
