"""python tests/scripted_dev.py V1,V2,... ARGS...: train.py ARGS as its command line runs it, except
that the dev points' figures are V1, V2, ... in turn (the real dev evaluation still runs): the
tests' way to give a run a dev curve of their choosing, under torchrun too."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train  # noqa: E402

CURVE = [float(v) for v in sys.argv[1].split(",")]


def scripted_dev_metric(*args, _real=train.dev_metric, **kwargs):
    """train.dev_metric's figure with its value replaced by the curve's next one."""
    figure, _ = _real(*args, **kwargs)
    value = CURVE.pop(0)
    return figure | {"value": value}, f"scripted {value}"


if __name__ == "__main__":
    train.dev_metric = scripted_dev_metric
    train.command_line(sys.argv[2:])
