"""A run folder's curve.png, redrawn by train.py at each dev point where matplotlib is installed:
the train loss and the dev figure against steps, from the folder's metrics.jsonl. plot.py curve
draws the full picture (several runs, Hits@10, the kinds of dev point); this one is only a glance,
so that training needs no plotting command and matplotlib stays optional."""
import sys
from pathlib import Path

from support import files, runlog


def write_curve(folder: Path) -> Path | None:
    """folder/curve.png: the path written; None where matplotlib is not installed, there is no
    training record yet, or the file cannot be written (said on stderr: a picture never stops a
    training run)."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files, no window
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    train, dev, _ = runlog.read_metrics(folder)
    if not train:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1)
    top.set_ylabel("train loss as logged")
    if dev:
        bottom.plot([r["step"] for r in dev], [r["value"] for r in dev], "o-", ms=3, lw=1)
        bottom.set_ylabel(f"dev {dev[-1]['metric']}")
    bottom.set_xlabel("step")
    fig.suptitle(Path(folder).resolve().name, fontsize=10)
    out = Path(folder) / "curve.png"
    try:
        files.write_atomic(out, lambda f: fig.savefig(f, format="png", dpi=100))
    except OSError as e:
        print(f"note: cannot write {out} ({e.strerror or e})", file=sys.stderr)
        return None
    finally:
        plt.close(fig)
    return out
