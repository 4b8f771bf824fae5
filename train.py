"""Train PALT on a knowledge graph: one CPU, one GPU, or many with torchrun.

  python train.py --data umls --model minilm --epochs 3
  torchrun --nproc_per_node 8 train.py --data wn11 --model bert-base-cased
"""
import argparse, json, os, time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler
from safetensors import safe_open
from safetensors.torch import save_file

from bert import CheckpointError
from data import DataError, NegativeSampler, build_batch, dataset, encode, load_kg
from palt import ConfigError, PaltConfig, build_palt, param_report, read_checkpoint, save_checkpoint

# The paper's appendix (BERT-base). batch = positives per optimizer step over all ranks, each with its negatives.
# negatives = corruptions of (head, relation, tail) per positive. umls is not in the appendix: our choice.
PRESETS = {
    "wn11": dict(lr=1.5e-4, epochs=40, negatives=(1, 1, 1), prompts=(2, 0, 0), batch=32),
    "fb13": dict(lr=1.5e-5, epochs=40, negatives=(1, 1, 1), prompts=(10, 10, 10), batch=32),
    "fb15k-237": dict(lr=1e-4, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8),
    "wn18rr": dict(lr=1e-5, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8),
    "umls": dict(lr=1e-4, epochs=10, negatives=(5, 5, 5), prompts=(10, 10, 10), batch=8),
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
    max_seq_length: int = 192
    warmup: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 42
    log_every: int = 20
    resume: bool = False


def parse_args(argv=None):
    ints = lambda s: tuple(int(x) for x in s.split(","))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help=", ".join(PRESETS))
    ap.add_argument("--model", default="minilm", help="minilm, bert-base-cased, ..., or a directory")
    ap.add_argument("--data-dir", help="folder holding the datasets (else $PALT_DATA, else data/)")
    ap.add_argument("--text", choices=["name", "long"], default="name")
    ap.add_argument("--out", help="checkpoint and log folder (default runs/<data>-<model>)")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--batch", type=int, help="positive triples per step over all ranks")
    ap.add_argument("--negatives", type=ints, help="head,relation,tail corruptions per positive, e.g. 5,0,5")
    ap.add_argument("--prompts", type=ints, help="b,m,e prompt tokens, e.g. 2,0,0")
    ap.add_argument("--calib", type=lambda s: () if s == "none" else ints(s), help="layers, e.g. 6,11, or none")
    ap.add_argument("--no-wp", action="store_true", help="ablation: no prompt encoder W_p")
    ap.add_argument("--prompt-mlp", action="store_true", help="re-parametrise prompts through an MLP")
    ap.add_argument("--finetune", action="store_true", help="train the whole LM, no PALT parts (KG-BERT)")
    for f in ("max_seq_length", "warmup", "weight_decay", "grad_clip", "seed", "log_every"):
        ap.add_argument("--" + f.replace("_", "-"), type=type(Run.__dataclass_fields__[f].default),
                        default=Run.__dataclass_fields__[f].default)
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    run = Run(**vars(ap.parse_args(argv)))
    name = dataset(run.data)[0].lower()
    for k, v in PRESETS[name].items():  # the preset fills what the command line left open
        if getattr(run, k) is None:
            setattr(run, k, v)
    if run.finetune:  # the paper's Finetuning row: the whole LM, none of PALT's parts
        run.prompts, run.calib, run.no_wp = (0, 0, 0), (), True
    run.out = run.out or f"runs/{name}-{Path(run.model).name}"
    return run


def lr_at(step, total, run):
    """Linear warm-up over the first `warmup` fraction of steps, then linear decay to zero."""
    warm = max(1, int(run.warmup * total))
    return run.lr * (step + 1) / warm if step < warm else run.lr * max(0.0, (total - step) / max(1, total - warm))


def save_state(path, opt, names, meta):
    """AdamW moments of the trainable tensors, for --resume (the model checkpoint itself stays small)."""
    tensors = {f"{k}.{names[p]}": v.detach().cpu().reshape(-1) if k == "step" else v.detach().cpu()
               for p, st in opt.state.items() for k, v in st.items()}
    tmp = Path(str(path) + ".tmp")
    save_file(tensors, str(tmp), metadata={"meta": json.dumps(meta)})
    os.replace(tmp, path)


def load_state(path, opt, params):
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = json.loads(f.metadata()["meta"])
    for name, p in params.items():
        if f"step.{name}" in tensors:
            opt.state[p] = {"step": tensors[f"step.{name}"].reshape(()), "exp_avg": tensors[f"exp_avg.{name}"].to(p.device),
                            "exp_avg_sq": tensors[f"exp_avg_sq.{name}"].to(p.device)}
    return meta


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
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()  # fp32 on CPU
    if run.batch % world:
        raise SystemExit(f"error: --batch {run.batch} is not divisible by the {world} ranks")
    out = Path(run.out)
    if not run.resume and (out / "ckpt.safetensors").is_file():  # never overwrite a trained checkpoint; fail early
        raise SystemExit(f"error: {out}/ckpt.safetensors exists: --resume to continue it, or choose another --out")

    # ----------------------------------------------------------------------------------------- data and model
    torch.manual_seed(run.seed)  # the same fresh heads on every rank
    cfg = PaltConfig(prompts=run.prompts, calib_layers=run.calib, prompt_encoder=not run.no_wp,
                     prompt_mlp=run.prompt_mlp, finetune=run.finetune)
    model, loaded = build_palt(run.model, cfg)
    kg = load_kg(run.data, run.data_dir, run.text)
    enc = encode(kg, loaded.tokenizer)
    negatives = NegativeSampler(kg, *run.negatives, seed=run.seed)
    report = param_report(model)
    if report["tunable"] == 0:
        raise SystemExit("error: nothing to train (zero-shot needs no training: use evaluate.py --model)")
    print0(f"{kg.name}: {len(kg.train):,} train triples, {len(kg.entities):,} entities | {loaded.path.name}: "
           f"tunable {report['tunable']:,} of {report['total']:,} ({report['percent']:.2f}%) {report['parts']}")
    model.to(device)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    names = {p: n for n, p in params.items()}
    decay = [p for p in params.values() if p.ndim >= 2]  # no weight decay on biases and LayerNorm
    no_decay = [p for p in params.values() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": run.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=run.lr, betas=(0.9, 0.999), eps=1e-8, fused=cuda)
    ddp_model = DDP(model, device_ids=[local_rank] if cuda else None) if ddp else model

    sampler = DistributedSampler(range(len(kg.train)), num_replicas=world, rank=rank, shuffle=True, seed=run.seed, drop_last=True)
    per_rank = run.batch // world
    steps_per_epoch = len(sampler) // per_rank
    total = min(run.epochs * steps_per_epoch, run.max_steps or 10**18)
    start_epoch, step = 0, 0
    meta = {"model": run.model, "weights_sha256": loaded.weights_sha256, "data": kg.name, "data_fingerprint": kg.fingerprint,
            "text": run.text, "prompts": list(run.prompts), "max_seq_length": run.max_seq_length,
            "run": json.dumps(asdict(run)), "tunable": report["tunable"], "total": report["total"]}
    if run.resume and (out / "state.safetensors").is_file():
        tensors, ckpt_meta = read_checkpoint(out / "ckpt.safetensors")
        for k in ("weights_sha256", "data_fingerprint", "prompts", "max_seq_length"):
            if ckpt_meta[k] != meta[k]:
                raise SystemExit(f"error: {out}/ckpt.safetensors was written for another {k}: {ckpt_meta[k]} != {meta[k]}")
        model.load_state_dict(model.state_dict() | {k: v.to(device) for k, v in tensors.items()}, strict=True)
        state = load_state(out / "state.safetensors", opt, params)
        start_epoch, step = state["epoch"], state["step"]
        print0(f"resumed from {out}/ckpt.safetensors: epoch {start_epoch}, step {step}")
    else:
        if run.resume:
            print0(f"--resume: no checkpoint in {out} yet, starting from scratch")
        if master_process:
            out.mkdir(parents=True, exist_ok=True)
    log = open(out / "log.txt", "a") if master_process else None

    # ---------------------------------------------------------------------------------------------- training
    ddp_model.train()
    seqs_per_pos = 1 + sum(run.negatives)
    t_start = time.time()
    for epoch in range(start_epoch, run.epochs):
        if step >= total:
            break
        sampler.set_epoch(epoch)
        torch.manual_seed(run.seed + 1000 * epoch + rank)  # dropout: an epoch replays exactly after --resume
        neg = negatives.negatives(epoch)  # (N, n_neg, 3), the same on every rank
        order = np.fromiter(iter(sampler), dtype=np.int64)
        t0, seen, loss_sum = time.time(), 0, 0.0
        for i in range(steps_per_epoch):
            if step >= total:
                break
            idx = order[i * per_rank:(i + 1) * per_rank]
            triples = np.concatenate([kg.train[idx], neg[idx].reshape(-1, 3)])
            labels = torch.cat([torch.zeros(len(idx)), torch.ones(len(idx) * (seqs_per_pos - 1))]).long().to(device)
            batch = {k: v.to(device, non_blocking=True) for k, v in build_batch(enc, triples, run.prompts, run.max_seq_length).items()}
            with autocast:
                logits = ddp_model(**batch)
            loss = F.cross_entropy(logits.float(), labels)  # class 0 = true triple, as BERT's "is next"
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params.values(), run.grad_clip)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, run)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step, seen, loss_sum = step + 1, seen + len(triples) * world, loss_sum + loss.item()
            if step % run.log_every == 0 or i == steps_per_epoch - 1:
                rate = seen / (time.time() - t0)
                eta = (total - step) * run.batch * seqs_per_pos / rate
                line = (f"epoch {epoch + 1}/{run.epochs} step {step}/{total} loss {loss_sum / (i + 1):.4f} "
                        f"lr {opt.param_groups[0]['lr']:.2e} seq/s {rate:.0f} eta {eta / 60:.1f}m")
                print0(line)
                if log:
                    log.write(line + "\n")
                    log.flush()
            if os.environ.get("PALT_TEST_CRASH_AT_STEP") == str(step):  # tests: a crash mid-epoch, for --resume
                os._exit(3)
        if master_process:  # checkpoint at every epoch end: trainable tensors + what they were trained on
            save_checkpoint(out / "ckpt.safetensors", model, meta | {"epoch": epoch + 1, "step": step})
            save_state(out / "state.safetensors", opt, names, {"epoch": epoch + 1, "step": step})
    if master_process:
        print0(f"trained {step} steps in {(time.time() - t_start) / 60:.1f} min; checkpoint {out}/ckpt.safetensors "
               f"({(out / 'ckpt.safetensors').stat().st_size / 2**20:.1f} MiB)")
    if ddp:  # DDP keeps the replicas equal by construction; check it rather than assume it
        flat = torch.cat([p.detach().float().flatten() for p in params.values()])
        copies = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(copies, flat)
        print0(f"ranks agree: max |difference| of trainable tensors over {world} ranks = "
               f"{max((c - flat).abs().max().item() for c in copies):.3g}")
    if master_process:
        dev_report(model.eval(), kg, enc, run, device, print0)
    if ddp:
        dist.destroy_process_group()
    return model


def dev_report(model, kg, enc, run, device, print0):
    """The task's dev metric: accuracy at the dev-tuned threshold, or a ranking estimate on 100 dev triples."""
    import evaluate
    if kg.task == "tc":
        scores = evaluate.score_triples(model, enc, kg.dev, run.prompts, run.max_seq_length, device)
        thr, acc = evaluate.best_threshold(scores, kg.dev_labels)
        print0(f"dev accuracy {acc:.4f} at threshold {thr:.3f} (tuned on dev itself: an upper estimate)")
    else:
        m = evaluate.rank_split(model, kg, enc, "dev", run.prompts, run.max_seq_length, device, limit=100)
        print0(f"dev ranking estimate on 100 triples: MRR {m['mrr']:.4f} MR {m['mr']:.1f} Hits@10 {m['hits@10']:.4f}")


if __name__ == "__main__":
    try:
        main(parse_args())
    except (DataError, CheckpointError, ConfigError) as e:
        raise SystemExit(f"error: {e}")
