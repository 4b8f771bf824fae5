"""Train PALT on a knowledge graph: one CPU, one GPU, or many with torchrun.

  python train.py --data umls --model minilm --epochs 3
  torchrun --nproc_per_node 8 train.py --data wn11 --model bert-base-cased

The loop (train): each epoch draws its negatives and orders its steps; each step sets the lr, takes
one optimizer step, logs, makes a dev point and saves every --dev-every steps, and stops on a
signal; each epoch ends with a dev point, best.safetensors if better, ckpt.safetensors and the
resume state.
"""
import signal
import time
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist

import evaluate
import flags
import plot
from bert import CheckpointError
from checkpoints import save_run
from data import build_batch, seq_lengths
from devices import autocast, to_device
from graphs import DataError
from palt import ConfigError
from trainer import setup

# PRESETS[recipe][data] fills every setting a run leaves open (None: not set). paper: the paper's
# appendix (BERT-base on GPUs; umls and 'own', a graph of one's own: our choice). cpu: ours for
# MiniLM on a few CPU cores. gpu: the cpu recipe compiled; the big graphs train the paper's 10
# epochs with a dev point every 2,500 steps. A big graph's dev MRR is estimated: the dev_near
# nearest entities scored, dev_sample drawn (RESULTS.md).
COLUMNS = ("lr", "batch", "prompts", "negatives", "epochs", "dev_limit", "dev_sample", "dev_every",
           "dev_near", "hard_negatives", "compile")
_ = None  # not set: the flag's default
TABLE = [  # recipe, data, then COLUMNS
    ("paper", "wn11",      1.5e-4, 32, (2,0,0),    (1,1,1),   40, _,   _,    _,    _,  _,   _),
    ("paper", "fb13",      1.5e-5, 32, (10,10,10), (1,1,1),   40, _,   _,    _,    _,  _,   _),
    ("paper", "fb15k-237", 1e-4,   8,  (10,10,10), (5,5,5),   10, 50,  100,  _,    32, _,   _),
    ("paper", "wn18rr",    1e-5,   8,  (10,10,10), (5,5,5),   10, 50,  100,  _,    32, _,   _),
    ("paper", "umls",      1e-4,   8,  (10,10,10), (5,5,5),   10, 100, _,    _,    _,  _,   _),
    ("paper", "own",       1e-4,   8,  (10,10,10), (5,5,5),   10, 100, 1000, _,    _,  _,   _),
    ("cpu",   "wn11",      1e-3,   32, (2,0,0),    (1,1,1),   3,  _,   _,    _,    _,  _,   _),
    ("cpu",   "fb13",      1e-3,   32, (2,0,0),    (1,1,1),   1,  _,   _,    _,    _,  _,   _),
    ("cpu",   "umls",      1e-3,   32, (2,0,0),    (1,1,1),   8,  100, _,    _,    _,  _,   _),
    ("cpu",   "fb15k-237", 1e-3,   32, (2,0,0),    (1,0,1),   1,  50,  100,  500,  32, _,   _),
    ("cpu",   "wn18rr",    1e-3,   32, (2,0,0),    (1,0,1),   1,  50,  100,  500,  32, _,   _),
    ("cpu",   "own",       1e-3,   32, (2,0,0),    (1,1,1),   5,  100, 1000, _,    _,  _,   _),
    ("gpu",   "wn11",      1e-3,   32, (2,0,0),    (1,1,1),   3,  _,   _,    _,    _,  _,   True),
    ("gpu",   "fb13",      1e-3,   32, (2,0,0),    (1,1,1),   1,  _,   _,    _,    _,  _,   True),
    ("gpu",   "umls",      1e-3,   32, (2,0,0),    (1,1,1),   8,  100, _,    _,    _,  _,   True),
    ("gpu",   "fb15k-237", 1e-3,   32, (2,0,0),    (5,5,5,2), 10, 50,  100,  2500, 32, _,   True),
    ("gpu",   "wn18rr",    1e-3,   32, (2,0,0),    (1,0,1,2), 10, 50,  100,  2500, 32, 0.5, True),
    ("gpu",   "own",       1e-3,   32, (2,0,0),    (1,1,1),   5,  100, 1000, _,    _,  _,   True),
]
PRESETS = {}
for recipe, name, *values in TABLE:
    PRESETS.setdefault(recipe, {})[name] = {k: v for k, v in zip(COLUMNS, values) if v is not None}
STOP = []  # the signals received: SIGINT (Ctrl-C) or SIGTERM end a run after the step under way


def parse_args(argv=None):
    """train.py's Run: flags.parse_args with this file's PRESETS."""
    return flags.parse_args(argv, PRESETS, __doc__.splitlines()[0])


def epoch_order(lengths, per_step, epoch, seed, pool_steps=100):
    """(steps, per_step) train-positive indices, alike on every rank and after --resume: a seeded
    permutation sorted by `lengths` in pools of `pool_steps` steps (0: a plain shuffle), so steps
    pad little, then shuffled."""
    rng = np.random.default_rng([seed, epoch, 1])  # (seed, epoch) alone seeds the negatives
    n_steps = len(lengths) // per_step
    perm = rng.permutation(len(lengths))[:n_steps * per_step]
    if not pool_steps:
        return perm.reshape(n_steps, per_step)  # (steps, per_step)
    pool = np.arange(len(perm)) // (pool_steps * per_step)
    perm = perm[np.lexsort((lengths[perm], pool))]  # by pool, then by length inside the pool
    return perm.reshape(n_steps, per_step)[rng.permutation(n_steps)]


def learning_rate(step, peak, warm, total):
    """The lr of optimizer step `step` (0-based): a linear warm-up to `peak` over `warm` steps, then
    a linear decay to zero at `total` (BERT's schedule)."""
    if step < warm:
        return peak * (step + 1) / warm
    return peak * max(0.0, (total - step) / max(1, total - warm))


def train_step(forward, opt, params, batch, n_pos, lr, grad_clip, dtype, device):
    """One optimizer step on a batch of n_pos positives, then their negatives; returns the loss, on
    the device (an .item() here would make the CPU wait for the GPU every step)."""
    labels = torch.ones(len(batch["input_ids"]), dtype=torch.long)
    labels[:n_pos] = 0  # class 0 = a true triple, BERT's "is next"
    with autocast(dtype, device):
        logits = forward(**{k: to_device(v, device) for k, v in batch.items()})
    loss = torch.nn.functional.cross_entropy(logits.float(), to_device(labels, device))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params.values(), grad_clip)
    for g in opt.param_groups:
        g["lr"] = lr * g["lr_scale"]
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def train(tr, total):
    """The training loop, up to step `total`; False if a signal stopped it (saved, to resume)."""
    run, history, kg = tr.run, tr.history, tr.kg
    warm = max(1, int(run.warmup * total))  # learning_rate's warm-up steps
    for epoch in range(history["epoch"], run.epochs):
        if history["step"] >= total:
            break
        tr.ddp_model.train()
        neg = tr.negatives.negatives(epoch)  # (N, K, 3): each train positive's K corruptions
        order = step_order(tr, neg, epoch)  # (steps, positives per step on this rank)
        start = epoch * len(order)  # the epoch's first step: a resumed run starts further on
        meter = Meter(history["train_wall_s"], tr.device)
        for i in range(history["step"] - start, min(len(order), total - start)):
            step = start + i
            last = i == len(order) - 1 or step + 1 == total
            # lr
            lr = learning_rate(step, run.lr, warm, total)
            # step: the positives, then their negatives; seeded dropout: --resume replays a step
            torch.manual_seed(run.seed + 1_000_003 * step + tr.ddp_rank)
            idx = order[i]
            # (P, 3) positives, then (P, K, 3) -> (P*K, 3) negatives
            triples = np.concatenate([kg.train[idx], neg[idx].reshape(-1, 3)])
            batch = build_batch(tr.enc, triples, run.prompts, run.max_seq_length)
            loss = train_step(tr.forward, tr.opt, tr.params, batch, len(idx), lr, run.grad_clip,
                              tr.dtype, tr.device)
            history["step"] = step + 1
            meter.add(loss, batch)
            # log
            if history["step"] % run.log_every == 0 or last:
                tr.log0(meter.line(epoch, run.epochs, history["step"], total, lr, len(triples), tr))
            # dev point and save: every --dev-every steps (the epoch's end saves the rest)
            if run.dev_every and history["step"] % run.dev_every == 0 and not last:
                with meter.paused(history):
                    dev_point(tr, round(epoch + (i + 1) / len(order), 3), ["state"])
            # stop signal: Ctrl-C, or a kill; this step is kept, saved, and resumes
            if stop_requested(history["step"], run.log_every, tr.ddp):
                history["train_wall_s"] = meter.wall()
                save_stopped(tr)
                return False
        history["train_wall_s"] = meter.wall()
        # the epoch's end: a dev point, then best (if better), ckpt and the resume state
        history["epoch"] = epoch + 1
        dev_point(tr, epoch + 1, ["ckpt", "state"])
    return True


def step_order(tr, neg, epoch):
    """This rank's positives of each step of the epoch, similar lengths together (epoch_order)."""
    run = tr.run
    group = np.concatenate([tr.kg.train[:, None], neg], 1).reshape(-1, 3)  # positive, negatives
    lengths = seq_lengths(tr.enc, group, run.prompts, run.max_seq_length)
    lengths = lengths.reshape(len(neg), -1).max(1)  # (N,) the longest of each positive's group
    # process r takes every world_size-th positive of each global step (DistributedSampler's split)
    return epoch_order(lengths, run.batch, epoch, run.seed)[:, tr.ddp_rank::tr.world_size]


class Meter:
    """An epoch's figures for the log line: mean loss, sequences a second, padding, ETA; and the
    training seconds, a dev point's not counted."""

    def __init__(self, wall_s, device):
        self.wall0, self.t0 = wall_s, time.time()
        self.loss_sum = torch.zeros((), device=device)  # on the device: no .item(), no wait a step
        self.n_steps = self.n_real = self.n_padded = 0

    def add(self, loss, batch):
        self.loss_sum += loss
        self.n_steps += 1
        self.n_real += int(batch["attention_mask"].sum())
        self.n_padded += batch["input_ids"].numel()

    def line(self, epoch, epochs, step, total, lr, n_triples, tr):
        dt = time.time() - self.t0
        loss = self.loss_sum.item() / self.n_steps
        per_s = self.n_steps * n_triples * tr.world_size / dt
        eta = (total - step) * dt / self.n_steps / 60
        return (f"epoch {epoch + 1}/{epochs} step {step}/{total} loss {loss:.4f} lr {lr:.2e} seq/s "
                f"{per_s:.0f} padded/real {self.n_padded / self.n_real:.2f} {tr.dtype} "
                f"eta {eta:.1f}m")

    def wall(self):
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
    """Whether to stop after this step: a signal arrived (STOP). Under DDP the ranks agree at logged
    steps only (one all-reduce there), so that every rank stops after the same step."""
    if not ddp:
        return bool(STOP)
    if step % every:
        return False
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([float(bool(STOP))], device=device)
    dist.all_reduce(flag)
    if flag.item() and not STOP:
        STOP.append("a signal to another rank")
    return bool(flag.item())


def save_stopped(tr):
    """Process 0 saves a stopped run's weights and resume state, and says how to go on."""
    if tr.ddp_rank != 0:
        return
    save_run(tr.out, tr.model, tr.opt, tr.params, tr.meta | tr.history, ["ckpt", "state"])
    tr.log0(f"stopped at step {tr.history['step']} ({STOP[0]}): {tr.out}/ckpt.safetensors holds "
            f"this step's weights; --resume continues from {tr.out}/state.safetensors")


def dev_point(tr, epoch, names):
    """Process 0's dev point at `epoch` (mid-epoch: a fraction) into the history and the log, then
    the saves `names`; at an epoch's end (ckpt among them) also best.safetensors, if dev is the best
    so far. The other ranks wait."""
    if tr.ddp_rank == 0:
        history, end = tr.history, "ckpt" in names
        if len(tr.kg.dev):  # a graph of one's own may lack a dev split
            dev, line = dev_metric(tr.model.eval(), tr.kg, tr.enc, tr.run, tr.device, tr.dtype,
                                   tr.near)
            tr.model.train()
            history["dev"].append({"epoch": epoch, "step": history["step"], **dev})
            better = end and (history["best"] is None or dev["value"] > history["best"])
            if better:
                history["best"], history["best_epoch"] = dev["value"], epoch
                names = ["best", *names]
            where = f"after epoch {epoch}" if end else f"at step {history['step']} (epoch {epoch})"
            tr.log0(f"dev {where}: {line}" + (" (best so far)" if better else ""))
            plot.write_curve(tr.out)  # curve.png beside log.txt, where matplotlib is installed
        save_run(tr.out, tr.model, tr.opt, tr.params, tr.meta | history, names)
    if tr.ddp:
        dist.barrier()  # the other ranks wait for rank 0's dev evaluation and saves


def dev_metric(model, kg, enc, run, device, dtype, near=None):
    """(metric, its log line): accuracy at the threshold tuned on dev itself (an upper estimate), or
    the filtered MRR of the same seeded dev_limit dev triples every epoch, against all entities, a
    sample, or estimated (dev_near)."""
    scorer = evaluate.Scorer(model, enc, run.prompts, run.max_seq_length, device, dtype)
    if kg.task == "tc":
        scores = scorer.numpy(kg.dev)
        acc = evaluate.best_threshold(scores, kg.dev_labels)[1]
        chance = evaluate.chance_accuracy(scores, kg.dev_labels)
        dev = {"metric": "accuracy", "value": acc, "random": chance[0]}
        return dev, f"accuracy {acc:.4f}" + chance_note(acc, *chance, "accuracy")
    near = near[:, :run.dev_near] if run.dev_near else None
    m = evaluate.rank_split(scorer, kg, "dev", run.dev_limit, sample=run.dev_sample, near=near)
    sampled = bool(run.dev_sample and m["candidates"] < len(kg.split_entities))
    dev = {"metric": "mrr", "value": m["mrr"], "mr": m["mr"], "hits@10": m["hits@10"],
           "triples": min(run.dev_limit or len(kg.dev), len(kg.dev)),
           "candidates": m["candidates"], "sampled": sampled, "estimate": "estimate" in m,
           "random": m["random_mrr"][0]}
    against = f"against {m['candidates']:,} {'sampled ' if sampled else ''}candidates"
    if dev["estimate"]:
        against = f"(stratified estimate, {m['candidates']:,} candidates scored a query)"
    line = (f"mrr {m['mrr']:.4f}, MR {m['mr']:.2f}, Hits@10 {m['hits@10']:.4f} on "
            f"{dev['triples']} dev triples {against}")
    return dev, line + chance_note(m["mrr"], *m["random_mrr"], "MRR")


def chance_note(value, mean, sd, what):
    """The dev line's warning where its metric is within noise (2 sd) of a random scorer's."""
    if value >= mean + 2 * sd:
        return ""
    return (f"; within noise of a random scorer ({what} {mean:.4f} +- {2 * sd:.4f} on these "
            "triples): nothing learned yet, or text that carries nothing (README, Your own graph)")


def main(run):
    """Set the run up, train it, say where its checkpoints are; returns the model."""
    tr, total = setup(run, PRESETS)
    stopped = not train(tr, total)
    history, out = tr.history, tr.out
    if tr.ddp_rank == 0 and not stopped:
        best = ""
        if history["best_epoch"]:
            best = f", best by dev {out}/best.safetensors (epoch {history['best_epoch']})"
        last = out / "ckpt.safetensors"  # a run copied back without it: state has the same weights
        if last.exists():
            last = f"{last} ({last.stat().st_size / 2**20:.1f} MiB)"
        else:
            last = f"{out}/state.safetensors"
        print(f"trained {history['step']} steps in {history['train_wall_s'] / 60:.1f} min "
              f"({tr.dtype}); last {last}{best}", flush=True)
    model = tr.model
    if tr.ddp:  # DDP's reducer holds the group's gloo work: alive when the group is destroyed, it
        # can abort the exit (SIGABRT, "terminate called without an active exception"): freed first
        tr.ddp_model = tr.forward = None
        del tr
        dist.barrier()
        dist.destroy_process_group()
    return model


def on_signal(signum, frame):
    """SIGINT (Ctrl-C) or SIGTERM: the run ends after the step under way."""
    STOP.append(signal.Signals(signum).name)


def command_line(argv=None):
    """python train.py ARGS: a signal ends the run after a step, saved; errors are one line."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        main(parse_args(argv))
    except (DataError, CheckpointError, ConfigError) as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    command_line()
