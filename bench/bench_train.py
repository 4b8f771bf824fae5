"""Benchmark (prints figures; not a test): training throughput of train.py's step, today's loop against the new default.

The step is built the way train.py builds it: PALT on MiniLM with the README recipe (prompts 2,0,0, negatives
1,1,1 from data.NegativeSampler, 32 positives + 96 negatives per step, max_seq_length 192), build_batch,
cross-entropy on fp32 logits (label 0 = positive, 1 = negative), clip_grad_norm_ 1.0, AdamW with a decay and a
no-decay group. Variants, alternated inside every round (other work on a shared machine slows whichever runs
beside it), best of --repeat rounds of --steps steps each:

  a  today      fp32 eager, plain shuffled order (train.epoch_order with pool_steps=0)
  b  new        the resolved 'auto' dtype (bf16 autocast on CUDA and native-bf16 CPUs) + length-bucketed order
  c  finetune   --finetune (all LM weights train, no PALT part) with b's dtype and order
  d  bf16 only  b's dtype, plain order          e  bucket only  fp32, bucketed order

    python bench/bench_train.py                          # umls and wn11, about 3-5 minutes on 2 cores
    python bench/bench_train.py --data wn11 --steps 4 --repeat 2
    python bench/bench_train.py --padding --data umls,wn11,fb13     # padded/real tokens of an epoch, no timing
    python bench/bench_train.py --recipes cpu,gpu --data wn18rr      # train.py's step by recipe (a GPU's figure)
    python bench/bench_train.py --data umls --recipes cpu:today,cpu [--dtype fp32]   # the CPU step before 2026-11-29
                                                                     # against today's, alternating, share of peak
    python bench/bench_train.py --recipes gpu,gpu@128,gpu:cudagraphs --data wn18rr   # ... at batch 128, as CUDA graphs
"""
import argparse, contextlib, os, sys, time, warnings
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bert, data, palt, train  # noqa: E402
from support import devices, graphs, hf, hub  # noqa: E402

PROMPTS, NEGATIVES, BATCH, MAX_SEQ = (2, 0, 0), (1, 1, 1), 32, 192
PALT_CFG = palt.PaltConfig(prompts=PROMPTS)
FINETUNE_CFG = palt.PaltConfig(method="finetune")
LR = {"palt": 1e-3, "finetune": 5e-5}  # the README's PALT rate; a finetuning rate (speed does not depend on it)


def optimizer(model, device):
    """train.py's AdamW: weight decay on matrices only; fused, as there."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.01},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, fused=device.type in ("cuda", "cpu")), params


def train_step(model, opt, params, kg, enc, neg, idx, prompts, dtype, device):
    """One step of train.py's inner loop on the positives idx (32,) and their negatives; returns its seconds."""
    t = time.perf_counter()
    triples = np.concatenate([kg.train[idx], neg[idx].reshape(-1, 3)])
    labels = torch.cat([torch.zeros(len(idx)), torch.ones(len(idx) * sum(NEGATIVES))]).long().to(device)
    batch = {k: v.to(device, non_blocking=True) for k, v in data.build_batch(enc, triples, prompts, MAX_SEQ).items()}
    with bert.autocast(dtype, device):
        logits = model(**batch)
    loss = F.cross_entropy(logits.float(), labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()  # train.py logs every step's loss (on a GPU this waits for the step)
    return time.perf_counter() - t


def representative(order, keys, n):
    """n steps of an epoch order whose padded sizes are spread like the whole epoch's: the steps at the n
    quantiles of padded tokens. A few consecutive steps of a bucketed epoch would all come from one length pool
    and be much faster or slower than its average."""
    padded = keys[order].max(1)
    by_size = np.argsort(padded, kind="stable")
    return np.sort(by_size[((np.arange(n) + 0.5) * len(order) / n).astype(int)])


def padding(names, data_dir):
    """Padded / real tokens of one epoch's training steps (README recipe), plain shuffle vs length-bucketed order;
    numpy only, no model runs (so fb13 too)."""
    tok = hf.load_tokenizer(hub.model_dir("minilm"))
    print(f"{'':6} {'real tok/seq':>12} {'shuffled: padded/seq':>21} {'padded/real':>11} {'bucketed: padded/seq':>21} "
          f"{'padded/real':>11}")
    for name in names:
        kg = graphs.load_kg(name, data_dir)
        neg = data.NegativeSampler(kg, *NEGATIVES, seed=42).negatives(0)
        rows = np.concatenate([kg.train[:, None], neg], 1).reshape(-1, 3)
        lengths = data.seq_lengths(data.encode(kg, tok), rows, PROMPTS, MAX_SEQ).reshape(len(kg.train), -1)
        cells = []
        for pool in (0, 100):
            order = train.epoch_order(lengths.max(1), BATCH, 0, 42, pool_steps=pool)
            real, padded = lengths[order].sum(), lengths[order].max((1, 2)).sum() * lengths.shape[1] * BATCH
            cells.append(f"{padded / order.size / lengths.shape[1]:21.1f} {padded / real:11.2f}")
        print(f"{name:6} {lengths.mean():12.1f} " + " ".join(cells))


def bench(name, args, models, device, auto):
    kg = graphs.load_kg(name, args.data_dir)
    enc = data.encode(kg, models["palt"][1].tokenizer)
    neg = data.NegativeSampler(kg, *NEGATIVES, seed=42).negatives(0)  # (N, 3, 3); once an epoch in train.py: not timed
    rows = np.concatenate([kg.train[:, None], neg], 1).reshape(-1, 3)
    lengths = {p: data.seq_lengths(enc, rows, p, MAX_SEQ).reshape(len(kg.train), -1) for p in (PROMPTS, (0, 0, 0))}
    keys = {p: l.max(1) for p, l in lengths.items()}  # a positive's longest sequence among itself and its negatives
    # (name, model, dtype, pool_steps): 100 is train.epoch_order's default pool, 0 a plain shuffle
    variants = [("a today: fp32, shuffled", "palt", "fp32", 0), (f"b new: {auto}, bucketed", "palt", auto, 100),
                (f"c finetune: {auto}, bucketed", "finetune", auto, 100)]
    if not args.no_split:
        variants += [(f"d {auto} only, shuffled", "palt", auto, 0), ("e bucketing only, fp32", "palt", "fp32", 100)]
    plans = {}
    for v, m, dtype, pool in variants:
        p = PROMPTS if m == "palt" else (0, 0, 0)
        order = train.epoch_order(keys[p], BATCH, 0, 42, pool_steps=pool)
        steps = order[representative(order, keys[p], args.steps)]
        epoch_real, epoch_padded = lengths[p][order].sum(), (keys[p][order].max(1) * BATCH * (1 + sum(NEGATIVES))).sum()
        plans[v] = dict(model=m, dtype=dtype, prompts=p, steps=steps, real=int(lengths[p][steps].sum()),
                        padded=int((keys[p][steps].max(1) * BATCH * (1 + sum(NEGATIVES))).sum()),
                        epoch_pad=epoch_padded / epoch_real, times=np.zeros((args.repeat, args.steps)))
    seqs = args.steps * BATCH * (1 + sum(NEGATIVES))
    # alternate the variants step by step: a burst of other work on a shared machine hits them all alike; a step
    # takes the same work in every round, so its best round is its time on a quiet machine
    for r in range(args.repeat):
        for i in range(args.steps):
            for plan in plans.values():
                model, _, opt, params = models[plan["model"]]
                plan["times"][r, i] = train_step(model, opt, params, kg, enc, neg, plan["steps"][i], plan["prompts"],
                                                 plan["dtype"], device)
    print(f"\n{name}: {len(kg.train):,} train positives, {len(kg.train) // BATCH} steps an epoch; {args.steps} steps "
          f"(at the quantiles of padded size) x {BATCH}+{BATCH * sum(NEGATIVES)} sequences, each step's best of "
          f"{args.repeat} rounds")
    print(f"{'':32} {'seq/s':>7} {'real tok/s':>10} {'padded/real':>11} {'(epoch)':>8} {'s/step':>7}")
    rate, tok = {}, {}
    for v, plan in plans.items():
        t = plan["times"].min(0).sum()
        rate[v], tok[v] = seqs / t, plan["real"] / t
        print(f"{v:32} {seqs / t:7.0f} {plan['real'] / t:10,.0f} {plan['padded'] / plan['real']:11.2f} "
              f"{plan['epoch_pad']:8.2f} {t / args.steps:7.3f}")
    a, b, c = (v[0] for v in variants[:3])
    print(f"new default / today: x{rate[b] / rate[a]:.2f} seq/s (goal >= 2.5)")
    print(f"PALT / finetune at {auto}, bucketed: x{rate[b] / rate[c]:.2f} seq/s, x{tok[b] / tok[c]:.2f} real tok/s "
          f"(goal >= 1.4; finetune rows lack the 2 prompt tokens)")
    if not args.no_split:
        d, e = (rate[v[0]] for v in variants[3:])
        print(f"separately: {auto} alone x{d / rate[a]:.2f}, bucketing alone x{e / rate[a]:.2f}")


def attention_then(self, h, mask):
    """bert.Layer.attention as it was before 2026-11-29 (commit 07277ec): SDPA draws its own dropout (torch's
    bernoulli_ on a CPU)."""
    B, L, H = h.shape
    q, k, v = (x(h).view(B, L, self.n_head, H // self.n_head).transpose(1, 2) for x in (self.q, self.k, self.v))
    p = self.p_attn if self.training else 0.0
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    a = a.transpose(1, 2).reshape(B, L, H)
    return self.ln1(h + bert.dropout(self.attn_out(a), self.p_drop, self.training))


class PromptsByIndex:
    """palt.py's F for the step before 2026-11-29: the prompt vectors picked as P[index] (its backward an index_put_
    with accumulation), not looked up as F.embedding."""

    def __getattr__(self, name):
        return getattr(F, name)

    @staticmethod
    def embedding(index, P):
        return P[index]


@contextlib.contextmanager
def step_as(mode):
    """'today' runs train.py's step as it was before 2026-11-29 (commit 07277ec): torch's own dropout (F.dropout and
    SDPA's; a float drawn per element by bernoulli_ on a CPU) and the prompt vectors picked by index (recipe_speed
    adds AdamW unfused). Anything else runs the code as it is."""
    if mode != "today":
        yield
        return
    saved = bert.dropout, bert.Layer.attention, palt.F
    bert.dropout, bert.Layer.attention, palt.F = F.dropout, attention_then, PromptsByIndex()
    try:
        yield
    finally:
        bert.dropout, bert.Layer.attention, palt.F = saved


def recipe_speed(name, recipes, args, device):
    """Sequences/s of train.py's own step (train.build, train.train_step) under each recipe's batch, negatives, prompts
    and compile, on --steps steps at the quantiles of padded size, the recipes alternating pass by pass (a burst of
    other work on a shared machine hits them all alike; each keeps its best of --repeat passes after one untimed one,
    the compile). RECIPE:MODE overrides the compile: eager, compile, or (CUDA only) cudagraphs, train.py's
    --cudagraphs (torch.compile's reduce-overhead mode), which replays the step's kernels as CUDA graphs (one per
    padded length), not each launched; or today: the step before 2026-11-29's CPU work (step_as), eager.
    RECIPE[:MODE]@N the batch (N positives a step: a larger batch's speed, before the UMLS gate rules on it)."""
    import bench_eval  # the peak: a GPU's spec, else a measured matmul
    dtype_flag = getattr(args, "dtype", None) or "auto"
    print(f"\n{name}: train.py's step by recipe ('{devices.resolve_dtype(dtype_flag, device)}' dtype), best of {args.repeat}")
    print(f"{'recipe':18} {'batch':>5} {'seq/step':>8} {'compiled':>8} {'seq/s':>8} {'real tok/s':>11} "
          f"{'TFLOP/s':>8} {'share of peak':>13}")
    plans = []
    for recipe in recipes:
        spec, _, batch = recipe.partition("@")
        name_mode = spec.split(":")
        if name_mode[1:] == ["cudagraphs"] and device.type != "cuda":
            continue  # CUDA graphs exist on a GPU only
        run = train.parse_args(["--data", name, "--recipe", name_mode[0], "--out", "/nonexistent", "--data-dir",
                                args.data_dir or os.environ.get("PALT_DATA", "data")] + ["--batch", batch] * bool(batch)
                               + ["--dtype", getattr(args, "dtype", None) or "auto"])
        mode = name_mode[1] if name_mode[1:] else "compile" if run.compile else "eager"
        dtype = devices.resolve_dtype(run.dtype, device)
        model, kg, enc, _, params, opt = train.build(run, dtype, device)
        model.train()
        if mode == "today":  # AdamW tensor by tensor, as before on a CPU
            opt = torch.optim.AdamW([{**g, "fused": None} for g in opt.param_groups])
        run.compile, run.cudagraphs = mode not in ("eager", "today"), mode == "cudagraphs"
        forward = devices.compiled(model, run)  # train.py's own: what --compile [--cudagraphs] trains with
        neg = data.NegativeSampler(kg, *run.negatives, seed=0).negatives(0)
        per = 1 + neg.shape[1]
        lengths = data.seq_lengths(enc, np.concatenate([kg.train[:, None], neg], 1).reshape(-1, 3), run.prompts,
                                   run.max_seq_length).reshape(len(neg), per)
        order = train.epoch_order(lengths.max(1), run.batch, 0, 0)
        steps = order[representative(order, lengths.max(1), args.steps)]
        batches = [(data.build_batch(enc, np.concatenate([kg.train[idx], neg[idx].reshape(-1, 3)]), run.prompts,
                                     run.max_seq_length), len(idx)) for idx in steps]
        plans.append(dict(recipe=recipe, run=run, mode=mode, dtype=dtype, model=model, forward=forward, opt=opt,
                          params=params, batches=batches, steps=steps, lengths=lengths, per=per, times=[]))

    def passes(plan):
        """One pass over the plan's steps, as train.py takes them."""
        run = plan["run"]
        with step_as(plan["mode"]):
            for b, n in plan["batches"]:
                train.train_step(plan["forward"], plan["opt"], plan["params"], b, n, 1e-4, run.grad_clip,
                                 plan["dtype"], device)

    for _ in range(1 + args.repeat):  # the first pass compiles and warms up
        for plan in plans:
            plan["times"].append(bench_eval.timed(lambda: passes(plan), device))
    rate, peaks, rows = {}, {}, []
    for plan in plans:
        recipe, run, mode, dtype, steps, lengths = (plan[k] for k in ("recipe", "run", "mode", "dtype", "steps",
                                                                       "lengths"))
        t = min(plan["times"][1:])
        if getattr(args, "profile", False):  # where a step's time goes: host work and launches, or the kernels
            acts = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * (device.type == "cuda")
            with torch.profiler.profile(activities=acts) as prof:
                bench_eval.timed(lambda: passes(plan), device)
            print(f"{recipe}: {len(steps)} steps profiled, by self CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))
        seqs, real = len(steps) * run.batch * plan["per"], int(lengths[steps].sum())
        cfg = plan["model"].bert.config
        # frozen weights: the backward computes the activations' gradients, not the weights': ~2x the forward
        flop = 2 * bench_eval.flops(cfg, lengths[steps].ravel().astype(np.float64))
        if dtype not in peaks:  # measured once per dtype: the rows share it
            spec = [v for k, v in bench_eval.PEAK_BF16.items()
                    if device.type == "cuda" and dtype == "bf16" and k in torch.cuda.get_device_name()]
            peaks[dtype] = spec[0] if spec else bench_eval.matmul_peak(
                torch.bfloat16 if dtype == "bf16" else torch.float32, device, 8192 if device.type == "cuda" else 2048)
        peak = peaks[dtype]
        rate[recipe] = seqs / t
        rows.append(dict(data=name, recipe=recipe, batch=run.batch, seq_per_step=run.batch * plan["per"],
                         compiled=mode, dtype=dtype, seq_per_s=round(seqs / t, 1),
                         real_tok_per_s=round(real / t), tflops=round(flop / t / 1e12, 3),
                         share_of_peak=round(flop / t / peak, 4), peak_tflops=round(peak / 1e12, 2)))
        print(f"{recipe:18} {run.batch:5} {run.batch * plan['per']:8} {mode:>8} {seqs / t:8,.0f} "
              f"{real / t:11,.0f} {flop / t / 1e12:8.2f} {100 * flop / t / peak:12.1f}% of {peak / 1e12:.2f} "
              f"TFLOP/s {dtype}", flush=True)
    if len(rate) > 1:
        first, best = list(rate)[0], max(rate, key=rate.get)  # the rows' order is the caller's: the fastest is named
        print(f"fastest {best} / {first}: x{rate[best] / rate[first]:.2f} seq/s, {rate[best]:,.0f} seq/s (the goal "
              f"{'on a GPU: >= 40k' if device.type == 'cuda' else 'on a CPU: >= x2 over cpu:today'})")
    return rows


def attention_speed(lengths, device):
    """One layer's F.scaled_dot_product_attention, forward and backward, at a gpu-recipe WN18RR step's shapes (160
    sequences, 12 heads of 32, a key-padding mask, training's dropout 0.1) under each SDPA backend that takes them:
    which kernel a step should use. FLASH takes no mask: its row is the floor a packed (mask-free) attention nears."""
    import bench_eval
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = torch.bfloat16 if devices.resolve_dtype("auto", device) == "bf16" else torch.float32
    B, n_head, d, n = 160, 12, 32, 20 if device.type == "cuda" else 2
    backends = [("default", None), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("math", SDPBackend.MATH), ("flash, no mask", SDPBackend.FLASH_ATTENTION)]
    print(f"\nattention: one layer's forward + backward, {B} sequences x {n_head} heads x {d}, {dtype}, dropout 0.1; "
          f"microseconds (x6 layers a step; '-': the backend refuses these inputs)")
    print(f"{'padded length':>13} " + " ".join(f"{name:>14}" for name, _ in backends))
    g = torch.Generator().manual_seed(0)
    warnings.simplefilter("ignore")  # a backend that refuses warns why, then raises: its '-' says it (the bench's end)
    for L in lengths:
        real = torch.randint(L // 2, L + 1, (B,), generator=g)
        real[0] = L  # the longest row sets the padded length
        mask = (torch.arange(L)[None, :] < real[:, None])[:, None, None, :].to(device)  # (B, 1, 1, L): keys
        q, k, v = (torch.randn(B, n_head, L, d, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
        cells = []
        for name, backend in backends:
            m = None if name.endswith("no mask") else mask
            step = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=0.1).sum().backward()
            try:
                with sdpa_kernel(backend) if backend else contextlib.nullcontext():
                    step()  # the warm-up; a backend that cannot take these inputs raises here
                    t = min(bench_eval.timed(lambda: [step() for _ in range(n)], device) for _ in range(3)) / n
                cells.append(f"{t * 1e6:14,.0f}")
            except RuntimeError:
                cells.append(f"{'-':>14}")
        print(f"{L:13} " + " ".join(cells), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="umls,wn11", help="comma-separated datasets")
    ap.add_argument("--data-dir", help="default $PALT_DATA, else data/")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per variant and round")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (>= 2: the first warms up); each step's best is kept")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core); 1 suffers less "
                    "from other work on a shared machine")
    ap.add_argument("--no-split", action="store_true", help="skip d and e (the dtype and order effects alone)")
    ap.add_argument("--recipes", help="time train.py's step under these recipes instead (e.g. cpu,gpu: their batch, "
                    "negatives, prompts and compile; on a GPU the RESULTS.md step-speed figure), on --data (default wn18rr)")
    ap.add_argument("--attention", type=lambda s: [int(x) for x in s.split(",")], help="--recipes: also time one "
                    "layer's attention under each SDPA backend at these padded lengths, e.g. 48,64,96")
    ap.add_argument("--dtype", choices=["auto", "bf16", "fp32"], help="--recipes: train.py's --dtype (default auto)")
    ap.add_argument("--profile", action="store_true", help="--recipes: also a torch.profiler table of each recipe's steps")
    ap.add_argument("--padding", action="store_true", help="only the padding of one epoch, shuffled vs bucketed "
                    "(no timing; fast, so fb13 too: --data umls,wn11,fb13)")
    args = ap.parse_args()
    if args.padding:
        return padding(args.data.split(","), args.data_dir)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.recipes:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch.backends.cuda.matmul.allow_tf32 = True  # as train.py (devices.start_processes) sets it
        for name in (args.data if args.data != ap.get_default("data") else "wn18rr").split(","):
            recipe_speed(name, args.recipes.split(","), args, device)
        if args.attention:
            attention_speed(args.attention, device)
        return
    if not hasattr(train, "epoch_order"):
        raise SystemExit("error: train.epoch_order is missing (the length-bucketed order): update train.py")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    auto = devices.resolve_dtype("auto", device)
    models = {}
    for m, cfg in (("palt", PALT_CFG), ("finetune", FINETUNE_CFG)):
        torch.manual_seed(0)
        model, loaded = palt.build_palt("minilm", cfg)
        model.to(device).train()  # dropout on, as in train.py
        opt, params = optimizer(model, device)
        for g in opt.param_groups:
            g["lr"] = LR[m]
        models[m] = (model, loaded, opt, params)
    tunable = {m: palt.param_report(models[m][0])["tunable"] for m in models}
    cpu = f"cpu, {torch.get_num_threads()} threads, native bf16: {devices.cpu_has_native_bf16()}"
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else cpu}; MiniLM; 'auto' dtype = {auto}; "
          f"tunable: PALT {tunable['palt']:,}, finetune {tunable['finetune']:,}; load average {os.getloadavg()[0]:.2f} "
          f"(the machine may be shared: ratios come from alternated steps, absolute figures may be low)")
    t0 = time.time()
    for name in args.data.split(","):
        bench(name, args, models, device, auto)
    print(f"\n{time.time() - t0:.0f} s; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
