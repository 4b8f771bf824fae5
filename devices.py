"""Where the work runs: the device and its autocast precision, torchrun's processes, and
torch.compile. Imports nothing of the project."""
import os
import shutil
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


def resolve_dtype(choice, device):
    """'auto' | 'fp32' | 'bf16' -> 'fp32' | 'bf16'; auto = bf16 on CUDA and on CPUs with native
    bf16, else fp32."""
    if choice not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {choice!r}")
    if choice != "auto":
        return choice
    if torch.device(device).type == "cuda" or cpu_has_native_bf16():
        return "bf16"
    return "fp32"


def to_device(t, device):
    """A CPU tensor on the device; to a GPU through pinned memory, so the copy does not wait for the
    GPU's queue: the CPU goes on building the next batch while the GPU runs this one."""
    device = torch.device(device)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def autocast(dtype, device):
    """The autocast context for a resolved dtype; fp32 switches autocast off explicitly (also an
    outer one)."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == "bf16")


def init_distributed(dtype_choice):
    """(ddp_rank, ddp_local_rank, world_size, device, dtype): a process group under torchrun (nccl
    on GPU, gloo on CPU), else one process; dtype is the resolved autocast precision."""
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
    dtype = resolve_dtype(dtype_choice, device)
    # measured: emulated bf16 is ~100x slower than fp32
    if dtype == "bf16" and not cuda and not cpu_has_native_bf16() and ddp_rank == 0:
        print("warning: this CPU has no native bf16 (AVX512_BF16/AMX): --dtype bf16 is emulated "
              "and far slower than fp32 (--dtype auto picks fp32 here)", file=sys.stderr)
    return ddp_rank, ddp_local_rank, world_size, device, dtype


def check_compiler(compile, device):
    """torch.compile on a CPU builds C++ kernels: without a compiler, one line before the model
    loads."""
    if compile and device.type == "cpu" and not shutil.which(os.environ.get("CXX", "g++")):
        raise SystemExit("error: --compile on CPU needs a C++ compiler (g++, or $CXX): none found")


def compiled(model, run):
    """What a training step calls: the model, or torch.compiled (the casts, adds, LayerNorms and
    GELUs between the matmuls fuse; steps vary in length, hence dynamic), and with --cudagraphs each
    length's kernels replayed as one graph."""
    if not run.compile:
        return model
    mode = "reduce-overhead" if run.cudagraphs else None
    return torch.compile(model, dynamic=True, mode=mode)
