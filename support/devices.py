"""Where the work runs: the autocast precision a CPU or GPU gets (on a CPU with native bf16, the
faster of the two, timed once and cached), train.py's and evaluate.py's torchrun processes, and
torch.compile. Imports only support.files and support.errors of the project."""
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from support import files
from support.errors import FlagError

# autocast precisions: trained weights, optimizer state, loss and NSP head stay fp32; under bf16 the
# encoder's frozen linears are held in bf16 (hold_frozen_linears: cast once, bit-identical)
DTYPES = ("auto", "fp32", "bf16")
# auto takes bf16 on a CPU with native bf16 only where its matmuls run at least this much faster:
# some CPUs with AVX512_BF16 and no AMX run them slower than fp32
BF16_MARGIN = 1.10
# the timed shape: a scoring batch's share of tokens through the default MiniLM's feed-forward block
# (H = 384 -> 4H -> H), small enough to cost well under a second
TIMED_ROWS, TIMED_HIDDEN = 4096, 384


def cache_dir():
    """Where computed-once results are kept: $PALT_CACHE, else $XDG_CACHE_HOME/palt, else
    ~/.cache/palt."""
    if os.environ.get("PALT_CACHE"):
        return Path(os.environ["PALT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "palt"


def cpu_fields(cpuinfo="/proc/cpuinfo"):
    """The first processor's fields in /proc/cpuinfo {key: value}; {} where there is none (macOS,
    Windows)."""
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_info(cpuinfo="/proc/cpuinfo"):
    """(model name, flags) of this CPU from /proc/cpuinfo; ('unknown', empty) where there is
    none."""
    fields = cpu_fields(cpuinfo)
    return fields.get("model name", "unknown"), frozenset(fields.get("flags", "").split())


def machine(device="cpu", cpuinfo="/proc/cpuinfo"):
    """Where a run trains, as its log records each segment: the GPU's name, or the CPU's model
    name, family and model numbers and the threads torch uses."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    fields = cpu_fields(cpuinfo)
    threads = torch.get_num_threads()
    return (f"{fields.get('model name', 'unknown CPU')} (family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}), {threads} thread{'s' if threads > 1 else ''}")


def cpu_has_native_bf16(cpuinfo="/proc/cpuinfo"):
    """True where the CPU has bf16 dot products (AVX512_BF16, AMX); elsewhere bf16 is emulated, far
    slower than fp32."""
    return not {"avx512_bf16", "amx_bf16"}.isdisjoint(cpu_info(cpuinfo)[1])


def resolve_dtype(choice, device, warn=False):
    """'auto' | 'fp32' | 'bf16' -> 'fp32' | 'bf16'; auto = bf16 on CUDA, fp32 on a CPU without
    native bf16, and on one with it whichever runs the model's matmuls faster here (auto_dtype).
    warn (the process that logs): auto's choice and why, one line on stderr; a warning where bf16 is
    asked of a CPU that only emulates it. Under torchrun every process takes process 0's choice."""
    if choice not in DTYPES:
        raise FlagError(f"--dtype must be one of {', '.join(DTYPES)}, not {choice!r}")
    cpu = torch.device(device).type == "cpu"
    # An emulated bf16 runs far slower than fp32: say so where it is asked for.
    if choice == "bf16" and cpu and warn and not cpu_has_native_bf16():
        print("warning: this CPU has no native bf16 (AVX512_BF16/AMX): --dtype bf16 is emulated "
              "and far slower than fp32 (--dtype auto picks fp32 here)", file=sys.stderr)
    if choice != "auto":
        return choice
    if cpu and dist.is_initialized():  # one precision for all: process 0 times, the others wait
        verdict = [auto_dtype(device) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(verdict, src=0)
        dtype, why = verdict[0]
    else:
        dtype, why = auto_dtype(device)
    if warn:
        print(f"precision: {dtype} ({why})", file=sys.stderr, flush=True)
    return dtype


def auto_dtype(device):
    """(dtype, why) of --dtype auto: bf16 on a GPU; fp32 on a CPU without native bf16; on one with
    it, bf16 where its feed-forward pass (bf16_speedup) is at least BF16_MARGIN times fp32's speed,
    timed once per CPU model, flags, torch version and thread count and kept in
    cache_dir()/dtype.json (unreadable: timed again; unwritable: timed at every start)."""
    if torch.device(device).type == "cuda":
        return "bf16", "GPU"
    if not cpu_has_native_bf16():
        return "fp32", "this CPU has no native bf16"
    name, flags = cpu_info()
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    key = f"{name} | flags {digest} | torch {torch.__version__} | {torch.get_num_threads()} threads"
    path = cache_dir() / "dtype.json"
    cached = read_verdicts(path)
    shown = Path("~") / path.relative_to(Path.home()) if path.is_relative_to(Path.home()) else path
    where = f"timed once, cached in {shown}"
    speedup = cached.get(key, {}).get("bf16_speedup")
    if not isinstance(speedup, float) or not speedup > 0:  # none yet, or damaged
        speedup = bf16_speedup()
        verdicts = cached | {key: {"bf16_speedup": round(speedup, 4)}}
        try:
            files.write_atomic(path, lambda f: f.write(json.dumps(verdicts, indent=1).encode()))
        except OSError as e:
            where = f"timed now: {path} cannot be written ({e.strerror or e}), timed again next run"
    dtype = "bf16" if speedup >= BF16_MARGIN else "fp32"
    return dtype, f"bf16 matmuls {speedup:.2f}x fp32's speed here, {where}"


def read_verdicts(path):
    """{key: {"bf16_speedup": x}} of the cache file; {} where it is missing or damaged (then the
    speed is timed again and the file rewritten)."""
    try:
        verdicts = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(verdicts, dict):
        return {}
    return {k: v for k, v in verdicts.items() if isinstance(v, dict)}


def bf16_speedup(rows=TIMED_ROWS, hidden=TIMED_HIDDEN, repeats=3):
    """fp32's seconds over bf16's (> 1: bf16 is faster) for (rows, hidden) states through a
    feed-forward block as the model runs it: under bf16 autocast with bf16 weights (the frozen
    linears, hold_frozen_linears), else in fp32. The fastest of `repeats` passes each,
    alternated after a warm-up each, so that a burst of other work hits both alike."""
    g = torch.Generator().manual_seed(0)  # the global seed stays as it was
    x = torch.randn(rows, hidden, generator=g)
    up = torch.randn(4 * hidden, hidden, generator=g) / hidden ** 0.5
    down = torch.randn(hidden, 4 * hidden, generator=g) / (2 * hidden)
    weights = [up, torch.zeros(4 * hidden), down, torch.zeros(hidden)]
    held = {"fp32": weights, "bf16": [w.to(torch.bfloat16) for w in weights]}
    best = {"fp32": float("inf"), "bf16": float("inf")}
    for k in range(repeats + 1):
        for dtype, (w1, b1, w2, b2) in held.items():
            t = time.perf_counter()
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, dtype == "bf16"):
                F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
            if k:  # the first pass of each warms up
                best[dtype] = min(best[dtype], time.perf_counter() - t)
    return best["fp32"] / best["bf16"]


@dataclass(frozen=True)
class Processes:
    """This process among torchrun's (else one of one): where it runs and in which precision."""
    rank: int  # process 0 logs, evaluates on dev, saves and writes the results
    local_rank: int  # which GPU of its machine it takes
    world_size: int
    device: torch.device
    dtype: str  # the autocast precision resolved: 'fp32' | 'bf16'

    @property
    def ddp(self) -> bool:
        """Whether the processes form a group (torchrun), so that they wait for one another."""
        return self.world_size > 1 or dist.is_initialized()


def start_processes(dtype_choice: str) -> Processes:
    """The one DDP set-up of train.py and evaluate.py, the nanoGPT way: under torchrun (it sets
    RANK, LOCAL_RANK and WORLD_SIZE) a process group, nccl on GPUs, gloo on CPU cores, one device a
    process; else one process. The precision is resolved once (resolve_dtype): process 0 says which
    and why."""
    cuda = torch.cuda.is_available()
    rank, local_rank, world_size = 0, 0, 1
    if "RANK" in os.environ:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 runs on the GPU's tensor cores
    torch.backends.cudnn.allow_tf32 = True
    dtype = resolve_dtype(dtype_choice, device, warn=rank == 0)
    return Processes(rank, local_rank, world_size, device, dtype)


def compiled(model, run):
    """What a training step calls: the model, or torch.compiled (the casts, adds, LayerNorms and
    GELUs between the matmuls fuse; steps vary in length, hence dynamic), and with --cudagraphs each
    length's kernels replayed as one graph."""
    if not run.compile:
        return model
    mode = "reduce-overhead" if run.cudagraphs else None
    return torch.compile(model, dynamic=True, mode=mode)


def hold_frozen_linears(model: torch.nn.Module, dtype: str) -> None:
    """Under 'bf16', the encoder's frozen linear layers held in bf16. bf16 autocast recasts a frozen
    weight at every call (it caches only weights that train), in every step and every scoring
    batch; cast once instead, to the same values, the results are bit-identical. The NSP head
    stays as it is: it runs in fp32."""
    if dtype != "bf16":
        return
    for m in model.bert.layers.modules():
        if isinstance(m, torch.nn.Linear) and not any(p.requires_grad for p in m.parameters()):
            m.to(torch.bfloat16)
