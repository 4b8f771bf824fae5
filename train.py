"""Train PALT on a knowledge graph: one CPU, one GPU, or many with torchrun.

  python train.py --data umls --model minilm --epochs 3
  torchrun --nproc_per_node 8 train.py --data wn11 --model bert-base-cased
"""
import argparse, json, os, re, time
from dataclasses import asdict, dataclass
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import palt

from bert import DTYPES, CheckpointError, autocast
from data import DATASETS, TEXTS, DataError, NegativeSampler, build_batch, dataset, encode, load_kg, seq_lengths
from files import check_writable
from palt import (ConfigError, PaltConfig, build_palt, check_limits, check_seq_length, init_distributed, palt_meta,
                  param_report, read_checkpoint, save_atomic, save_checkpoint, trainable_state)

# Two recipes per dataset. paper: the paper's appendix (BERT-base, GPU; umls is not in it: our choice). cpu: ours
# for MiniLM on a few CPU cores, measured in RESULTS.md. batch = positives per optimizer step over all ranks, each
# with its negatives; negatives = corruptions of (head, relation, tail) per positive. dev_limit: dev triples
# ranked after every epoch; dev_sample: against a seeded sample of that many entities (plus their own answers),
# not all ~15k-41k of a big graph (a rough signal, labelled so); dev_every: a dev point and a resume state.
CPU = dict(lr=1e-3, batch=32, prompts=(2, 0, 0), negatives=(1, 1, 1))
BIG_CPU = CPU | dict(epochs=1, negatives=(1, 0, 1), dev_limit=50, dev_sample=100, dev_every=500)
PRESETS = {
    "paper": {
        "wn11": dict(lr=1.5e-4, epochs=40, negatives=(1, 1, 1), prompts=(2, 0, 0), batch=32),
        "fb13": dict(lr=1.5e-5, epochs=40, negatives=(1, 1, 1), prompts=(10, 10, 10), batch=32),
        "fb15k-237": dict(lr=1e-4, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8, dev_limit=2),
        "wn18rr": dict(lr=1e-5, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8, dev_limit=2),
        "umls": dict(lr=1e-4, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8, dev_limit=100),
    },
    "cpu": {"wn11": CPU | dict(epochs=3), "fb13": CPU | dict(epochs=1), "umls": CPU | dict(epochs=8, dev_limit=100),
            "fb15k-237": BIG_CPU, "wn18rr": BIG_CPU},
}
# a graph of one's own (--data FOLDER): umls's settings, dev ranked against at most 1,000 sampled entities
PRESETS["paper"]["own"] = PRESETS["paper"]["umls"] | dict(dev_sample=1000)
PRESETS["cpu"]["own"] = PRESETS["cpu"]["umls"] | dict(epochs=5, dev_sample=1000)


@dataclass
class Run:
    data: str
    recipe: str = "paper"  # PRESETS[recipe][data] fills every setting the command line leaves open
    model: str = "minilm"
    data_dir: str | None = None
    text: str = "name"  # entity texts: names, or long descriptions where the dataset has them
    out: str | None = None  # default runs/<data>-<model>
    epochs: int | None = None
    max_steps: int | None = None  # stop (and schedule the learning rate) as if training ended after this many steps
    lr: float | None = None
    head_lr: float | None = None  # the heads the checkpoint lacked (MiniLM's pooler and NSP head); None: lr
    batch: int | None = None
    negatives: tuple | None = None
    prompts: tuple | None = None
    calib: tuple | None = None  # None: middle and last layer; () none
    no_wp: bool = False
    prompt_mlp: bool = False
    finetune: bool = False
    dtype: str = "auto"  # autocast precision: auto = bf16 on GPU and on CPUs with native bf16, else fp32
    max_seq_length: int = 192  # every position the model sees, prompts included
    dev_limit: int | None = None  # link prediction: dev triples ranked after each epoch (a seeded sample)
    dev_sample: int | None = None  # ... against a seeded sample of this many entities, not all
    dev_every: int | None = None  # also every this many steps: a dev point and a resume state inside long epochs
    warmup: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 42
    log_every: int = 20
    resume: bool = False


def int_list(s, n=()):
    """'2,0,0' -> (2, 0, 0): n (a tuple of allowed counts) non-negative integers (--prompts, --negatives), or any
    number of them and 'none' -> () (--calib layers)."""
    try:
        t = () if s == "none" and not n else tuple(int(x) for x in s.split(","))
    except ValueError:
        t = (-1,)
    if (n and len(t) not in n) or min(t, default=0) < 0:
        what = f"{' or '.join(map(str, n))} non-negative integers like 2,0,0" if n else "layer numbers like 6,11, or none"
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return t


# flag -> (lowest allowed, whether the lowest itself is allowed); checked before anything loads
LIMITS = {"epochs": (1, True), "max_steps": (1, True), "lr": (0, False), "head_lr": (0, False), "batch": (1, True), "dev_limit": (1, True),
          "dev_sample": (1, True), "dev_every": (1, True), "max_seq_length": (4, True), "warmup": (0, True), "weight_decay": (0, True),
          "grad_clip": (0, False), "seed": (0, True), "log_every": (1, True)}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # '-1,0,0' and '-1e-3' are values (refused below with their own message), not unknown options
    ap._negative_number_matcher = re.compile(r"^-\.?\d")
    ap.add_argument("--data", required=True, help=f"{', '.join(DATASETS)}, or the folder of a graph of one's own "
                    "(train.tsv, optional dev.tsv, test.tsv, entity2text.txt, relation2text.txt)")
    ap.add_argument("--recipe", choices=list(PRESETS), default="paper",
                    help="settings not given: the paper's (BERT-base, GPU) or ours for MiniLM on CPU (see PRESETS)")
    ap.add_argument("--model", default="minilm", help="minilm, bert-base-cased, ..., or a directory")
    ap.add_argument("--data-dir", help="folder holding the datasets (else $PALT_DATA, else data/)")
    ap.add_argument("--text", choices=TEXTS, default="name", help="entity text: names, long descriptions "
                    "(umls, fb13: entity2textlong.txt), description (fb15k-237: 'Name -- first sentence')")
    ap.add_argument("--out", help="checkpoint and log folder (default runs/<data>-<model>)")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--max-steps", type=int, help="stop after this many optimizer steps (the schedule ends there)")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--head-lr", type=float, help="peak lr of the heads the model lacked, trained from scratch "
                    "(MiniLM's pooler and NSP head; default --lr)")
    ap.add_argument("--batch", type=int, help="positive triples per step over all ranks")
    ap.add_argument("--negatives", type=lambda s: int_list(s, (3, 4)),
                    help="head,relation,tail[,self] corruptions per positive, e.g. 5,0,5 or 1,0,1,2 (self: (h,r,h), (t,r,t))")
    ap.add_argument("--prompts", type=lambda s: int_list(s, (3,)), help="b,m,e prompt tokens, e.g. 2,0,0")
    ap.add_argument("--calib", type=int_list, help="layers, e.g. 6,11, or none")
    ap.add_argument("--no-wp", action="store_true", help="ablation: no prompt encoder W_p")
    ap.add_argument("--prompt-mlp", action="store_true", help="re-parametrise prompts through an MLP")
    ap.add_argument("--finetune", action="store_true", help="train the whole LM, no PALT parts (KG-BERT)")
    ap.add_argument("--dtype", choices=DTYPES, default="auto",
                    help="autocast precision: auto = bf16 on GPU and on CPUs with native bf16 (AVX512_BF16/AMX), else fp32")
    ap.add_argument("--dev-limit", type=int, help="link prediction: dev triples ranked after every epoch (default: PRESETS)")
    ap.add_argument("--dev-sample", type=int, help="link prediction: rank dev against a seeded sample of N entities "
                    "(plus the answers), not all (default: PRESETS)")
    ap.add_argument("--dev-every", type=int, help="also evaluate dev and save the resume state every this many steps "
                    "(checkpoints and the best epoch stay per epoch)")
    for f in ("max_seq_length", "warmup", "weight_decay", "grad_clip", "seed", "log_every"):
        ap.add_argument("--" + f.replace("_", "-"), type=type(Run.__dataclass_fields__[f].default),
                        default=Run.__dataclass_fields__[f].default)
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its last epoch")
    run = Run(**vars(ap.parse_args(argv)))
    try:
        name = dataset(run.data, run.data_dir)[0]  # a benchmark's name, or a folder with train.tsv
    except DataError as e:
        ap.error(str(e))
    run.data = name if run.data.lower() in DATASETS else run.data
    for k, v in PRESETS[run.recipe][run.data if run.data in DATASETS else "own"].items():  # the preset fills what the command line left open
        if getattr(run, k) is None:
            setattr(run, k, v)
    check_limits(ap, run, LIMITS)
    if run.warmup > 1:
        ap.error(f"--warmup is a fraction of the steps, at most 1, not {run.warmup}")
    if sum(run.negatives) == 0:
        ap.error("--negatives 0,0,0 leaves no false triples to learn from: give at least one corruption per positive")
    if run.negatives[3:] > (2,):
        ap.error(f"--negatives: at most 2 self-negatives, (h, r, h) and (t, r, t), not {run.negatives[3]}")
    if run.finetune:  # the paper's Finetuning row: the whole LM, none of PALT's parts
        run.prompts, run.calib, run.no_wp = (0, 0, 0), (), True
    check_seq_length(run.max_seq_length, sum(run.prompts))
    run.out = run.out or f"runs/{name}-{Path(run.model).name}"
    return run


def lr_at(step, total, run):
    """Linear warm-up over the first `warmup` fraction of steps, then linear decay to zero."""
    warm = max(1, int(run.warmup * total))
    return run.lr * (step + 1) / warm if step < warm else run.lr * max(0.0, (total - step) / max(1, total - warm))


def epoch_order(keys, per_step, epoch, seed, pool_steps=100):
    """(steps, per_step) train-positive indices for one epoch: a seeded permutation cut to whole steps, sorted by
    `keys` (a positive's longest sequence among itself and its negatives) inside pools of `pool_steps` steps,
    then the steps shuffled. Steps of similar lengths pad little; every rank computes the same order, and an
    epoch replays exactly after --resume. pool_steps=0: a plain shuffle."""
    rng = np.random.default_rng([seed, epoch, 1])  # (seed, epoch) alone seeds the negatives
    n_steps = len(keys) // per_step
    perm = rng.permutation(len(keys))[:n_steps * per_step]
    if not pool_steps:
        return perm.reshape(n_steps, per_step)
    pool = np.arange(len(perm)) // (pool_steps * per_step)
    perm = perm[np.lexsort((keys[perm], pool))]  # by pool, then by length inside the pool
    return perm.reshape(n_steps, per_step)[rng.permutation(n_steps)]


# settings that may change when a run resumes: where it writes and what it reports, not what it trains
RESUME_MAY_CHANGE = ("model", "data_dir", "out", "resume", "log_every", "dev_limit", "dev_sample", "dev_every", "recipe")


def check_output(out, resume):
    """Before anything loads: --out must be writable, and a run never overwrites a checkpoint it does not resume.
    Returns the resume state's metadata, or None for a fresh start."""
    state = out / "state.safetensors"
    check_writable(out, f"--out {out}")
    trained = [f.name for f in (out / "ckpt.safetensors", out / "best.safetensors", state) if f.exists()]
    if not resume:
        if trained:
            raise SystemExit(f"error: {out}/{trained[0]} exists: --resume to continue it, or choose another --out")
        return None
    if not state.exists():
        if trained:  # a checkpoint without its optimizer state cannot continue exactly: never guess, never overwrite
            raise SystemExit(f"error: {out}/{trained[0]} exists but {state} does not, so the run cannot continue "
                             f"exactly; nothing was changed: choose another --out")
        return None
    return read_checkpoint(state, kind="train-state", tensors=False)[1]


def check_resumable(saved, meta, state):
    """The resume state's own record of its run against this one: an exact replay needs the same settings, base
    weights, data files and resolved precision."""
    old, new = json.loads(saved["run"]), json.loads(meta["run"])
    mine = {k: (old.get(k), new[k]) for k in new if k not in RESUME_MAY_CHANGE}
    mine |= {k: (saved.get(k), meta[k]) for k in ("weights_sha256", "data_fingerprint", "dtype")}
    for k, (was, now) in mine.items():
        if was != now:
            raise SystemExit(f"error: {state} was trained with {k} {was}, not {now}: resume with the same settings, "
                             f"or choose another --out")


def save(out, model, opt, params, meta, names):
    """Writes out/NAME.safetensors for NAME in names: best (dev improved), ckpt (the epoch's end), state (to resume;
    always last, so that a kill in between replays from the previous state). A failed write keeps the previous
    file and says how to continue."""
    for name in names:
        try:
            if name == "state":
                save_atomic(out / "state.safetensors", state_tensors(model, opt, params), meta | {"kind": "train-state"})
            else:
                save_checkpoint(out / f"{name}.safetensors", model, meta)
        except OSError as e:
            raise SystemExit(f"error: cannot write {out / name}.safetensors ({e.strerror}); the previous file is kept: "
                             f"fix that and run again with --resume to continue from the last saved state")


def train_step(ddp_model, opt, params, batch, labels, lr, run, dtype, device):
    """One optimizer step: NSP cross-entropy over a batch of positives and their negatives, clipping, AdamW."""
    with autocast(dtype, device):
        logits = ddp_model(**batch)
    loss = F.cross_entropy(logits.float(), labels)  # class 0 = true triple, as BERT's "is next"
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params.values(), run.grad_clip)
    for g in opt.param_groups:
        g["lr"] = lr * g["lr_scale"]
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def build(run, dtype, device):
    """The PALT model (fresh heads seeded alike on every rank), the graph, its token ids, the checkpoint metadata,
    the trainable parameters and their AdamW."""
    kg = load_kg(run.data, run.data_dir, run.text)  # before the model: a data error costs seconds
    torch.manual_seed(run.seed)
    cfg = PaltConfig(prompts=run.prompts, calib_layers=run.calib, prompt_encoder=not run.no_wp,
                     prompt_mlp=run.prompt_mlp, finetune=run.finetune)
    model, loaded = build_palt(run.model, cfg)
    check_seq_length(run.max_seq_length, sum(run.prompts), loaded.config.max_position_embeddings, loaded.path.name)
    if not any(p.requires_grad for p in model.parameters()):
        raise SystemExit("error: nothing to train (zero-shot needs no training: use evaluate.py --model)")
    report = param_report(model)
    meta = {"model": run.model, "weights_sha256": loaded.weights_sha256, "data": run.data, "data_fingerprint": kg.fingerprint,
            "text": run.text, "text_file": kg.text_file, "prompts": list(run.prompts), "max_seq_length": run.max_seq_length,
            "dtype": dtype, "palt": palt_meta(model), "run": json.dumps(asdict(run)), "tunable": report["tunable"],
            "total": report["total"]}
    model.to(device)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    groups = {}  # (weight decay: not on biases and LayerNorm, a new head: its own lr) -> parameters
    for n, p in params.items():
        groups.setdefault((p.ndim >= 2, n.split(".")[:2] in [["bert", h] for h in model.new_heads]), []).append(p)
    opt = torch.optim.AdamW([{"params": ps, "weight_decay": run.weight_decay if decay else 0.0,
                              "lr_scale": (run.head_lr or run.lr) / run.lr if new else 1.0}
                             for (decay, new), ps in groups.items()],
                            lr=run.lr, betas=(0.9, 0.999), eps=1e-8, fused=device.type == "cuda")
    return model, kg, encode(kg, loaded.tokenizer), meta, params, opt


def main(run):
    rank, local_rank, world, device, dtype = init_distributed(run.dtype)  # env ranks, set_device: torchrun's DDP
    ddp, master_process = world > 1 or dist.is_initialized(), rank == 0
    print0 = lambda *a, **k: print(*a, **k, flush=True) if master_process else None
    if run.batch % world:
        raise SystemExit(f"error: --batch {run.batch} is not divisible by the {world} ranks")
    out = Path(run.out)
    resumed = check_output(out, run.resume)  # before anything loads: nothing is lost, no work thrown away

    model, kg, enc, meta, params, opt = build(run, dtype, device)
    report, negatives = param_report(model), NegativeSampler(kg, *run.negatives, seed=run.seed)
    steps_per_epoch = len(kg.train) // run.batch
    if steps_per_epoch == 0:
        raise SystemExit(f"error: --batch {run.batch} is larger than the {len(kg.train)} train triples")
    total = min(run.epochs * steps_per_epoch, run.max_steps or run.epochs * steps_per_epoch)
    print0(f"{kg.name}: {len(kg.train):,} train triples, {len(kg.entities):,} entities, text {kg.text_file} | "
           f"{Path(run.model).name}: tunable {report['tunable']:,} of {report['total']:,} ({report['percent']:.2f}%) "
           f"{report['parts']} | {dtype} on {device} x {world}")
    if run.data not in DATASETS:  # a graph of one's own: what it lacks, and the settings it gets, said once
        print0(f"settings for a graph of one's own (PRESETS['{run.recipe}']['own'], flags win): " + ", ".join(
            f"{k} {getattr(run, k)}" for k in PRESETS[run.recipe]["own"]))
    for note in kg.notes + [f"{kg.folder}: no dev.tsv, so no dev points, so no best.safetensors; ckpt.safetensors is the last epoch"
                            ] * (len(kg.dev) == 0):
        print0(note)
    ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None) if ddp else model

    history = {"epoch": 0, "step": 0, "dev": [], "best_epoch": None, "best": None, "train_wall_s": 0.0}
    if resumed:
        check_resumable(resumed, meta, out / "state.safetensors")
        tensors, _ = read_checkpoint(out / "state.safetensors", kind="train-state")
        load_state(tensors, model, opt, params, out / "state.safetensors")
        history = {k: resumed[k] for k in history}
        start = f"resumed from {out}/state.safetensors: epoch {history['epoch']}, step {history['step']}"
    else:
        start = f"--resume: no checkpoint in {out} yet, starting from scratch" if run.resume else None
    if master_process:
        out.mkdir(parents=True, exist_ok=True)
    log = open(out / "log.txt", "a") if master_process else None

    def log0(line):
        print0(line)
        if log:
            log.write(line + "\n")
            log.flush()

    if start:  # in the log too: a resumed run's log shows where it was stopped and continued
        log0(start)

    def dev_point(epoch, step):  # rank 0 only; its time counts in no training figure
        if not len(kg.dev):  # a graph of one's own without dev.tsv
            return None, 0.0
        t = time.time()
        history["dev"].append({"epoch": epoch, "step": step, **dev_metric(model.eval(), kg, enc, run, device, dtype)})
        ddp_model.train()
        return history["dev"][-1], time.time() - t

    # ---------------------------------------------------------------------------------------------- training
    seqs_per_pos = 1 + sum(run.negatives)
    step = history["step"]
    for epoch in range(history["epoch"], run.epochs):
        if step >= total:
            break
        ddp_model.train()
        neg = negatives.negatives(epoch)  # (N, n_neg, 3), the same on every rank
        group = np.concatenate([kg.train[:, None], neg], 1).reshape(-1, 3)  # each positive, then its negatives
        keys = seq_lengths(enc, group, run.prompts, run.max_seq_length).reshape(len(neg), -1).max(1)
        # rank r takes every world-th positive of each global step (DistributedSampler's split): similar lengths
        order = epoch_order(keys, run.batch, epoch, run.seed)[:, rank::world]
        t0, seen, loss_sum, n_steps, n_real, n_padded = time.time(), 0, 0.0, 0, 0, 0
        for i, idx in enumerate(order):
            if epoch * steps_per_epoch + i < step:  # done before a mid-epoch resume
                continue
            if step >= total:
                break
            torch.manual_seed(run.seed + 1_000_003 * step + rank)  # dropout: any step replays exactly after --resume
            triples = np.concatenate([kg.train[idx], neg[idx].reshape(-1, 3)])
            labels = torch.cat([torch.zeros(len(idx)), torch.ones(len(idx) * (seqs_per_pos - 1))]).long().to(device)
            batch = {k: v.to(device, non_blocking=True) for k, v in build_batch(enc, triples, run.prompts, run.max_seq_length).items()}
            lr = lr_at(step, total, run)
            loss = train_step(ddp_model, opt, params, batch, labels, lr, run, dtype, device)
            step, seen, loss_sum, n_steps = step + 1, seen + len(triples) * world, loss_sum + loss, n_steps + 1
            n_real, n_padded = n_real + int(batch["attention_mask"].sum()), n_padded + batch["input_ids"].numel()
            if step % run.log_every == 0 or i == len(order) - 1 or step == total:
                rate = seen / (time.time() - t0)
                eta = (total - step) * run.batch * seqs_per_pos / rate
                log0(f"epoch {epoch + 1}/{run.epochs} step {step}/{total} loss {loss_sum / n_steps:.4f} "
                     f"lr {lr:.2e} seq/s {rate:.0f} padded/real {n_padded / n_real:.2f} "
                     f"{dtype} eta {eta / 60:.1f}m")
            if run.dev_every and step % run.dev_every == 0 and i < len(order) - 1 and step < total:
                if master_process:  # a point of the curve, and a state to resume from; the epoch's end decides the checkpoints
                    dev, spent = dev_point(round(epoch + (i + 1) / len(order), 3), step)
                    if dev:
                        log0(f"dev at step {step} (epoch {dev['epoch']}): {dev_line(dev)}")
                    t0 += spent
                    save(out, model, opt, params, meta | history | {"epoch": epoch, "step": step, "train_wall_s":
                                                                    history["train_wall_s"] + time.time() - t0}, ["state"])
                if ddp:
                    dist.barrier()
            if os.environ.get("PALT_TEST_CRASH_AT_STEP") == str(step):  # tests: a crash mid-epoch, for --resume
                os._exit(3)
        history["train_wall_s"] += time.time() - t0
        history["epoch"], history["step"] = epoch + 1, step
        if master_process:  # dev after every epoch; then best (if better), last checkpoint, and the resume state
            dev, _ = dev_point(epoch + 1, step)
            better = dev is not None and (history["best"] is None or dev["value"] > history["best"])
            if better:
                history["best"], history["best_epoch"] = dev["value"], epoch + 1
            if dev:
                log0(f"dev after epoch {epoch + 1}: {dev_line(dev)}" + (" (best so far)" if better else ""))
            save(out, model, opt, params, meta | history, ["best"] * better + ["ckpt", "state"])
        if ddp:
            dist.barrier()  # the other ranks wait for rank 0's dev evaluation and saves
    if master_process:
        print0(f"trained {step} steps in {history['train_wall_s'] / 60:.1f} min ({dtype}); last {out}/ckpt.safetensors "
               f"({(out / 'ckpt.safetensors').stat().st_size / 2**20:.1f} MiB)" + (f", best by dev {out}/best.safetensors "
               f"(epoch {history['best_epoch']})" if history["best_epoch"] else ""))
    if ddp:
        del ddp_model  # DDP's reducer holds gloo work; freed at interpreter exit it can abort the process (SIGABRT)
        dist.barrier()
        dist.destroy_process_group()
    return model


def state_tensors(model, opt, params):
    """The resume unit, one file: the trainable tensors and their AdamW moments."""
    names = {p: n for n, p in params.items()}
    return {**{f"model.{n}": t.cpu() for n, t in trainable_state(model).items()},
            **{f"{k}.{names[p]}": v.detach().cpu().reshape(-1) if k == "step" else v.detach().cpu()
               for p, st in opt.state.items() for k, v in st.items()}}


def load_state(tensors, model, opt, params, path):
    got = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    if set(got) != set(params):
        raise SystemExit(f"error: {path} holds other tensors than this model trains; choose another --out")
    model.load_state_dict(model.state_dict() | {k: v.to(p.device) for k, v, p in ((k, got[k], params[k]) for k in got)},
                          strict=True)
    for name, p in params.items():
        if f"step.{name}" in tensors:
            opt.state[p] = {"step": tensors[f"step.{name}"].reshape(()), "exp_avg": tensors[f"exp_avg.{name}"].to(p.device),
                            "exp_avg_sq": tensors[f"exp_avg_sq.{name}"].to(p.device)}


def dev_metric(model, kg, enc, run, device, dtype):
    """The task's dev metric: accuracy at the dev-tuned threshold (tuned on dev itself: an upper estimate), or the
    filtered MRR of a seeded sample of dev_limit dev triples (the same sample every epoch), ranked against all
    entities or a seeded sample of dev_sample of them (labelled `sampled`)."""
    import evaluate
    scorer = evaluate.Scorer(model, enc, run.prompts, run.max_seq_length, device, dtype)
    if kg.task == "tc":
        return {"metric": "accuracy", "value": evaluate.best_threshold(scorer(kg.dev).cpu().numpy(), kg.dev_labels)[1]}
    m = evaluate.rank_split(scorer, kg, "dev", run.dev_limit, sample=run.dev_sample)
    return {"metric": "mrr", "value": m["mrr"], "mr": m["mr"], "hits@10": m["hits@10"],
            "triples": min(run.dev_limit or len(kg.dev), len(kg.dev)), "candidates": m["candidates"],
            "sampled": bool(run.dev_sample and m["candidates"] < len(kg.split_entities))}


def dev_line(dev):
    """'mrr 0.8037, MR 2.08, Hits@10 0.9750 on 100 dev triples against 135 candidates' (sampled ones said so)."""
    return f"{dev['metric']} {dev['value']:.4f}" + (
        f", MR {dev['mr']:.2f}, Hits@10 {dev['hits@10']:.4f} on {dev['triples']} dev triples against "
        f"{dev['candidates']:,} {'sampled ' * dev['sampled']}candidates" if "mr" in dev else "")


if __name__ == "__main__":
    try:
        main(parse_args())
    except (DataError, CheckpointError, ConfigError) as e:
        raise SystemExit(f"error: {e}")
