"""Diagnostic (prints figures; not a test): how far bf16 autocast moves PALT's gradients, against the noise of SGD.

One training step's gradient of every trainable tensor, computed twice on the same batch (fp32, then bf16
autocast) and once in fp32 on another batch of the same size. If bf16 changed what training learns, the
same-batch gap would come near the batch-to-batch gap; if it is far smaller, bf16 acts like (much less) extra
minibatch noise. Unless the error is systematic: the last column compares the bf16 error (bf16 - fp32 gradient)
of the two batches; errors that point the same way on different batches add up over the steps instead of
averaging out. Dropout is off so that only the arithmetic differs. The batch is train.py's: 32 train positives + their 1+1+1 negatives, prompts 2,0,0.

    python bench/bench_precision.py                         # the shipped umls adapter, and a fresh PALT
    python bench/bench_precision.py --ckpt runs/umls-minilm-clean --trials 5
"""
import argparse, sys
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bert, data, palt  # noqa: E402
from support import checkpoints, files, graphs  # noqa: E402


def forward(model, batch, dtype):
    with bert.autocast(dtype, "cpu"):
        return model(**batch)


def step_grads(model, batch, labels, dtype):
    model.zero_grad(set_to_none=True)
    F.cross_entropy(forward(model, batch, dtype).float(), labels).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad and p.grad is not None]).double()


def compare(name, model, prompts, tokenizer, args):
    model.eval()  # dropout off: the two precisions see the same function
    kg = graphs.load_kg("umls", args.data_dir)
    enc = data.encode(kg, tokenizer)
    neg = data.NegativeSampler(kg, 1, 1, 1, seed=42).negatives(0)
    rng = np.random.default_rng(0)
    labels = torch.cat([torch.zeros(32), torch.ones(96)]).long()
    cos = lambda x, y: float(x @ y / (x.norm() * y.norm()))
    print(f"{name}")
    print(f"  {'trial':>5} {'bf16~fp32 cos':>14} {'bf16 rel. error':>16} {'batch~batch cos (fp32)':>23} {'max |margin| diff':>18} {'error~error cos':>16}")
    for trial in range(args.trials):
        a, b = (rng.choice(len(kg.train), 32, replace=False) for _ in range(2))
        batch = lambda idx: data.build_batch(enc, np.concatenate([kg.train[idx], neg[idx].reshape(-1, 3)]), prompts, 192)
        g32, g16, other, other16 = (step_grads(model, batch(i), labels, d)
                                    for i, d in ((a, "fp32"), (a, "bf16"), (b, "fp32"), (b, "bf16")))
        with torch.inference_mode():
            margins = {d: palt.score(forward(model, batch(a), d)) for d in ("fp32", "bf16")}
        print(f"  {trial:5} {cos(g16, g32):14.5f} {float((g16 - g32).norm() / g32.norm()):16.4f} {cos(other, g32):23.4f} "
              f"{float((margins['bf16'] - margins['fp32']).abs().max()):18.4f} {cos(g16 - g32, other16 - other):16.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=str(files.ROOT / "weights" / "palt-umls-minilm.safetensors"),
                    help="a umls checkpoint or run folder (default: the shipped adapter)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--data-dir", help="default $PALT_DATA, else ./data")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    fresh, loaded = palt.build_palt("minilm", palt.PaltConfig(prompts=(2, 0, 0)))
    compare("fresh PALT (zero calibration, random NSP head), prompts 2,0,0", fresh, (2, 0, 0), loaded.tokenizer, args)
    ckpt = checkpoints.checkpoint_file(args.ckpt)
    model, meta, loaded = checkpoints.load_checkpoint(ckpt)
    compare(f"trained: {ckpt}", model, tuple(meta["prompts"]), loaded.tokenizer, args)


if __name__ == "__main__":
    main()
