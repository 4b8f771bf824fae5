"""Where the work runs: the autocast precision a CPU or GPU gets, evaluate.py's torchrun processes,
and torch.compile. Imports nothing of the project."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

# autocast precisions: weights, optimizer state, loss and NSP head stay fp32
DTYPES = ("auto", "fp32", "bf16")


def cpu_has_native_bf16(cpuinfo="/proc/cpuinfo"):
    """True where the CPU has bf16 dot products (AVX512_BF16, AMX), ~3x fp32's speed; elsewhere bf16
    is slower."""
    try:
        return not {"avx512_bf16", "amx_bf16"}.isdisjoint(Path(cpuinfo).read_text().split())
    except OSError:
        return False


def resolve_dtype(choice, device, warn=False):
    """'auto' | 'fp32' | 'bf16' -> 'fp32' | 'bf16'; auto = bf16 on CUDA and on CPUs with native
    bf16, else fp32. warn: say so on stderr where bf16 is asked of a CPU that only emulates it."""
    if choice not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {choice!r}")
    native = torch.device(device).type == "cuda" or cpu_has_native_bf16()
    # measured: emulated bf16 is ~100x slower than fp32
    if choice == "bf16" and not native and warn:
        print("warning: this CPU has no native bf16 (AVX512_BF16/AMX): --dtype bf16 is emulated "
              "and far slower than fp32 (--dtype auto picks fp32 here)", file=sys.stderr)
    if choice != "auto":
        return choice
    return "bf16" if native else "fp32"


def init_distributed(dtype_choice):
    """evaluate.py's processes (train.py sets its own up in plain sight): (ddp_rank,
    ddp_local_rank, world_size, device, dtype), a process group under torchrun (nccl on GPU, gloo on
    CPU), else one process; dtype is the resolved autocast precision."""
    cuda = torch.cuda.is_available()
    ddp_rank, ddp_local_rank, world_size = 0, 0, 1
    if "RANK" in os.environ:
        ddp_local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if cuda:
            torch.cuda.set_device(ddp_local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
        ddp_rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{ddp_local_rank}" if cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 runs on the GPU's tensor cores
    torch.backends.cudnn.allow_tf32 = True
    dtype = resolve_dtype(dtype_choice, device, warn=ddp_rank == 0)
    return ddp_rank, ddp_local_rank, world_size, device, dtype


def compiled(model, run):
    """What a training step calls: the model, or torch.compiled (the casts, adds, LayerNorms and
    GELUs between the matmuls fuse; steps vary in length, hence dynamic), and with --cudagraphs each
    length's kernels replayed as one graph."""
    if not run.compile:
        return model
    mode = "reduce-overhead" if run.cudagraphs else None
    return torch.compile(model, dynamic=True, mode=mode)
