"""Train PALT on a knowledge graph: one CPU, one GPU, or many with torchrun.

  python train.py --data umls --recipe cpu
  torchrun --nproc_per_node 8 train.py --data wn11 --model bert-base-cased

Read top to bottom: the lr schedule, one optimizer step (train_step), the loop (train), then the
set-up: torchrun's processes, the model and its AdamW groups, the negatives, the resumed state
(setup). The dev figure is evaluate.dev_metric; recipes (support/recipes.py), flags and files live
in support/.
"""
import json
import signal
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bert import autocast
from data import NegativeSampler, build_batch, encode, seq_lengths, to_device
from evaluate import ERRORS, dev_metric
from palt import PaltConfig, build_palt, param_report
from support import devices, flags, runlog
from support.checkpoints import (check_output, check_resumable, claim_output, palt_meta, restore,
                                 save_run)
from support.devices import compiled, hold_frozen_linears
from support.files import release_folder
from support.graphs import load_kg
from support.near import nearest_of_each
from support.picture import write_curve
from support.recipes import PRESETS, search_of  # every recipe's settings, one a line, its source


def parse_args(argv: list[str] | None = None) -> flags.Run:
    """train.py's Run (support/flags.py: each flag with its default, help and bounds), PRESETS
    filling what the command line leaves open."""
    return flags.parse_args(argv, PRESETS, __doc__.splitlines()[0])


# ----------------------------------------------------------------------------- the recipe
def learning_rate(step_index: int, peak: float, warm: int, total_steps: int) -> float:
    """The lr of the optimizer step at 0-based `step_index`: a linear warm-up to `peak` over `warm`
    steps (10% of them by default, --warmup), then a linear decay to zero at `total_steps`
    (BERT's schedule)."""
    if step_index < warm:
        return peak * (step_index + 1) / warm
    return peak * max(0.0, (total_steps - step_index) / max(1, total_steps - warm))


def adamw(model: torch.nn.Module, params: dict, run: flags.Run,
          device: torch.device) -> torch.optim.AdamW:
    """AdamW (betas 0.9 and --adam-beta2, eps --adam-eps) with weight decay on matrices only (not
    biases and LayerNorm), and the heads without NSP pretraining at their own lr (--head-lr): each
    group's lr_scale times the step's lr."""
    groups = {}  # (decays, is a head to train) -> parameters
    heads_to_train = [["bert", name] for name in model.heads_to_train]
    for n, p in params.items():
        groups.setdefault((p.ndim >= 2, n.split(".")[:2] in heads_to_train), []).append(p)
    param_groups = []
    for (decays, is_head), ps in groups.items():
        scale = (run.head_lr or run.lr) / run.lr if is_head else 1.0
        param_groups.append({"params": ps, "weight_decay": run.weight_decay if decays else 0.0,
                             "lr_scale": scale})
    # fused: one kernel over all the tensors, on a GPU and on a CPU alike
    return torch.optim.AdamW(param_groups, lr=run.lr, betas=(0.9, run.adam_beta2), eps=run.adam_eps,
                             fused=device.type in ("cuda", "cpu"))


def train_step(forward: typing.Callable, opt: torch.optim.Optimizer, params: dict, batch: dict,
               n_pos: int, lr: float, grad_clip: float, dtype: str,
               device: torch.device) -> torch.Tensor:
    """One optimizer step on a batch of n_pos positives, then their negatives: NSP cross-entropy,
    the gradient clipped to norm grad_clip (1.0), AdamW at this step's lr. Returns the loss, on the
    device (an .item() here would make the CPU wait for the GPU every step)."""
    labels = torch.ones(len(batch["input_ids"]), dtype=torch.long)
    labels[:n_pos] = 0  # class 0 = a true triple, BERT's "is next"
    with autocast(dtype, device):
        logits = forward(**{k: to_device(v, device) for k, v in batch.items()})
    loss = torch.nn.functional.cross_entropy(logits.float(), to_device(labels, device))
    loss.backward()  # under DDP the gradients are averaged over the processes here
    torch.nn.utils.clip_grad_norm_(params.values(), grad_clip)
    for g in opt.param_groups:
        g["lr"] = lr * g["lr_scale"]
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def train(tr: "Trainer", total_steps: int) -> bool:
    """The training loop, up to step `total_steps`; False if a signal stopped it (saved, to
    resume). Each epoch draws its negatives and orders its steps; each step sets the lr, takes one
    optimizer step, logs, makes a dev point and saves every --dev-every steps, and stops on a
    signal; each epoch ends with a dev point, best.safetensors if better, ckpt.safetensors and the
    resume state. --patience ends the run at an epoch's end once dev has stopped rising."""
    run, history, kg = tr.run, tr.history, tr.kg
    warm = max(1, int(run.warmup * total_steps))  # learning_rate's warm-up steps
    # history["epoch"] and ["step"] count the epochs and steps done; the loops' indices are 0-based
    for epoch_index in range(history["epoch"], run.epochs):
        if history["step"] >= total_steps or runlog.stalled(history, run.patience, tr.log0, tr.ddp):
            break
        tr.ddp_model.train()
        neg = tr.negatives.negatives(epoch_index)  # (N, K, 3): each train positive's K corruptions
        order = step_order(tr, neg, epoch_index)  # (steps, positives per step on this process)
        first = epoch_index * len(order)  # the epoch's first step: a resumed run starts further on
        meter = runlog.Meter(history["train_wall_s"], tr.device)
        for i in range(history["step"] - first, min(len(order), total_steps - first)):
            step_index = first + i
            last_step = i == len(order) - 1 or step_index + 1 == total_steps
            # lr
            lr = learning_rate(step_index, run.lr, warm, total_steps)
            # step: the positives, then their negatives; seeded dropout: --resume replays a step
            torch.manual_seed(run.seed + 1_000_003 * step_index + tr.ddp_rank)
            idx = order[i]
            # (n_pos, 3) positives, then (n_pos, K, 3) -> (n_pos*K, 3) negatives
            triples = np.concatenate([kg.train[idx], neg[idx].reshape(-1, 3)])
            batch = build_batch(tr.enc, triples, run.prompts, run.max_seq_length)
            loss = train_step(tr.forward, tr.opt, tr.params, batch, n_pos=len(idx), lr=lr,
                              grad_clip=run.grad_clip, dtype=tr.dtype, device=tr.device)
            history["step"] = step_index + 1
            meter.add(loss, batch)
            # log
            if history["step"] % run.log_every == 0 or last_step:
                figures = meter.figures(epoch_index, history["step"], total_steps, lr,
                                        n_triples=len(triples), world_size=tr.world_size)
                tr.log0(runlog.Meter.format_line(figures, run.epochs, tr.dtype))
                if tr.metrics:
                    tr.metrics.write(figures)
            # dev point and save: every --dev-every steps (the epoch's end saves the rest)
            if run.dev_every and history["step"] % run.dev_every == 0 and not last_step:
                with meter.paused(history):
                    dev_point(tr, round(epoch_index + (i + 1) / len(order), 3), ["state"])
            # stop signal: Ctrl-C, or a kill; this step is kept, saved, and resumes
            if runlog.stop_requested(history["step"], run.log_every, tr.ddp):
                history["train_wall_s"] = meter.wall()
                save_stopped(tr)
                return False
        history["train_wall_s"] = meter.wall()
        if note := meter.at_prior(negatives_a_positive=neg.shape[1]):
            tr.log0(note)
        # the epoch's end: a dev point, then best (if better), ckpt and the resume state
        history["epoch"] = epoch_index + 1
        dev_point(tr, epoch_index + 1, ["ckpt", "state"])
    return True


def epoch_order(lengths: np.ndarray, per_step: int, epoch_index: int, seed: int,
                pool_steps: int = 100) -> np.ndarray:
    """(steps, per_step) train-positive indices, alike on every rank and after --resume: a seeded
    permutation sorted by `lengths` in pools of `pool_steps` steps (0: a plain shuffle), so steps
    pad little, then shuffled."""
    rng = np.random.default_rng([seed, epoch_index, 1])  # [seed, epoch_index]: the negatives
    n_steps = len(lengths) // per_step
    perm = rng.permutation(len(lengths))[:n_steps * per_step]
    if not pool_steps:
        return perm.reshape(n_steps, per_step)  # (steps, per_step)
    pool = np.arange(len(perm)) // (pool_steps * per_step)
    perm = perm[np.lexsort((lengths[perm], pool))]  # by pool, then by length inside the pool
    return perm.reshape(n_steps, per_step)[rng.permutation(n_steps)]


def step_order(tr: "Trainer", neg: np.ndarray, epoch_index: int) -> np.ndarray:
    """This process's positives of each step of the epoch, similar lengths together
    (epoch_order)."""
    run = tr.run
    group = np.concatenate([tr.kg.train[:, None], neg], 1).reshape(-1, 3)  # positive, negatives
    lengths = seq_lengths(tr.enc, group, run.prompts, run.max_seq_length)
    lengths = lengths.reshape(len(neg), -1).max(1)  # (N,) the longest of each positive's group
    # process r takes every world_size-th positive of each global step (DistributedSampler's split)
    return epoch_order(lengths, run.batch, epoch_index, run.seed)[:, tr.ddp_rank::tr.world_size]


def save_stopped(tr: "Trainer") -> None:
    """Process 0 saves a stopped run's weights and resume state, and says how to go on."""
    if tr.ddp_rank != 0:
        return
    save_run(tr.out, tr.model, tr.opt, tr.params, meta=tr.meta | tr.history,
             names=["ckpt", "state"])
    tr.log0(f"stopped at step {tr.history['step']} ({runlog.STOP[0]}; "
            f"{tr.history['train_wall_s'] / 60:.1f} min of steps): {tr.out}/ckpt.safetensors "
            f"holds this step's weights; --resume continues from {tr.out}/state.safetensors")


def dev_point(tr: "Trainer", at_epoch: float, names: list[str]) -> None:
    """Process 0's dev point at `at_epoch` epochs of training (mid-epoch: a fraction) into the
    history and the log, then the saves `names`; at an epoch's end (ckpt among them) also
    best.safetensors, if dev is the best so far. The other processes wait."""
    if tr.ddp_rank == 0:
        history, end = tr.history, "ckpt" in names
        if len(tr.kg.dev):  # a graph of one's own may lack a dev split
            figure, line = dev_metric(tr.model.eval(), tr.kg, tr.enc, tr.run, device=tr.device,
                                      precision=tr.dtype, near=tr.near)
            tr.model.train()
            history["dev"].append({"epoch": at_epoch, "step": history["step"], **figure})
            better = end and (history["best"] is None or figure["value"] > history["best"])
            if better:
                history["best"], history["best_epoch"] = figure["value"], at_epoch
                names = ["best", *names]
            where = f"after epoch {at_epoch}"
            if not end:
                where = f"at step {history['step']} (epoch {at_epoch})"
            tr.log0(f"dev {where}: {line}" + (" (best so far)" if better else ""))
            tr.metrics.write({"kind": "dev", **history["dev"][-1]})
            write_curve(tr.out)  # curve.png beside log.txt, where matplotlib is installed
        save_run(tr.out, tr.model, tr.opt, tr.params, meta=tr.meta | history, names=names)
    if tr.ddp:
        dist.barrier()  # the other processes wait for process 0's dev evaluation and saves


# ----------------------------------------------------------------------------- the set-up
@dataclass(eq=False)
class Trainer:
    """What the steps of a run share, built once by setup; `history` (epochs and steps done, the dev
    curve, best, training seconds) goes into every checkpoint and comes back on --resume."""
    run: flags.Run
    out: Path
    model: torch.nn.Module
    ddp_model: torch.nn.Module  # the model, under DDP with torchrun
    forward: typing.Callable  # ddp_model, under torch.compile with --compile: what a step calls
    opt: torch.optim.Optimizer
    params: dict
    meta: dict
    history: dict
    kg: typing.Any
    enc: typing.Any
    negatives: NegativeSampler
    near: np.ndarray | None
    device: torch.device
    dtype: str
    ddp_rank: int
    world_size: int
    log0: typing.Callable  # process 0 prints and logs to out/log.txt; the others stay quiet
    metrics: runlog.Metrics | None  # process 0's out/metrics.jsonl; None on the others

    @property
    def ddp(self) -> bool:
        """Whether the run's processes form a group (torchrun)."""
        return self.world_size > 1 or dist.is_initialized()


def palt_config(run: flags.Run) -> PaltConfig:
    """The method and its parts as the flags give them."""
    lora = dict(lora_rank=run.lora_rank, lora_alpha=run.lora_alpha) if run.method == "lora" else {}
    return PaltConfig(method=run.method, prompts=run.prompts, calib_layers=run.calib,
                      prompt_encoder=not run.no_wp, prompt_mlp=run.prompt_mlp,
                      head_input=run.head_input, **lora)


def build(run: flags.Run, dtype: str, device: torch.device) -> tuple:
    """The PALT model (a random NSP head seeded alike on every process), graph, token ids, metadata,
    trainable params, AdamW."""
    kg = load_kg(run.data, run.data_dir, run.text)  # before the model: a data error costs seconds
    torch.manual_seed(run.seed)
    model, loaded = build_palt(run.model, palt_config(run))
    flags.check_model(run, model, loaded)
    record = flags.recorded(run)  # paths inside the project relative to it, others absolute
    report = param_report(model)
    meta = dict(model=record["model"], weights_sha256=loaded.weights_sha256, data=record["data"],
                data_fingerprint=kg.fingerprint, text=run.text, text_file=kg.text_file,
                prompts=list(run.prompts), max_seq_length=run.max_seq_length, dtype=dtype,
                palt=palt_meta(model), run=json.dumps(record), tunable=report["tunable"],
                total=report["total"], negative_filter="train",  # corruptions redrawn when in train
                search=run.search or search_of(run.recipe, run.data))  # the search behind them
    model.to(device)
    hold_frozen_linears(model, dtype)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    return model, kg, encode(kg, loaded.tokenizer), meta, params, adamw(model, params, run, device)


def setup(run: flags.Run) -> tuple["Trainer", int]:
    """(Trainer, total steps): torchrun's processes, the model, data and AdamW, the negatives, DDP,
    the resumed state. Every check that can fail comes before the work it would waste."""
    if run.tensorboard:  # an optional extra: its absence is said before anything starts
        runlog.check_tensorboard()
    procs = devices.start_processes(run.dtype)  # torchrun's processes; the precision, and why
    ddp, device, dtype, world_size = procs.ddp, procs.device, procs.dtype, procs.world_size
    master_process = procs.rank == 0  # it logs, evaluates on dev and saves
    print0 = runlog.Printer(master_process)
    flags.check_devices(run, device, ddp=ddp, world_size=world_size, print0=print0)
    out = Path(run.out)
    state_file = out / "state.safetensors"
    resumed = check_output(out, run.resume)  # before anything loads: nothing lost, no work wasted
    # A resume checks the settings and precision now, and the base weights and data files once
    # they are read, so that a mismatch is refused before minutes of loading and embedding.
    if resumed:
        check_resumable(resumed, {"run": json.dumps(flags.recorded(run)), "dtype": dtype},
                        state_file)
    model, kg, enc, meta, params, opt = build(run, dtype, device)
    if resumed:  # before the nearest-entity pass, which takes minutes on a big graph
        check_resumable(resumed, meta, state_file)
    total_steps = flags.total_steps(run, len(kg.train))
    flags.announce(run, kg, model, where=f"{dtype} on {device} x {world_size}", print0=print0,
                   presets=PRESETS)
    finished = bool(resumed) and resumed["step"] >= total_steps  # resumed when done: nothing to do
    near = None
    if (run.hard_negatives or run.dev_near) and not finished:  # minutes on a big graph
        near = nearest_of_each(model, kg, enc, device=device, dtype=dtype, n=flags.NEAR,
                               print0=print0)
    negatives = NegativeSampler(kg, *run.negatives, seed=run.seed, near=near,
                                hard=run.hard_negatives, either_side=run.either_side)
    ddp_model = model
    if ddp:  # each process's gradients averaged in backward
        ddp_model = DDP(model, device_ids=[procs.local_rank] if device.type == "cuda" else None)
    # A second run into --out is refused here.
    claim_output(out, run.resume, seen=resumed, master_process=master_process, ddp=ddp)
    history = restore(resumed, state_file, model=model, opt=opt, params=params)
    log0 = runlog.open_log(out, print0) if master_process else print0
    metrics = runlog.Metrics(out, tensorboard=run.tensorboard) if master_process else None
    if metrics:  # a resumed segment does the steps after its state's step again
        metrics.write({"kind": "start", "step": history["step"]})
    # In the log too: each segment says where it trains; a resumed one, where it continued.
    log0(runlog.segment_line(run.resume, resumed, history, state_file,
                             where=f"{devices.machine(device)} x {world_size}"))
    tr = Trainer(run=run, out=out, model=model, ddp_model=ddp_model,
                 forward=compiled(ddp_model, run), opt=opt, params=params, meta=meta,
                 history=history, kg=kg, enc=enc, negatives=negatives, near=near, device=device,
                 dtype=dtype, ddp_rank=procs.rank, world_size=world_size, log0=log0,
                 metrics=metrics)
    return tr, total_steps


def main(run: flags.Run) -> torch.nn.Module:
    """Set the run up, train it, say where its checkpoints are; returns the model."""
    tr, total_steps = setup(run)
    stopped = not train(tr, total_steps)
    history, out = tr.history, tr.out
    if tr.ddp_rank == 0 and not stopped:
        print(runlog.finished(history, out, tr.dtype), flush=True)
    model = tr.model
    release_folder(out)  # the run folder is free for the next run (a --resume)
    # DDP's reducer holds the group's gloo work, and a reducer still alive when the group is
    # destroyed can abort the exit (SIGABRT, "terminate called without an active exception"), so
    # that DDP is freed before the group goes.
    if tr.ddp:
        tr.ddp_model = tr.forward = None
        del tr
        dist.barrier()
        dist.destroy_process_group()
    return model


def command_line(argv: list[str] | None = None) -> None:
    """python train.py ARGS: a signal ends the run after a step, saved; errors are one line."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, runlog.on_signal)
    try:
        main(parse_args(argv))
    except ERRORS as e:  # one line, no traceback
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    command_line()
