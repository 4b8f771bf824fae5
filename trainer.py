"""A training run set up: the processes and the device, the checks that depend on them, the PALT
model, graph, token ids and AdamW, the negatives' sampler, the resumed state; all of it in a
Trainer, which train.py's loop reads."""
import json
import time
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import flags
from checkpoints import check_output, check_resumable, open_log, palt_meta, restore
from data import NegativeSampler, encode, entity_embeddings, nearest_entities
from devices import check_compiler, compiled, init_distributed
from flags import NEAR, check_seq_length
from graphs import DATASETS, load_kg
from palt import PaltConfig, build_palt, param_report


@dataclass(eq=False)
class Trainer:
    """What the steps of a run share, built once by setup; `history` (epoch, step, dev curve, best,
    training seconds) goes into every checkpoint and comes back on --resume."""
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

    @property
    def ddp(self):
        return self.world_size > 1 or dist.is_initialized()



def build(run, dtype, device):
    """The PALT model (new heads seeded alike on every rank), graph, token ids, metadata, trainable
    params, AdamW."""
    kg = load_kg(run.data, run.data_dir, run.text)  # before the model: a data error costs seconds
    torch.manual_seed(run.seed)
    cfg = PaltConfig(prompts=run.prompts, calib_layers=run.calib, prompt_encoder=not run.no_wp,
                     prompt_mlp=run.prompt_mlp, finetune=run.finetune)
    model, loaded = build_palt(run.model, cfg)
    positions = loaded.config.max_position_embeddings
    check_seq_length(run.max_seq_length, sum(run.prompts), positions, loaded.path.name)
    if not any(p.requires_grad for p in model.parameters()):
        raise SystemExit("error: nothing to train (zero-shot needs no training: use evaluate.py "
                         "--model)")
    report = param_report(model)
    record = flags.recorded(run)  # paths inside the project relative to it, others absolute
    meta = dict(model=record["model"], weights_sha256=loaded.weights_sha256, data=record["data"],
                data_fingerprint=kg.fingerprint, text=run.text, text_file=kg.text_file,
                prompts=list(run.prompts), max_seq_length=run.max_seq_length, dtype=dtype,
                palt=palt_meta(model), run=json.dumps(record), tunable=report["tunable"],
                total=report["total"], negative_filter="train")  # corruptions redrawn when in train
    model.to(device)
    # bf16 autocast recasts a frozen weight at every call (it caches only weights that train: ~60
    # cast kernels a step on a GPU): the encoder's frozen linears are cast once instead, to the same
    # values, so the steps are bit-identical. The NSP head stays as it is: it runs in fp32.
    if dtype == "bf16":
        for m in model.bert.layers.modules():
            if isinstance(m, torch.nn.Linear) and not any(p.requires_grad for p in m.parameters()):
                m.to(torch.bfloat16)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    return model, kg, encode(kg, loaded.tokenizer), meta, params, adamw(model, params, run, device)


def adamw(model, params, run, device):
    """AdamW with weight decay on matrices only (not biases and LayerNorm), and a new head's own lr
    (--head-lr) as a scale of the lr."""
    groups = {}  # (decay, new head) -> parameters
    new_heads = [["bert", name] for name in model.new_heads]
    for n, p in params.items():
        groups.setdefault((p.ndim >= 2, n.split(".")[:2] in new_heads), []).append(p)
    param_groups = []
    for (decay, new), ps in groups.items():
        scale = (run.head_lr or run.lr) / run.lr if new else 1.0
        param_groups.append({"params": ps, "weight_decay": run.weight_decay if decay else 0.0,
                             "lr_scale": scale})
    return torch.optim.AdamW(param_groups, lr=run.lr, betas=(0.9, 0.999), eps=1e-8,
                             fused=device.type == "cuda")


def check_devices(run, device, ddp, print0, world_size):
    """The flags that depend on where the run is: before anything loads."""
    # DDP's gradient all-reduce runs inside the backward a graph captures
    if run.cudagraphs and ddp:
        raise SystemExit("error: --cudagraphs trains on one GPU without DDP: leave it out under "
                         "torchrun")
    check_compiler(run.compile, device)
    if run.cudagraphs and device.type != "cuda":
        print0(f"--cudagraphs: CUDA graphs exist on a GPU only; on {device.type} the step is "
               "compiled without them")
    if run.batch % world_size:
        raise SystemExit(f"error: --batch {run.batch} is not divisible by the {world_size} ranks")


def setup(run, presets):
    """(Trainer, total steps): processes, checks, model, data, negatives, the resumed state;
    presets: train.PRESETS, for a graph of one's own."""
    # torchrun's DDP: ranks from the environment, set_device, one process group
    ddp_rank, ddp_local_rank, world_size, device, dtype = init_distributed(run.dtype)
    ddp = world_size > 1 or dist.is_initialized()
    print0 = Printer(ddp_rank == 0)
    check_devices(run, device, ddp, print0, world_size)
    out = Path(run.out)
    state = out / "state.safetensors"
    resumed = check_output(out, run.resume)  # before anything loads: nothing lost, no work wasted
    # the settings and precision now, the base weights and data files once read: before minutes
    if resumed:
        check_resumable(resumed, {"run": json.dumps(flags.recorded(run)), "dtype": dtype},
                        state)
    model, kg, enc, meta, params, opt = build(run, dtype, device)
    if resumed:  # before the nearest-entity pass (minutes on a big graph)
        check_resumable(resumed, meta, state)
    steps_per_epoch = len(kg.train) // run.batch
    if steps_per_epoch == 0:
        raise SystemExit(f"error: --batch {run.batch} is larger than the {len(kg.train)} train "
                         "triples")
    total = min(run.epochs * steps_per_epoch, run.max_steps or run.epochs * steps_per_epoch)
    announce(run, kg, model, f"{dtype} on {device} x {world_size}", print0, presets)
    finished = bool(resumed) and resumed["step"] >= total  # a finished run resumed: nothing to do
    near = None
    if (run.hard_negatives or run.dev_near) and not finished:  # 1 s on umls, 2.5 min WN18RR (CPU)
        t = time.time()
        emb = entity_embeddings(model.bert, kg.split_entities, enc, device, dtype)
        near = nearest_entities(kg, emb, NEAR)
        print0(f"nearest {NEAR} entities of each entity by the frozen encoder: "
               f"{time.time() - t:.0f} s")
    negatives = NegativeSampler(kg, *run.negatives, seed=run.seed, near=near,
                                hard=run.hard_negatives)
    ddp_model = model
    if ddp:
        ddp_model = DDP(model, device_ids=[ddp_local_rank] if device.type == "cuda" else None)
    history = restore(resumed, state, model, opt, params)
    log0 = open_log(out, print0) if ddp_rank == 0 else print0
    if run.resume:  # in the log too: a resumed run's log shows where it stopped and continued
        log0(f"resumed from {state}: epoch {history['epoch']}, step {history['step']}" if resumed
             else f"--resume: no checkpoint in {out} yet, starting from scratch")
    return Trainer(run, out, model, ddp_model, compiled(ddp_model, run), opt, params, meta, history,
                   kg, enc, negatives, near, device, dtype, ddp_rank, world_size, log0), total


class Printer:
    """print for process 0, flushed; silence for the others."""

    def __init__(self, enabled):
        self.enabled = enabled

    def __call__(self, *args, **kwargs):
        if self.enabled:
            print(*args, **kwargs, flush=True)


def announce(run, kg, model, where, print0, presets):
    """The run's first lines: the graph, the model's tunable parameters, where it trains; for a
    graph of one's own the settings it got; what the graph lacks."""
    r = param_report(model)
    print0(f"{kg.name}: {len(kg.train):,} train triples, {len(kg.entities):,} entities, text "
           f"{kg.text_file} | {Path(run.model).name}: tunable {r['tunable']:,} of {r['total']:,} "
           f"({r['percent']:.2f}%) {r['parts']} | {where}")
    if run.data not in DATASETS:
        own = ", ".join(f"{k} {getattr(run, k)}" for k in presets[run.recipe]["own"])
        print0(f"settings for a graph of one's own (PRESETS['{run.recipe}']['own'], flags win): "
               + own)
    notes = list(kg.notes)
    if len(kg.dev) == 0:
        notes.append(f"{kg.folder}: no {kg.split_files['dev'].name}, so no dev points and no "
                     "best.safetensors; ckpt.safetensors is the last epoch")
    for note in notes:
        print0(note)
