"""A training run's log and its stop: the log line's figures (Meter), print0 and log0 (process 0
prints, and writes out/log.txt), and the signals that end a run after the step under way."""
import signal
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

STOP = []  # the signals received: SIGINT (Ctrl-C) or SIGTERM end a run after the step under way


class Meter:
    """An epoch's figures for the log line: mean loss, sequences a second, padding, ETA; and the
    training seconds, a dev point's not counted."""

    def __init__(self, wall_s, device):
        self.wall0, self.t0 = wall_s, time.time()
        # The loss is summed on the device: an .item() a step would make the CPU wait for the GPU.
        self.loss_sum = torch.zeros((), device=device)
        self.n_steps = self.n_real = self.n_padded = 0

    def add(self, loss, batch):
        """One step's loss (on the device) and its batch's real and padded tokens."""
        self.loss_sum += loss
        self.n_steps += 1
        self.n_real += int(batch["attention_mask"].sum())
        self.n_padded += batch["input_ids"].numel()

    def line(self, epoch_index, epochs, step, total_steps, lr, n_triples, tr):
        """The log line of the epoch so far (the loss's one .item(), here)."""
        dt = time.time() - self.t0
        loss = self.loss_sum.item() / self.n_steps
        per_s = self.n_steps * n_triples * tr.world_size / dt
        eta = (total_steps - step) * dt / self.n_steps / 60
        return (f"epoch {epoch_index + 1}/{epochs} step {step}/{total_steps} loss {loss:.4f} "
                f"lr {lr:.2e} seq/s {per_s:.0f} padded/real {self.n_padded / self.n_real:.2f} "
                f"{tr.dtype} eta {eta:.1f}m")

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
