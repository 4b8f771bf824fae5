"""Train PALT on a knowledge graph: one CPU, one GPU, or many with torchrun.

  python train.py --data umls --model minilm --epochs 3
  torchrun --nproc_per_node 8 train.py --data wn11 --model bert-base-cased
"""
import argparse, json, os, re, signal, time, typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import evaluate
from bert import DTYPES, CheckpointError, autocast, to_device
from data import (DATASETS, TEXTS, DataError, NegativeSampler, build_batch, dataset, encode, entity_embeddings, load_kg,
                  nearest_entities, seq_lengths)
from files import check_writable
from palt import (ConfigError, PaltConfig, build_palt, check_compiler, check_limits, check_seq_length, init_distributed,
                  palt_meta, param_report, read_checkpoint, save_atomic, save_checkpoint, trainable_state)

# Run's settings per dataset. paper: the paper's appendix (BERT-base, GPU; umls: our choice). cpu: ours for MiniLM on
# a few CPU cores (RESULTS.md); a big graph's dev MRR is estimated: dev_near nearest scored, dev_sample drawn.
CPU = dict(lr=1e-3, batch=32, prompts=(2, 0, 0), negatives=(1, 1, 1))
BIG_CPU = CPU | dict(epochs=1, negatives=(1, 0, 1), dev_limit=50, dev_sample=100, dev_every=500, dev_near=32)
PRESETS = {
    "paper": {
        "wn11": dict(lr=1.5e-4, epochs=40, negatives=(1, 1, 1), prompts=(2, 0, 0), batch=32),
        "fb13": dict(lr=1.5e-5, epochs=40, negatives=(1, 1, 1), prompts=(10, 10, 10), batch=32),
        "fb15k-237": dict(lr=1e-4, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8, dev_limit=50,
                          dev_sample=100, dev_near=32),
        "wn18rr": dict(lr=1e-5, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8, dev_limit=50,
                       dev_sample=100, dev_near=32),
        "umls": dict(lr=1e-4, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8, dev_limit=100),
    },
    "cpu": {"wn11": CPU | dict(epochs=3), "fb13": CPU | dict(epochs=1), "umls": CPU | dict(epochs=8, dev_limit=100),
            "fb15k-237": BIG_CPU, "wn18rr": BIG_CPU},
}
PRESETS["paper"]["own"] = PRESETS["paper"]["umls"] | dict(dev_sample=1000)  # a graph of one's own: --data FOLDER
PRESETS["cpu"]["own"] = PRESETS["cpu"]["umls"] | dict(epochs=5, dev_sample=1000)
# gpu: the cpu recipe compiled (batch: 2x with lr x sqrt 2 trains UMLS alike at equal sequences, 4x-8x worse; 2x
# awaits a GPU speed figure and a WN18RR check at a lease's budget: RESULTS.md, issue 41); big graphs: the paper's
# 10 epochs with the CPU sweep's choice at 1,000 steps (RESULTS.md): FB15k-237 negatives 5,5,5,2; WN18RR hard
# negatives 0.5. What a lease runs (gpu_runbook)
PRESETS["gpu"] = {name: p | dict(compile=True) for name, p in PRESETS["cpu"].items()}
# A dev point every 2,500 steps, not 500: on a GPU 500 steps take ~6 s, a dev point and its state save ~2-3 s (stop 48)
PRESETS["gpu"]["wn18rr"] |= dict(epochs=10, negatives=(1, 0, 1, 2), hard_negatives=0.5, dev_every=2500)
PRESETS["gpu"]["fb15k-237"] |= dict(epochs=10, negatives=(5, 5, 5, 2), dev_every=2500)
STOP = []  # the signals received: SIGINT (Ctrl-C) or SIGTERM end a run after the step under way, saved to resume
NEAR = 32  # --hard-negatives draw from each entity's NEAR nearest entities; --dev-near takes the first of them


def int_list(s, n=()):
    """'2,0,0' -> (2, 0, 0): n (allowed counts) non-negative integers, or without n any number, and 'none' -> ()."""
    try:
        t = () if s == "none" and not n else tuple(int(x) for x in s.split(","))
    except ValueError:
        t = (-1,)
    if (n and len(t) not in n) or min(t, default=0) < 0:
        what = (f"{' or '.join(map(str, n))} non-negative integers like 2,0,0" if n else
                "layer numbers like 6,11, or none")
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return t


def setting(default=None, help="", low=None, high=None, parse=None, choices=None):
    """A Run field and its --flag: one home for the default, the help, the bounds (low: (value, allowed itself);
    high: (value, what it is)), the text's parser and the choices. None: PRESETS[recipe][data] fills it."""
    return field(default=default, metadata=dict(help=help, low=low, high=high, parse=parse, choices=choices))


@dataclass
class Run:
    data: str = setting(help=f"{', '.join(DATASETS)}, or a folder with train.tsv (README)")
    recipe: str = setting("paper", "PRESETS[recipe][data] fills every setting left open", choices=tuple(PRESETS))
    model: str = setting("minilm", "minilm, bert-base-cased, ..., or a folder with a BERT model.safetensors")
    data_dir: str | None = setting(help="folder holding the datasets (default $PALT_DATA, else data/)")
    text: str = setting("name", "entity texts: names, long (umls, fb13), description (fb15k-237)", choices=TEXTS)
    out: str | None = setting(help="checkpoint and log folder (default runs/<data>-<model>)")
    epochs: int | None = setting(low=(1, True), help="passes over the train triples")
    max_steps: int | None = setting(low=(1, True), help="stop (and schedule the lr) as if training ended here")
    lr: float | None = setting(low=(0, False), help="peak learning rate")
    head_lr: float | None = setting(low=(0, False), help="lr of the heads the checkpoint lacked (MiniLM's pooler "
                                    "and NSP head); default --lr")
    batch: int | None = setting(low=(1, True), help="positive triples per step over all processes")
    negatives: tuple | None = setting(parse=lambda s: int_list(s, (3, 4)), help="corruptions of head, relation, tail "
                                      "per positive [, self-negatives (h, r, h), (t, r, t)], e.g. 1,0,1,2")
    prompts: tuple | None = setting(parse=lambda s: int_list(s, (3,)), help="b,m,e prompt tokens, e.g. 2,0,0")
    calib: tuple | None = setting(parse=int_list, help="calibrated layers, e.g. 6,11, or none (default: the middle "
                                  "and the last)")
    no_wp: bool = setting(False, "ablation: no prompt encoder W_p")
    prompt_mlp: bool = setting(False, "re-parametrise the prompts through an MLP")
    finetune: bool = setting(False, "train the whole LM, no PALT parts (KG-BERT's row)")
    dtype: str = setting("auto", "autocast: auto = bf16 on GPU and on CPUs with native bf16, else fp32", choices=DTYPES)
    compile: bool | None = setting(help="torch.compile the step (recipe gpu does; on CPU it needs g++)")
    cudagraphs: bool = setting(False, "with --compile on one GPU: replay each padded length's step as a CUDA graph "
                               "(torch.compile's reduce-overhead), not as hundreds of launches")
    max_seq_length: int = setting(192, "every position the model sees, prompts included", low=(4, True))
    dev_limit: int | None = setting(low=(1, True), help="link prediction: dev triples ranked at each dev point")
    dev_sample: int | None = setting(low=(1, True), help="... against a seeded sample of N entities, not all")
    dev_every: int | None = setting(low=(1, True), help="also a dev point and a resume state every N steps")
    dev_near: int | None = setting(low=(1, True), high=(NEAR, "the nearest entities found once per run"),
                                   help="... or estimate the exact ranks: the N nearest scored, --dev-sample draws")
    hard_negatives: float | None = setting(None, "the share of entity corruptions drawn from the replaced one's "
                                           "nearest (default: the recipe's, else 0)", low=(0, True),
                                           high=(1, "a share of the entity corruptions"))
    warmup: float = setting(0.1, "linear warm-up, a fraction of the steps", low=(0, True),
                            high=(1, "a fraction of the steps"))
    weight_decay: float = setting(0.01, "AdamW's, on matrices only", low=(0, True))
    grad_clip: float = setting(1.0, "gradient norm clipping", low=(0, False))
    seed: int = setting(42, "order, negatives, new heads and dropout", low=(0, True))
    log_every: int = setting(20, "steps between log lines", low=(1, True))
    resume: bool = setting(False, "continue the run in --out from its last saved state")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # '-1,0,0' and '-1e-3' are values (refused below with their own message), not unknown options
    ap._negative_number_matcher = re.compile(r"^-\.?\d")
    for f in fields(Run):  # each field is its flag: type, default, help
        m, flag = f.metadata, "--" + f.name.replace("_", "-")
        kind = next(t for t in typing.get_args(f.type) or (f.type,) if t is not type(None))
        if kind is bool:  # a switch; a None default (the recipe decides) also takes --no-FLAG
            ap.add_argument(flag, action="store_true" if f.default is False else argparse.BooleanOptionalAction,
                            help=m["help"])
        else:
            ap.add_argument(flag, type=m["parse"] or kind, default=f.default, choices=m["choices"], help=m["help"],
                            required=f.name == "data")
    run = Run(**vars(ap.parse_args(argv)))
    try:
        name = dataset(run.data, run.data_dir)[0]  # a benchmark's name, or a folder with train.tsv
    except DataError as e:
        ap.error(str(e))
    run.data = name if run.data.lower() in DATASETS else run.data
    for k, v in PRESETS[run.recipe][run.data if run.data in DATASETS else "own"].items():
        if getattr(run, k) is None:
            setattr(run, k, v)
    run.hard_negatives = run.hard_negatives or 0.0  # a recipe without them: none
    # the bounds beside each field, checked before anything loads
    check_limits(ap, run, {f.name: f.metadata["low"] for f in fields(Run) if f.metadata["low"]})
    for f in fields(Run):
        high, value = f.metadata["high"], getattr(run, f.name)
        if high and value is not None and value > high[0]:
            ap.error(f"--{f.name.replace('_', '-')}: at most {high[0]} ({high[1]}), not {value}")
    if sum(run.negatives) == 0:
        ap.error("--negatives 0,0,0 leaves no false triples to learn from: give at least one corruption per positive")
    if run.negatives[3:] > (2,):
        ap.error(f"--negatives: at most 2 self-negatives, (h, r, h) and (t, r, t), not {run.negatives[3]}")
    if run.cudagraphs and not run.compile:
        ap.error("--cudagraphs replays the compiled step: it needs --compile (or --recipe gpu)")
    if run.finetune:  # the paper's Finetuning row: the whole LM, none of PALT's parts
        run.prompts, run.calib, run.no_wp = (0, 0, 0), (), True
    check_seq_length(run.max_seq_length, sum(run.prompts))
    run.out = run.out or f"runs/{name}-{Path(run.model).name}"
    return run


def epoch_order(keys, per_step, epoch, seed, pool_steps=100):
    """(steps, per_step) train-positive indices, alike on every rank and after --resume: a seeded permutation sorted
    by `keys` (lengths) in pools of `pool_steps` steps (0: a plain shuffle), so steps pad little, then shuffled."""
    rng = np.random.default_rng([seed, epoch, 1])  # (seed, epoch) alone seeds the negatives
    n_steps = len(keys) // per_step
    perm = rng.permutation(len(keys))[:n_steps * per_step]
    if not pool_steps:
        return perm.reshape(n_steps, per_step)
    pool = np.arange(len(perm)) // (pool_steps * per_step)
    perm = perm[np.lexsort((keys[perm], pool))]  # by pool, then by length inside the pool
    return perm.reshape(n_steps, per_step)[rng.permutation(n_steps)]


# settings that may change when a run resumes: where it writes and what it reports, not what it trains
RESUME_MAY_CHANGE = ("model", "data_dir", "out", "resume", "log_every", "dev_limit", "dev_sample", "dev_every",
                     "dev_near", "recipe", "compile", "cudagraphs")


def check_output(out, resume):
    """Before anything loads: --out is writable and no checkpoint is overwritten. The state's metadata if resuming."""
    state = out / "state.safetensors"
    check_writable(out, f"--out {out}")
    trained = [f.name for f in (out / "ckpt.safetensors", out / "best.safetensors", state) if f.exists()]
    if trained and not resume:
        raise SystemExit(f"error: {out}/{trained[0]} exists: --resume to continue it, or choose another --out")
    if trained and not state.exists():  # a checkpoint without its optimizer state cannot continue exactly: never guess
        raise SystemExit(f"error: {out}/{trained[0]} exists but {state} does not, so the run cannot continue "
                         f"exactly; nothing was changed: choose another --out")
    return read_checkpoint(state, kind="train-state", tensors=False)[1] if trained else None


def check_resumable(saved, meta, state):
    """The resume state's own record of its run against this one: an exact replay needs the same settings, base
    weights, data files and resolved precision."""
    old, new = json.loads(saved["run"]), json.loads(meta["run"])
    mine = {k: (old.get(k), new[k]) for k in new if k not in RESUME_MAY_CHANGE}
    mine |= {k: (saved.get(k), meta[k]) for k in ("weights_sha256", "data_fingerprint", "dtype") if k in meta}
    for k, (was, now) in mine.items():
        if was != now:
            raise SystemExit(f"error: {state} was trained with {k} {was}, not {now}: resume with the same settings, "
                             f"or choose another --out")


def save(out, model, opt, params, meta, names):
    """out/NAME.safetensors for NAME in names, state (to resume) last: a kill in between replays from the one before."""
    for name in names:
        try:
            if name == "state":  # the resume unit, one file: the trainable tensors and their AdamW moments
                moments = {f"{k}.{n}": v.detach().cpu().reshape(-1) if k == "step" else v.detach().cpu()
                           for n, p in params.items() for k, v in opt.state.get(p, {}).items()}
                tensors = {f"model.{n}": t for n, t in trainable_state(model).items()}
                save_atomic(out / "state.safetensors", tensors | moments, meta | {"kind": "train-state"})
            else:
                save_checkpoint(out / f"{name}.safetensors", model, meta)
        except OSError as e:
            raise SystemExit(f"error: cannot write {out / name}.safetensors ({e.strerror}); the previous file is kept: "
                             f"fix that and run again with --resume to continue from the last saved state")


def build(run, dtype, device):
    """The PALT model (new heads seeded alike on every rank), graph, token ids, metadata, trainable params, AdamW."""
    kg = load_kg(run.data, run.data_dir, run.text)  # before the model: a data error costs seconds
    torch.manual_seed(run.seed)
    cfg = PaltConfig(prompts=run.prompts, calib_layers=run.calib, prompt_encoder=not run.no_wp,
                     prompt_mlp=run.prompt_mlp, finetune=run.finetune)
    model, loaded = build_palt(run.model, cfg)
    check_seq_length(run.max_seq_length, sum(run.prompts), loaded.config.max_position_embeddings, loaded.path.name)
    if not any(p.requires_grad for p in model.parameters()):
        raise SystemExit("error: nothing to train (zero-shot needs no training: use evaluate.py --model)")
    report = param_report(model)
    meta = dict(model=run.model, weights_sha256=loaded.weights_sha256, data=run.data, data_fingerprint=kg.fingerprint,
                text=run.text, text_file=kg.text_file, prompts=list(run.prompts), max_seq_length=run.max_seq_length,
                dtype=dtype, palt=palt_meta(model), run=json.dumps(asdict(run)), tunable=report["tunable"],
                total=report["total"], negative_filter="train")  # corruptions redrawn when in train
    model.to(device)
    # bf16 autocast recasts a frozen weight at every call (it caches only weights that train; stop 48's GPU profile:
    # ~60 cast kernels a step): the encoder's frozen linears are cast once instead, to the same values, so the steps
    # are bit-identical. The NSP head stays as it is: it runs in fp32.
    if dtype == "bf16":
        for m in model.bert.layers.modules():
            if isinstance(m, torch.nn.Linear) and not any(p.requires_grad for p in m.parameters()):
                m.to(torch.bfloat16)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    groups = {}  # (weight decay: not on biases and LayerNorm, a new head: its own lr) -> parameters
    for n, p in params.items():
        groups.setdefault((p.ndim >= 2, n.split(".")[:2] in [["bert", h] for h in model.new_heads]), []).append(p)
    opt = torch.optim.AdamW([{"params": ps, "weight_decay": run.weight_decay if decay else 0.0,
                              "lr_scale": (run.head_lr or run.lr) / run.lr if new else 1.0}
                             for (decay, new), ps in groups.items()],
                            lr=run.lr, betas=(0.9, 0.999), eps=1e-8, fused=device.type == "cuda")
    return model, kg, encode(kg, loaded.tokenizer), meta, params, opt


@dataclass(eq=False)
class Training:
    """What the steps of a run share, built once by main; `history` (epoch, step, dev curve, best, training seconds)
    goes into every checkpoint and comes back on --resume."""
    run: Run
    out: Path
    model: torch.nn.Module
    forward: typing.Callable  # the model under DDP and torch.compile: what a step calls
    opt: torch.optim.Optimizer
    params: dict
    meta: dict
    history: dict
    kg: typing.Any
    enc: typing.Any
    near: np.ndarray | None
    device: torch.device
    dtype: str
    log0: typing.Callable  # process 0 prints and logs to out/log.txt; the others stay quiet


def main(run):
    # torchrun's DDP: ranks from the environment, set_device, one process group
    ddp_rank, ddp_local_rank, world_size, device, dtype = init_distributed(run.dtype)
    ddp, master_process = world_size > 1 or dist.is_initialized(), ddp_rank == 0
    print0 = lambda *a, **k: print(*a, **k, flush=True) if master_process else None
    if run.cudagraphs and ddp:  # DDP's gradient all-reduce runs inside the backward a graph would capture
        raise SystemExit("error: --cudagraphs trains on one GPU without DDP: leave it out under torchrun")
    check_compiler(run.compile, device)
    if run.cudagraphs and device.type != "cuda":
        print0(f"--cudagraphs: CUDA graphs exist on a GPU only; on {device.type} the step is compiled without them")
    if run.batch % world_size:
        raise SystemExit(f"error: --batch {run.batch} is not divisible by the {world_size} ranks")
    out = Path(run.out)
    resumed = check_output(out, run.resume)  # before anything loads: nothing is lost, no work thrown away
    if resumed:  # the settings and precision now, the base weights and data files once read: before minutes of work
        check_resumable(resumed, {"run": json.dumps(asdict(run)), "dtype": dtype}, out / "state.safetensors")

    model, kg, enc, meta, params, opt = build(run, dtype, device)
    if resumed:  # before the nearest-entity pass (minutes on a big graph)
        check_resumable(resumed, meta, out / "state.safetensors")
    steps_per_epoch = len(kg.train) // run.batch
    if steps_per_epoch == 0:
        raise SystemExit(f"error: --batch {run.batch} is larger than the {len(kg.train)} train triples")
    total = min(run.epochs * steps_per_epoch, run.max_steps or run.epochs * steps_per_epoch)
    announce(run, kg, model, f"{dtype} on {device} x {world_size}", print0)
    near, finished = None, bool(resumed) and resumed["step"] >= total  # a finished run resumed: nothing to train
    if (run.hard_negatives or run.dev_near) and not finished:  # once per run: 1 s on umls, 2.5 min for WN18RR (CPU)
        t = time.time()
        near = nearest_entities(kg, entity_embeddings(model.bert, kg.split_entities, enc, device, dtype), NEAR)
        print0(f"nearest {NEAR} entities of each entity by the frozen encoder: {time.time() - t:.0f} s")
    negatives = NegativeSampler(kg, *run.negatives, seed=run.seed, near=near, hard=run.hard_negatives)
    ddp_model = DDP(model, device_ids=[ddp_local_rank] if device.type == "cuda" else None) if ddp else model
    forward = compiled(ddp_model, run)
    history = resume(resumed, out / "state.safetensors", model, opt, params)
    log0 = open_log(out, print0) if master_process else print0
    if run.resume:  # in the log too: a resumed run's log shows where it was stopped and continued
        log0(f"resumed from {out}/state.safetensors: epoch {history['epoch']}, step {history['step']}" if resumed
             else f"--resume: no checkpoint in {out} yet, starting from scratch")
    job = Training(run, out, model, forward, opt, params, meta, history, kg, enc, near, device, dtype, log0)

    stopped = False
    for epoch in range(history["epoch"], run.epochs):
        if history["step"] >= total:
            break
        ddp_model.train()
        if stopped := not train_epoch(job, epoch, negatives.negatives(epoch), total, ddp_rank, world_size):
            break  # stopped by a signal, saved
        history["epoch"] = epoch + 1
        if master_process:  # dev after every epoch; then best (if better), last checkpoint, and the resume state
            dev_and_save(job, epoch + 1, ["ckpt", "state"])
        if ddp:
            dist.barrier()  # the other ranks wait for rank 0's dev evaluation and saves
    if master_process and not stopped:
        best = f", best by dev {out}/best.safetensors (epoch {history['best_epoch']})" if history["best_epoch"] else ""
        last = out / "ckpt.safetensors"  # a lease brings a run back without it (state holds the same weights)
        last = f"{last} ({last.stat().st_size / 2**20:.1f} MiB)" if last.exists() else f"{out}/state.safetensors"
        print0(f"trained {history['step']} steps in {history['train_wall_s'] / 60:.1f} min ({dtype}); "
               f"last {last}{best}")
    if ddp:  # DDP's reducer holds the group's gloo work: alive when the group is destroyed, it can abort the exit
        del job, forward, ddp_model  # (SIGABRT, "terminate called without an active exception"): freed first
        dist.barrier()
        dist.destroy_process_group()
    return model


def compiled(model, run):
    """What a step calls: the model, or torch.compiled (the casts, adds, LayerNorms and GELUs between the matmuls
    fuse; steps vary in length, hence dynamic), and with --cudagraphs each length's kernels replayed as one graph."""
    if not run.compile:
        return model
    return torch.compile(model, dynamic=True, mode="reduce-overhead" if run.cudagraphs else None)


def train_epoch(job, epoch, neg, total, ddp_rank, world_size):
    """The steps of one epoch over the train positives and their negatives `neg` (N, n_neg, 3), from the step a
    resumed run stopped at, up to --max-steps; a dev point and a resume state every --dev-every steps. False if a
    signal stopped it (saved, to resume)."""
    run, kg, history, device, dtype = job.run, job.kg, job.history, job.device, job.dtype
    ddp, master_process = world_size > 1 or dist.is_initialized(), ddp_rank == 0
    group = np.concatenate([kg.train[:, None], neg], 1).reshape(-1, 3)  # each positive, then its negatives
    keys = seq_lengths(job.enc, group, run.prompts, run.max_seq_length).reshape(len(neg), -1).max(1)
    # process r takes every world_size-th positive of each global step (DistributedSampler's split): similar lengths
    order = epoch_order(keys, run.batch, epoch, run.seed)[:, ddp_rank::world_size]
    warm = max(1, int(run.warmup * total))  # learning_rate's warm-up steps
    wall0, t0 = history["train_wall_s"], time.time()
    loss_sum, n_steps, n_real, n_padded = torch.zeros((), device=device), 0, 0, 0
    step, done = history["step"], epoch * len(order)  # steps of the epochs before: a mid-epoch resume starts further on
    for i in range(step - done, min(len(order), total - done)):
        idx = order[i]
        torch.manual_seed(run.seed + 1_000_003 * step + ddp_rank)  # dropout: a step replays exactly on --resume
        triples = np.concatenate([kg.train[idx], neg[idx].reshape(-1, 3)])
        batch = build_batch(job.enc, triples, run.prompts, run.max_seq_length)
        lr = learning_rate(step, run.lr, warm, total)
        loss_sum += train_step(job.forward, job.opt, job.params, batch, len(idx), lr, run.grad_clip, dtype, device)
        step, n_steps = step + 1, n_steps + 1  # the loss stays on the device: no .item(), no wait a step
        n_real, n_padded = n_real + int(batch["attention_mask"].sum()), n_padded + batch["input_ids"].numel()
        history["step"], last = step, i == len(order) - 1 or step == total
        if step % run.log_every == 0 or last:
            dt = time.time() - t0
            job.log0(f"epoch {epoch + 1}/{run.epochs} step {step}/{total} loss {loss_sum.item() / n_steps:.4f} "
                     f"lr {lr:.2e} seq/s {n_steps * len(triples) * world_size / dt:.0f} "
                     f"padded/real {n_padded / n_real:.2f} {dtype} eta {(total - step) * dt / n_steps / 60:.1f}m")
        if run.dev_every and step % run.dev_every == 0 and not last:  # the epoch's end saves the rest
            if master_process:  # a point of the curve and a state to resume from
                history["train_wall_s"], spent = wall0 + time.time() - t0, time.time()
                dev_and_save(job, round(epoch + (i + 1) / len(order), 3), ["state"])
                t0 += time.time() - spent  # a dev point counts in no training figure
            if ddp:
                dist.barrier()
        if stop_requested(step, run.log_every, ddp):  # Ctrl-C, or a kill: this step is kept, and resumes
            history["train_wall_s"] = wall0 + time.time() - t0
            if master_process:
                save(job.out, job.model, job.opt, job.params, job.meta | history, ["ckpt", "state"])
                job.log0(f"stopped at step {step} ({STOP[0]}): {job.out}/ckpt.safetensors holds this step's "
                         f"weights; --resume continues from {job.out}/state.safetensors")
            return False
    history["train_wall_s"] = wall0 + time.time() - t0
    return True


def dev_and_save(job, epoch, names):
    """Process 0's dev point at `epoch` (mid-epoch: a fraction) into the history and the log, then the saves `names`;
    at an epoch's end (ckpt among them) also best.safetensors, if dev is the best so far."""
    history, end = job.history, "ckpt" in names
    if len(job.kg.dev):  # a graph of one's own may lack dev.tsv
        dev, line = dev_metric(job.model.eval(), job.kg, job.enc, job.run, job.device, job.dtype, job.near)
        job.model.train()
        history["dev"].append({"epoch": epoch, "step": history["step"], **dev})
        better = end and (history["best"] is None or dev["value"] > history["best"])
        if better:
            history["best"], history["best_epoch"], names = dev["value"], epoch, ["best", *names]
        where = f"after epoch {epoch}" if end else f"at step {history['step']} (epoch {epoch})"
        job.log0(f"dev {where}: {line}" + (" (best so far)" if better else ""))
    save(job.out, job.model, job.opt, job.params, job.meta | history, names)


def learning_rate(step, peak, warm, total):
    """The lr of optimizer step `step` (0-based): a linear warm-up to `peak` over `warm` steps, then a linear decay
    to zero at `total` (BERT's schedule)."""
    if step < warm:
        return peak * (step + 1) / warm
    return peak * max(0.0, (total - step) / max(1, total - warm))


def train_step(forward, opt, params, batch, n_pos, lr, grad_clip, dtype, device):
    """One optimizer step on a batch of n_pos positives, then their negatives; returns the loss, on the device (an
    .item() here would make the CPU wait for the GPU every step)."""
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


if os.environ.get("PALT_TEST_CRASH_AT_STEP"):  # the tests' seam: the process dies unsaved during its Nth step
    def train_step(*args, _step=train_step, _calls=[], **kwargs):  # noqa: B006 (the calls so far)
        _calls.append(1)
        if len(_calls) == int(os.environ["PALT_TEST_CRASH_AT_STEP"]):
            os._exit(3)
        return _step(*args, **kwargs)


def stop_requested(step, every, ddp):
    """Whether to stop after this step: a signal arrived (STOP). Under DDP the ranks agree at logged steps only (one
    all-reduce there), so that every rank stops after the same step."""
    if not ddp:
        return bool(STOP)
    if step % every:
        return False
    flag = torch.tensor([float(bool(STOP))], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag)
    if flag.item() and not STOP:
        STOP.append("a signal to another rank")
    return bool(flag.item())


def open_log(out, print0):
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "log.txt", "a")

    def log0(line):
        print0(line)
        print(line, file=log, flush=True)
    return log0


def announce(run, kg, model, where, print0):
    report = param_report(model)
    print0(f"{kg.name}: {len(kg.train):,} train triples, {len(kg.entities):,} entities, text {kg.text_file} | "
           f"{Path(run.model).name}: tunable {report['tunable']:,} of {report['total']:,} ({report['percent']:.2f}%) "
           f"{report['parts']} | {where}")
    if run.data not in DATASETS:
        print0(f"settings for a graph of one's own (PRESETS['{run.recipe}']['own'], flags win): " + ", ".join(
            f"{k} {getattr(run, k)}" for k in PRESETS[run.recipe]["own"]))
    for note in kg.notes + [f"{kg.folder}: no dev.tsv, so no dev points and no best.safetensors; ckpt.safetensors "
                            "is the last epoch"] * (len(kg.dev) == 0):
        print0(note)


def resume(saved, path, model, opt, params):
    """The run's history: a fresh one, or its resume state's, whose tensors and AdamW moments go into model and opt."""
    history = {"epoch": 0, "step": 0, "dev": [], "best_epoch": None, "best": None, "train_wall_s": 0.0}
    if not saved:
        return history
    tensors, _ = read_checkpoint(path, kind="train-state")
    got = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    if set(got) != set(params):
        raise SystemExit(f"error: {path} holds other tensors than this model trains; choose another --out")
    model.load_state_dict(model.state_dict() | {k: v.to(params[k].device) for k, v in got.items()}, strict=True)
    for name, p in params.items():
        if f"step.{name}" in tensors:
            moments = {k: tensors[f"{k}.{name}"].to(p.device) for k in ("exp_avg", "exp_avg_sq")}
            # fused AdamW (on GPU) keeps its step count on the parameter's device, the others on the CPU
            step = tensors[f"step.{name}"].reshape(()).to(p.device if opt.defaults.get("fused") else "cpu")
            opt.state[p] = {"step": step, **moments}
    return {k: saved[k] for k in history}


def dev_metric(model, kg, enc, run, device, dtype, near=None):
    """(metric, its log line): accuracy at the threshold tuned on dev itself (an upper estimate), or the filtered MRR
    of the same seeded dev_limit dev triples every epoch, against all entities, a sample, or estimated (dev_near)."""
    scorer = evaluate.Scorer(model, enc, run.prompts, run.max_seq_length, device, dtype)
    if kg.task == "tc":
        acc = evaluate.best_threshold(scorer.numpy(kg.dev), kg.dev_labels)[1]
        return {"metric": "accuracy", "value": acc}, f"accuracy {acc:.4f}"
    m = evaluate.rank_split(scorer, kg, "dev", run.dev_limit, sample=run.dev_sample,
                            near=near[:, :run.dev_near] if run.dev_near else None)
    dev = {"metric": "mrr", "value": m["mrr"], "mr": m["mr"], "hits@10": m["hits@10"],
           "triples": min(run.dev_limit or len(kg.dev), len(kg.dev)), "candidates": m["candidates"],
           "sampled": bool(run.dev_sample and m["candidates"] < len(kg.split_entities)), "estimate": "estimate" in m}
    return dev, (f"mrr {m['mrr']:.4f}, MR {m['mr']:.2f}, Hits@10 {m['hits@10']:.4f} on {dev['triples']} dev triples "
                 + (f"(stratified estimate, {m['candidates']:,} candidates scored a query)" if dev["estimate"] else
                    f"against {m['candidates']:,} {'sampled ' * dev['sampled']}candidates"))


if __name__ == "__main__":
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: STOP.append(signal.Signals(signum).name))
    try:
        main(parse_args())
    except (DataError, CheckpointError, ConfigError) as e:
        raise SystemExit(f"error: {e}")
