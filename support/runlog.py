"""A training run's log and its stop: the log line's figures (Meter), print0 and log0 (process 0
prints, and writes out/log.txt), the run's metrics file (Metrics: out/metrics.jsonl, and TensorBoard
event files with --tensorboard), and the signals that end a run after the step under way."""
import json
import math
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from support.errors import DataError, FlagError

STOP = []  # the signals received: SIGINT (Ctrl-C) or SIGTERM end a run after the step under way
METRICS = "metrics.jsonl"  # a run folder's training record, a JSON object a line
NO_TENSORBOARD = "--tensorboard needs the tensorboard package: pip install tensorboard"
# A dev point's figures that are counts or flags, not curves: no TensorBoard scalar of their own.
NOT_SCALARS = ("step", "epoch", "total_steps", "triples", "candidates", "value")


class Meter:
    """An epoch's figures for the log line: mean loss, sequences a second, padding, ETA; and the
    training seconds, a dev point's not counted."""

    def __init__(self, wall_s, device):
        self.wall0, self.t0 = wall_s, time.time()
        # The loss is summed on the device: an .item() a step would make the CPU wait for the GPU.
        self.loss_sum = torch.zeros((), device=device)
        self.n_steps = self.n_real = self.n_padded = 0
        self.windows, self.seen = [], (0.0, 0)  # each log line's own mean loss; sum, steps so far

    def add(self, loss, batch):
        """One step's loss (on the device) and its batch's real and padded tokens."""
        self.loss_sum += loss
        self.n_steps += 1
        self.n_real += int(batch["attention_mask"].sum())
        self.n_padded += batch["input_ids"].numel()

    def figures(self, epoch_index: int, step: int, total_steps: int, lr: float, n_triples: int,
                world_size: int) -> dict:
        """The figures of the epoch so far, for the log line and the metrics file (the loss's one
        .item(), here): the loss is the mean since the epoch's start (or a resume)."""
        dt = time.time() - self.t0
        loss_sum = self.loss_sum.item()
        if self.n_steps > self.seen[1]:  # the mean loss of the steps since the last log line
            self.windows.append((loss_sum - self.seen[0]) / (self.n_steps - self.seen[1]))
        self.seen = (loss_sum, self.n_steps)
        return {"kind": "train", "step": step, "total_steps": total_steps,
                "epoch": epoch_index + 1, "loss": loss_sum / self.n_steps, "lr": lr,
                "seq_per_s": self.n_steps * n_triples * world_size / dt,
                "padded_per_real": self.n_padded / self.n_real,
                "eta_min": (total_steps - step) * dt / self.n_steps / 60}

    @staticmethod
    def format_line(f: dict, epochs: int, precision: str) -> str:
        """The log line of a step's figures (Meter.figures)."""
        return (f"epoch {f['epoch']}/{epochs} step {f['step']}/{f['total_steps']} loss "
                f"{f['loss']:.4f} lr {f['lr']:.2e} seq/s {f['seq_per_s']:.0f} padded/real "
                f"{f['padded_per_real']:.2f} {precision} eta {f['eta_min']:.1f}m")

    def at_prior(self, negatives_a_positive: int, tolerance: float = 0.02) -> str | None:
        """A line when every log line of the epoch lost what a scorer of the prior alone loses,
        the entropy of 1 true triple in 1 + negatives_a_positive (within `tolerance` of it): a
        model that learns falls below it. Else None."""
        p = 1 / (1 + negatives_a_positive)
        prior = -(p * math.log(p) + (1 - p) * math.log(1 - p))
        if not self.windows or any(abs(w - prior) > tolerance * prior for w in self.windows):
            return None
        return (f"the loss sat at {prior:.4f} all epoch, the entropy of the prior (1 true triple "
                f"in {1 + negatives_a_positive}): the model scores every triple alike; try another "
                "recipe (--recipe tuned or cpu), another --lr, or fewer --negatives")

    def wall(self):
        """The run's training seconds so far, the resumed segments' included."""
        return self.wall0 + time.time() - self.t0

    @contextmanager
    def paused(self, history):
        """A dev point within the epoch: the training seconds so far into history, the point's own
        seconds into no training figure."""
        history["train_wall_s"] = self.wall()
        spent = time.time()
        yield
        self.t0 += time.time() - spent


def check_tensorboard() -> None:
    """--tensorboard, before the model loads: FlagError in one line where the tensorboard package
    (an optional extra) is not installed."""
    try:
        import torch.utils.tensorboard  # noqa: F401 (it needs the tensorboard package)
    except ImportError:
        raise FlagError(NO_TENSORBOARD) from None


class Metrics:
    """A run's training record in out/metrics.jsonl, a JSON object a line, appended: "start" at
    each segment's start (a resumed run does the steps after its state's step again), "train" at
    each logged step (Meter.figures), "dev" at each dev point (its figure). plot.py curve draws
    it; tensorboard: the same figures as TensorBoard event files in out, where people already look
    at curves (check_tensorboard first)."""

    def __init__(self, out: Path, tensorboard: bool = False):
        self.path = Path(out) / METRICS
        self.board = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.board = SummaryWriter(log_dir=str(out))

    def write(self, record: dict) -> None:
        """One record: a line of the file, and its numbers as TensorBoard scalars."""
        with open(self.path, "a") as f:
            print(json.dumps(record), file=f, flush=True)
        if self.board is None or record["kind"] == "start":
            return
        scalars = {k: v for k, v in record.items() if k not in NOT_SCALARS
                   and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if record["kind"] == "dev":  # the dev figure under its own name: mrr, accuracy, ...
            scalars[record["metric"]] = record["value"]
        for name, value in scalars.items():
            self.board.add_scalar(f"{record['kind']}/{name}", value, record["step"])
        self.board.flush()


def read_metrics(folder: Path) -> tuple[list, list, list]:
    """(train records, dev records, the steps where a segment started) of a run folder's
    metrics.jsonl; a segment's start forgets the records after its step (done again)."""
    path = Path(folder) / METRICS
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror or e})") from None
    train, dev, starts = [], [], []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            kind, step = record["kind"], int(record["step"])
        except (ValueError, KeyError, TypeError):
            raise DataError(f"{path}:{n}: not a record of train.py's metrics file") from None
        if kind == "start":
            train = [r for r in train if r["step"] <= step]
            dev = [r for r in dev if r["step"] <= step]
            starts.append(step)
        elif kind in ("train", "dev"):
            (train if kind == "train" else dev).append(record)
    return train, dev, starts


def stop_requested(step, every, ddp):
    """Whether to stop after this step: a signal arrived (STOP). Under DDP the processes agree at
    logged steps only (one all-reduce there), so that every process stops after the same step."""
    if not ddp:
        return bool(STOP)
    if step % every:
        return False
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([float(bool(STOP))], device=device)
    dist.all_reduce(flag)
    if flag.item() and not STOP:
        STOP.append("a signal to another process")
    return bool(flag.item())


def stalled(history, patience, log0, ddp):
    """--patience N: whether dev has not risen for N dev points in a row (none of the last N above
    the best before them); process 0 holds the curve, and under DDP the others take its verdict.
    Says so in the log when it ends the run."""
    if not patience:
        return False
    dev = [p["value"] for p in history["dev"]]
    verdict = len(dev) > patience and max(dev[-patience:]) <= max(dev[:-patience])
    if ddp:
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([float(verdict)], device=device)
        dist.broadcast(flag, 0)
        verdict = bool(flag.item())
    if verdict:
        points = "dev point" if patience == 1 else "dev points"
        log0(f"dev has not risen for {patience} {points} in a row: the run ends after epoch "
             f"{history['epoch']} (--patience {patience})")
    return verdict


class Printer:
    """print0: print for process 0, flushed; silence for the others."""

    def __init__(self, enabled):
        self.enabled = enabled

    def __call__(self, *args, **kwargs):
        """print(...), flushed, on process 0 only."""
        if self.enabled:
            print(*args, **kwargs, flush=True)


def open_log(out, print0):
    """log0(line): print0 it, and append it to out/log.txt."""
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "log.txt", "a")

    def log0(line):
        print0(line)
        print(line, file=log, flush=True)
    return log0


def segment_line(resume, resumed, history, state_file, where):
    """A run segment's first log line: the machine it trains on and, resumed, the epoch and step it
    continues from (a log that travels from machine to machine records each segment)."""
    if resume and resumed:
        return (f"resumed from {state_file}: epoch {history['epoch']}, step {history['step']}, "
                f"on {where}")
    if resume:
        return (f"--resume: no checkpoint in {state_file.parent} yet, starting from scratch, "
                f"on {where}")
    return f"started on {where}"


def on_signal(signum, frame):
    """SIGINT (Ctrl-C) or SIGTERM: the run ends after the step under way (under torchrun, after the
    next logged step, where the processes agree)."""
    STOP.append(signal.Signals(signum).name)


def finished(history, out, dtype):
    """The line a finished run ends with: its steps and minutes, and where its weights are."""
    best = ""
    if history["best_epoch"]:
        best = f", best by dev {out}/best.safetensors (epoch {history['best_epoch']})"
    ckpt = out / "ckpt.safetensors"  # a run copied back without it: state has the same weights
    weights = f"{out}/state.safetensors"
    if ckpt.exists():
        weights = f"{ckpt} ({ckpt.stat().st_size / 2**20:.1f} MiB)"
    return (f"trained {history['step']} steps in {history['train_wall_s'] / 60:.1f} min "
            f"({dtype}); last {weights}{best}")
