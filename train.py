"""Train PALT on a knowledge graph: one CPU, one GPU, or many with torchrun.

  python train.py --data umls --model minilm --epochs 3
  torchrun --nproc_per_node 8 train.py --data wn11 --model bert-base-cased
"""
import argparse, json, math, os, re, time
from dataclasses import asdict, dataclass
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bert import DTYPES, CheckpointError, autocast, resolve_dtype
from data import DataError, NegativeSampler, build_batch, encode, load_kg, seq_lengths
from palt import (ConfigError, PaltConfig, build_palt, check_writable, palt_meta, param_report, read_checkpoint, save_atomic,
                  trainable_state)

# The paper's appendix (BERT-base). batch = positives per optimizer step over all ranks, each with its negatives.
# negatives = corruptions of (head, relation, tail) per positive. umls is not in the appendix: our choice.
# dev_limit: dev triples ranked after every epoch, under a minute for MiniLM on one CPU core (umls: 135
# candidates per query; the others rank ~15k-41k, so only a few triples fit: a rough signal, say so).
PRESETS = {
    "wn11": dict(lr=1.5e-4, epochs=40, negatives=(1, 1, 1), prompts=(2, 0, 0), batch=32),
    "fb13": dict(lr=1.5e-5, epochs=40, negatives=(1, 1, 1), prompts=(10, 10, 10), batch=32),
    "fb15k-237": dict(lr=1e-4, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8, dev_limit=2),
    "wn18rr": dict(lr=1e-5, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8, dev_limit=2),
    "umls": dict(lr=1e-4, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8, dev_limit=100),
}


@dataclass
class Run:
    data: str
    model: str = "minilm"
    data_dir: str | None = None
    text: str = "name"  # entity texts: names, or long descriptions where the dataset has them
    out: str | None = None  # default runs/<data>-<model>
    epochs: int | None = None
    max_steps: int | None = None  # stop (and schedule the learning rate) as if training ended after this many steps
    lr: float | None = None
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
    dev_every: int | None = None  # also evaluate dev every this many steps: a curve inside long epochs
    warmup: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 42
    log_every: int = 20
    resume: bool = False


def counts(s):
    """'2,0,0' -> (2, 0, 0): three non-negative integers."""
    try:
        t = tuple(int(x) for x in s.split(","))
    except ValueError:
        t = ()
    if len(t) != 3 or min(t) < 0:
        raise argparse.ArgumentTypeError(f"expected three non-negative integers like 2,0,0, got {s!r}")
    return t


def layers(s):
    """'6,11' -> (6, 11); 'none' -> ()."""
    if s == "none":
        return ()
    try:
        t = tuple(int(x) for x in s.split(","))
    except ValueError:
        t = (-1,)
    if min(t) < 0:
        raise argparse.ArgumentTypeError(f"expected layer numbers like 6,11, or none, got {s!r}")
    return t


# flag -> (lowest allowed, whether the lowest itself is allowed); checked before anything loads
LIMITS = {"epochs": (1, True), "max_steps": (1, True), "lr": (0, False), "batch": (1, True), "dev_limit": (1, True),
          "dev_every": (1, True), "max_seq_length": (4, True), "warmup": (0, True), "weight_decay": (0, True), "grad_clip": (0, False),
          "seed": (0, True), "log_every": (1, True)}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # '-1,0,0' and '-1e-3' are values (refused below with their own message), not unknown options
    ap._negative_number_matcher = re.compile(r"^-\.?\d")
    ap.add_argument("--data", required=True, choices=list(PRESETS), type=str.lower)
    ap.add_argument("--model", default="minilm", help="minilm, bert-base-cased, ..., or a directory")
    ap.add_argument("--data-dir", help="folder holding the datasets (else $PALT_DATA, else data/)")
    ap.add_argument("--text", choices=["name", "long"], default="name")
    ap.add_argument("--out", help="checkpoint and log folder (default runs/<data>-<model>)")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--max-steps", type=int, help="stop after this many optimizer steps (the schedule ends there)")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--batch", type=int, help="positive triples per step over all ranks")
    ap.add_argument("--negatives", type=counts, help="head,relation,tail corruptions per positive, e.g. 5,0,5")
    ap.add_argument("--prompts", type=counts, help="b,m,e prompt tokens, e.g. 2,0,0")
    ap.add_argument("--calib", type=layers, help="layers, e.g. 6,11, or none")
    ap.add_argument("--no-wp", action="store_true", help="ablation: no prompt encoder W_p")
    ap.add_argument("--prompt-mlp", action="store_true", help="re-parametrise prompts through an MLP")
    ap.add_argument("--finetune", action="store_true", help="train the whole LM, no PALT parts (KG-BERT)")
    ap.add_argument("--dtype", choices=DTYPES, default="auto",
                    help="autocast precision: auto = bf16 on GPU and on CPUs with native bf16 (AVX512_BF16/AMX), else fp32")
    ap.add_argument("--dev-limit", type=int, help="link prediction: dev triples ranked after every epoch (default: PRESETS)")
    ap.add_argument("--dev-every", type=int, help="also evaluate dev every this many steps (a curve only: "
                    "checkpoints and the best epoch stay per epoch)")
    for f in ("max_seq_length", "warmup", "weight_decay", "grad_clip", "seed", "log_every"):
        ap.add_argument("--" + f.replace("_", "-"), type=type(Run.__dataclass_fields__[f].default),
                        default=Run.__dataclass_fields__[f].default)
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its last epoch")
    run = Run(**vars(ap.parse_args(argv)))
    for k, v in PRESETS[run.data].items():  # the preset fills what the command line left open
        if getattr(run, k) is None:
            setattr(run, k, v)
    for k, (low, inclusive) in LIMITS.items():
        v = getattr(run, k)
        if v is not None and not ((v >= low if inclusive else v > low) and math.isfinite(v)):
            ap.error(f"--{k.replace('_', '-')} must be {'at least' if inclusive else 'more than'} {low}"
                     f"{'' if math.isfinite(v) else ' and finite'}, not {v}")
    if run.warmup > 1:
        ap.error(f"--warmup is a fraction of the steps, at most 1, not {run.warmup}")
    if sum(run.negatives) == 0:
        ap.error("--negatives 0,0,0 leaves no false triples to learn from: give at least one corruption per positive")
    if run.finetune:  # the paper's Finetuning row: the whole LM, none of PALT's parts
        run.prompts, run.calib, run.no_wp = (0, 0, 0), (), True
    if run.max_seq_length < 4 + sum(run.prompts):
        ap.error(f"--max-seq-length {run.max_seq_length} leaves no room for text: the {sum(run.prompts)} prompt tokens, "
                 f"[CLS] and two [SEP] take {3 + sum(run.prompts)}")
    run.out = run.out or f"runs/{run.data}-{Path(run.model).name}"
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


# what a resumed run must share with the run it continues, or it would not replay exactly
RUN_KEYS = ("negatives", "batch", "lr", "epochs", "max_steps", "warmup", "weight_decay", "grad_clip", "seed")
TRAINED_KEYS = ("data", "weights_sha256", "data_fingerprint", "text_file", "prompts", "max_seq_length", "dtype", "palt", *RUN_KEYS)


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


def save_or_exit(path, tensors, meta, epochs_saved):
    try:
        save_atomic(path, tensors, meta)
    except OSError as e:
        raise SystemExit(f"error: cannot write {path} ({e.strerror}); the previous file is kept: fix that and run "
                         f"again with --resume to continue after epoch {epochs_saved}")


def main(run):
    # ---------------------------------------------------------------------------------------------- DDP setup
    ddp = int(os.environ.get("RANK", -1)) != -1
    cuda = torch.cuda.is_available()
    if ddp:
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        rank, local_rank, world = 0, 0, 1
    device = f"cuda:{local_rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    master_process = rank == 0
    print0 = lambda *a, **k: print(*a, **k, flush=True) if master_process else None
    dtype = resolve_dtype(run.dtype, device)  # weights, optimizer, loss and the NSP head stay fp32 (autocast only)
    if run.batch % world:
        raise SystemExit(f"error: --batch {run.batch} is not divisible by the {world} ranks")
    out = Path(run.out)
    resumed = check_output(out, run.resume)  # before anything loads: nothing is lost, no work thrown away

    # ----------------------------------------------------------------------------------------- data and model
    torch.manual_seed(run.seed)  # the same fresh heads on every rank
    cfg = PaltConfig(prompts=run.prompts, calib_layers=run.calib, prompt_encoder=not run.no_wp,
                     prompt_mlp=run.prompt_mlp, finetune=run.finetune)
    model, loaded = build_palt(run.model, cfg)
    if run.max_seq_length > loaded.config.max_position_embeddings:
        raise SystemExit(f"error: --max-seq-length {run.max_seq_length} (prompts included) exceeds the "
                         f"{loaded.config.max_position_embeddings} positions of {loaded.path.name}")
    kg = load_kg(run.data, run.data_dir, run.text)
    enc = encode(kg, loaded.tokenizer)
    negatives = NegativeSampler(kg, *run.negatives, seed=run.seed)
    report = param_report(model)
    if report["tunable"] == 0:
        raise SystemExit("error: nothing to train (zero-shot needs no training: use evaluate.py --model)")
    steps_per_epoch = len(kg.train) // run.batch
    if steps_per_epoch == 0:
        raise SystemExit(f"error: --batch {run.batch} is larger than the {len(kg.train)} train triples")
    total = min(run.epochs * steps_per_epoch, run.max_steps or run.epochs * steps_per_epoch)
    print0(f"{kg.name}: {len(kg.train):,} train triples, {len(kg.entities):,} entities, text {kg.text_file} | "
           f"{loaded.path.name}: tunable {report['tunable']:,} of {report['total']:,} ({report['percent']:.2f}%) "
           f"{report['parts']} | {dtype} on {device} x {world}")
    model.to(device)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay = [p for p in params.values() if p.ndim >= 2]  # no weight decay on biases and LayerNorm
    no_decay = [p for p in params.values() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": run.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=run.lr, betas=(0.9, 0.999), eps=1e-8, fused=cuda)
    ddp_model = DDP(model, device_ids=[local_rank] if cuda else None) if ddp else model

    meta = {"model": run.model, "weights_sha256": loaded.weights_sha256, "data": kg.name, "data_fingerprint": kg.fingerprint,
            "text": run.text, "text_file": kg.text_file, "prompts": list(run.prompts), "max_seq_length": run.max_seq_length,
            "dtype": dtype, "palt": palt_meta(model), "run": json.dumps(asdict(run)), "tunable": report["tunable"],
            "total": report["total"], **{k: getattr(run, k) for k in RUN_KEYS}}
    history = {"epoch": 0, "step": 0, "dev": [], "best_epoch": None, "best": None, "train_wall_s": 0.0}
    if resumed:
        for k in TRAINED_KEYS:  # the same run, or an exact replay is impossible
            if resumed.get(k) != json.loads(json.dumps(meta[k])):
                raise SystemExit(f"error: {out}/state.safetensors was trained with {k} {resumed.get(k)}, not {meta[k]}: "
                                 f"resume with the same settings, or choose another --out")
        tensors, _ = read_checkpoint(out / "state.safetensors", kind="train-state")
        load_state(tensors, model, opt, params, out / "state.safetensors")
        history = {k: resumed[k] for k in history}
        print0(f"resumed from {out}/state.safetensors: epoch {history['epoch']}, step {history['step']}")
    elif run.resume:
        print0(f"--resume: no checkpoint in {out} yet, starting from scratch")
    if master_process:
        out.mkdir(parents=True, exist_ok=True)
    log = open(out / "log.txt", "a") if master_process else None

    def log0(line):
        print0(line)
        if log:
            log.write(line + "\n")
            log.flush()

    # ---------------------------------------------------------------------------------------------- training
    seqs_per_pos = 1 + sum(run.negatives)
    step = history["step"]
    for epoch in range(history["epoch"], run.epochs):
        if step >= total:
            break
        ddp_model.train()
        torch.manual_seed(run.seed + 1000 * epoch + rank)  # dropout: an epoch replays exactly after --resume
        neg = negatives.negatives(epoch)  # (N, n_neg, 3), the same on every rank
        group = np.concatenate([kg.train[:, None], neg], 1).reshape(-1, 3)  # each positive, then its negatives
        keys = seq_lengths(enc, group, run.prompts, run.max_seq_length).reshape(len(neg), -1).max(1)
        # every rank takes every world-th positive of each global step (DistributedSampler's split), so the ranks'
        # batches of a step have similar lengths too
        order = epoch_order(keys, run.batch, epoch, run.seed)[:, rank::world]
        t0, seen, loss_sum, n_real, n_padded = time.time(), 0, 0.0, 0, 0
        for i, idx in enumerate(order):
            if step >= total:
                break
            triples = np.concatenate([kg.train[idx], neg[idx].reshape(-1, 3)])
            labels = torch.cat([torch.zeros(len(idx)), torch.ones(len(idx) * (seqs_per_pos - 1))]).long().to(device)
            batch = {k: v.to(device, non_blocking=True) for k, v in build_batch(enc, triples, run.prompts, run.max_seq_length).items()}
            with autocast(dtype, device):
                logits = ddp_model(**batch)
            loss = F.cross_entropy(logits.float(), labels)  # class 0 = true triple, as BERT's "is next"
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params.values(), run.grad_clip)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, run)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step, seen, loss_sum = step + 1, seen + len(triples) * world, loss_sum + loss.item()
            n_real, n_padded = n_real + int(batch["attention_mask"].sum()), n_padded + batch["input_ids"].numel()
            if step % run.log_every == 0 or i == len(order) - 1 or step == total:
                rate = seen / (time.time() - t0)
                eta = (total - step) * run.batch * seqs_per_pos / rate
                log0(f"epoch {epoch + 1}/{run.epochs} step {step}/{total} loss {loss_sum / (i + 1):.4f} "
                     f"lr {opt.param_groups[0]['lr']:.2e} seq/s {rate:.0f} padded/real {n_padded / n_real:.2f} "
                     f"{dtype} eta {eta / 60:.1f}m")
            if run.dev_every and step % run.dev_every == 0 and i < len(order) - 1 and step < total:
                t_dev = time.time()
                if master_process:  # a point of the curve only; the epoch's end decides the checkpoints
                    dev = {"epoch": round(epoch + (i + 1) / len(order), 3), "step": step,
                           **dev_metric(model.eval(), kg, enc, run, device, dtype)}
                    history["dev"].append(dev)
                    log0(f"dev at step {step} (epoch {dev['epoch']}): {dev['metric']} {dev['value']:.4f}")
                    ddp_model.train()
                if ddp:
                    dist.barrier()
                t0 += time.time() - t_dev  # evaluation time counts neither in seq/s nor in the train wall time
            if os.environ.get("PALT_TEST_CRASH_AT_STEP") == str(step):  # tests: a crash mid-epoch, for --resume
                os._exit(3)
        history["train_wall_s"] += time.time() - t0
        history["epoch"], history["step"] = epoch + 1, step
        if master_process:  # dev after every epoch; then best (if better), last checkpoint, and the resume state
            dev = {"epoch": epoch + 1, "step": step, **dev_metric(model.eval(), kg, enc, run, device, dtype)}
            history["dev"].append(dev)
            better = history["best"] is None or dev["value"] > history["best"]
            if better:
                history["best"], history["best_epoch"] = dev["value"], epoch + 1
            log0(f"dev after epoch {epoch + 1}: {dev['metric']} {dev['value']:.4f}" + (" (best so far)" if better else "")
                 + (f", MR {dev['mr']:.2f}, Hits@10 {dev['hits@10']:.4f} on {dev['triples']} dev triples" if "mr" in dev else ""))
            m = meta | history
            ckpt = {n: t.cpu() for n, t in trainable_state(model).items()}
            # the order matters for a kill in between: the state is written last, so --resume replays this epoch
            if better:
                save_or_exit(out / "best.safetensors", ckpt, {"kind": "checkpoint", **m}, history["epoch"] - 1)
            save_or_exit(out / "ckpt.safetensors", ckpt, {"kind": "checkpoint", **m}, history["epoch"] - 1)
            save_or_exit(out / "state.safetensors", state_tensors(model, opt, params), {**m, "kind": "train-state"},
                         history["epoch"] - 1)
        if ddp:
            dist.barrier()  # the other ranks wait for rank 0's dev evaluation and saves
    if master_process:
        print0(f"trained {step} steps in {history['train_wall_s'] / 60:.1f} min ({dtype}); last {out}/ckpt.safetensors "
               f"({(out / 'ckpt.safetensors').stat().st_size / 2**20:.1f} MiB), best by dev {out}/best.safetensors "
               f"(epoch {history['best_epoch']})")
    if ddp:  # DDP keeps the replicas equal by construction; check it rather than assume it
        flat = torch.cat([p.detach().float().flatten() for p in params.values()])
        copies = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(copies, flat)
        print0(f"ranks agree: max |difference| of trainable tensors over {world} ranks = "
               f"{max((c - flat).abs().max().item() for c in copies):.3g}")
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
    filtered MRR of a seeded sample of dev_limit dev triples (the same sample every epoch)."""
    import evaluate
    if kg.task == "tc":
        scores = evaluate.score_triples(model, enc, kg.dev, run.prompts, run.max_seq_length, device, dtype=dtype)
        return {"metric": "accuracy", "value": evaluate.best_threshold(scores, kg.dev_labels)[1]}
    m = evaluate.rank_split(model, kg, enc, "dev", run.prompts, run.max_seq_length, device, limit=run.dev_limit, dtype=dtype)
    return {"metric": "mrr", "value": m["mrr"], "mr": m["mr"], "hits@10": m["hits@10"],
            "triples": min(run.dev_limit or len(kg.dev), len(kg.dev))}


if __name__ == "__main__":
    try:
        main(parse_args())
    except (DataError, CheckpointError, ConfigError) as e:
        raise SystemExit(f"error: {e}")
