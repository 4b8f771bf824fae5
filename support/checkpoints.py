"""Files of a model and of a run: PALT checkpoints (the trainable tensors only, with their
metadata), train.py's run folder (ckpt, best, the resume state, log.txt) and what --resume checks
and restores."""
import json
from dataclasses import asdict, fields
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save

from bert import CheckpointError
from support import files
from support.files import OutputError, check_writable, in_project, readable, write_atomic
from support.flags import FALLBACKS, FlagError, Run
from support.hub import load_bert
from palt import PALT, PaltConfig

# settings that may change when a run resumes: where it writes and what it reports, not what it
# trains
RESUME_MAY_CHANGE = ("model", "data_dir", "out", "resume", "log_every", "dev_limit", "dev_sample",
                     "dev_every", "dev_near", "recipe", "compile", "cudagraphs", "patience")
META_KEYS = ("model", "weights_sha256", "data", "data_fingerprint", "text", "prompts",
             "max_seq_length", "palt")


# ----------------------------------------------------------------------------- checkpoint files
def stored_name(name):
    """A parameter's name in checkpoint and resume-state files. PALT's prompt vectors P and
    calibration maps W_c keep the names "prompts" and "calib.<layer>" they were first saved under,
    so that the shipped adapters and every run folder load as they are."""
    first, dot, rest = name.partition(".")
    return {"P": "prompts", "W_c": "calib"}.get(first, first) + dot + rest


def trainable_state(model):
    """{stored name: CPU tensor} of the parameters that train."""
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return {stored_name(n): p.detach().cpu() for n, p in trained}


def load_stored(model, tensors):
    """{stored name: tensor} into model's parameters of those names, strictly; the rest as is."""
    ours = {stored_name(n): n for n in model.state_dict()}
    state = model.state_dict() | {ours[k]: t for k, t in tensors.items()}
    model.load_state_dict(state, strict=True)


def palt_meta(model):
    """The PALT configuration as a checkpoint records it."""
    return asdict(model.cfg) | {"calib_layers": list(model.calib_layers)}


def save_atomic(path, tensors, meta):
    """tensors as safetensors with meta (JSON) in its metadata, written atomically."""
    tensors = {n: t.contiguous() for n, t in tensors.items()}
    blob = save(tensors, metadata={"meta": json.dumps(meta)})
    write_atomic(path, lambda f: f.write(blob))


def save_checkpoint(path, model, meta):
    """Trainable tensors as safetensors; config, base model identity and data fingerprint in the
    metadata."""
    meta = {"kind": "checkpoint", **meta, "palt": palt_meta(model)}
    save_atomic(path, trainable_state(model), meta)


def read_checkpoint(path, kind="checkpoint", tensors=True):
    """(tensors, meta) of a PALT checkpoint (kind 'checkpoint') or of train.py's resume state (kind
    'train-state'); tensors=False reads the metadata alone ({} for the tensors): the checks made
    before anything loads."""
    # missing or unreadable, in one line (safetensors says "not found" to both)
    name = readable(path, CheckpointError)
    try:
        with safe_open(name, framework="pt") as f:
            meta = json.loads((f.metadata() or {})["meta"])
            tensors = {k: f.get_tensor(k) for k in f.keys()} if tensors else {}
    except Exception as e:  # a truncated or foreign file: say so in one line
        raise CheckpointError(f"{path}: not a PALT {kind} ({type(e).__name__}: {e})") from None
    # checkpoints written before 'kind' existed are checkpoints
    if meta.get("kind", "checkpoint") != kind:
        hint = ""
        if meta.get("kind") == "train-state":
            hint = (" (train.py's resume state: give ckpt.safetensors, best.safetensors or the run "
                    "folder)")
        raise CheckpointError(f"{path}: a {meta.get('kind')}, not a PALT {kind}{hint}")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"{path}: not a PALT {kind} (its metadata lacks "
                              f"{', '.join(missing)})")
    return tensors, meta


def load_checkpoint(path, model=None):
    """(PALT, meta, LoadedBert): rebuild the base model, check it is the one trained on, fill the
    trainable tensors."""
    tensors, meta = read_checkpoint(path)
    loaded = load_bert(model or in_project(meta["model"]))
    if loaded.weights_sha256 != meta["weights_sha256"]:
        raise CheckpointError(f"{path}: trained on {meta['model']} (sha256 "
                              f"{meta['weights_sha256'][:12]}), but {loaded.path} has sha256 "
                              f"{loaded.weights_sha256[:12]}: wrong base model")
    c = meta["palt"]
    method = c.get("method", "finetune" if c.get("finetune") else "palt")  # older: a bool
    lora = {k: c[k] for k in ("lora_rank", "lora_alpha") if method == "lora"}
    cfg = PaltConfig(method=method, prompts=tuple(c["prompts"]),
                     calib_layers=tuple(c["calib_layers"]), prompt_encoder=c["prompt_encoder"],
                     prompt_mlp=c["prompt_mlp"], head_input=c.get("head_input", "cls"), **lora)
    palt = PALT(loaded.model, cfg, loaded.heads_to_train)
    expected = {n: tuple(t.shape) for n, t in trainable_state(palt).items()}
    got = {n: tuple(t.shape) for n, t in tensors.items()}
    if got != expected:
        diff = sorted(set(got.items()) ^ set(expected.items()))[:3]
        raise CheckpointError(f"{path}: tensors do not match this PALT configuration (e.g. {diff})")
    load_stored(palt, tensors)
    return palt, meta, loaded


def checkpoint_file(path):
    """--ckpt: a checkpoint file, or a run folder of train.py: its best.safetensors (best on dev),
    else its ckpt."""
    p = Path(path)
    if p.is_dir():
        found = [p / n for n in ("best.safetensors", "ckpt.safetensors") if (p / n).is_file()]
        if not found:
            raise FlagError(f"--ckpt {path}: a folder without best.safetensors or "
                            "ckpt.safetensors (give a run folder of train.py, or a checkpoint "
                            "file)")
        return found[0]
    if not p.exists():
        raise FlagError(f"--ckpt {path}: no such checkpoint file or run folder")
    return p


# ----------------------------------------------------------------------------- a run folder
def check_output(out, resume):
    """Before anything loads: --out is writable and no checkpoint is overwritten. The state's
    metadata if resuming."""
    state = out / "state.safetensors"
    check_writable(out, f"--out {out}")
    files.check_unlocked(out, "--out", "choose another --out")  # a run under way: say so first
    written = (out / "ckpt.safetensors", out / "best.safetensors", state)
    trained = [f.name for f in written if f.exists()]
    if trained and not resume:
        raise FlagError(f"{out}/{trained[0]} exists: --resume to continue it, or choose "
                        "another --out")
    # a checkpoint without its optimizer state cannot continue exactly: never guess
    if trained and not state.exists():
        raise FlagError(f"{out}/{trained[0]} exists but {state} does not, so the run "
                        "cannot continue exactly; nothing was changed: choose another --out")
    if not trained:
        return None
    return read_checkpoint(state, kind="train-state", tensors=False)[1]


def claim_output(out, resume, seen, master_process, ddp):
    """One run a folder: process 0 locks --out (files.lock_folder) before anything is written
    there, then looks again at what it holds: another run may have written it since check_output
    saw `seen`. Under torchrun every process learns whether process 0 got it; all end if not."""
    refused = None
    if master_process:
        try:
            files.lock_folder(out, "--out", "choose another --out")
            if check_output(out, resume) != seen:
                raise OutputError(f"another run wrote {out} while this one loaded; nothing "
                                  "was changed: run the command again")
        except (FlagError, OutputError) as e:
            refused = e
    if ddp:
        flag = torch.tensor([float(refused is not None)])
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag)
        if flag.item() and refused is None:
            raise OutputError(f"--out {out}: refused by process 0 (its message says why)")
    if refused is not None:
        raise refused


def check_resumable(saved, meta, state):
    """The resume state's own record of its run against this one: an exact replay needs the same
    settings, base weights, data files and resolved precision."""
    old, new = json.loads(saved["run"]), json.loads(meta["run"])
    # A setting added since the state was saved held its default then.
    defaults = {f.name: f.default for f in fields(Run)} | FALLBACKS
    defaults["method"] = "finetune" if old.get("finetune") else "palt"  # older: --finetune alone
    pairs = {k: (old.get(k, defaults.get(k)), new[k]) for k in new if k not in RESUME_MAY_CHANGE}
    for k in ("weights_sha256", "data_fingerprint", "dtype"):
        if k in meta:
            pairs[k] = (saved.get(k), meta[k])
    for k, (was, now) in pairs.items():
        if was != now:
            raise FlagError(f"{state} was trained with {k} {was}, not {now}: resume with "
                            "the same settings, or choose another --out")


def save_state(path, model, opt, params, meta):
    """The resume unit, one file: the trainable tensors and their AdamW moments."""
    moments = {}
    for n, p in params.items():
        for k, v in opt.state.get(p, {}).items():
            value = v.detach().cpu().reshape(-1) if k == "step" else v.detach().cpu()
            moments[f"{k}.{stored_name(n)}"] = value
    tensors = {f"model.{n}": t for n, t in trainable_state(model).items()}
    save_atomic(path, tensors | moments, meta | {"kind": "train-state"})


def save_run(out, model, opt, params, meta, names):
    """out/NAME.safetensors for NAME in names, state (to resume) last: a kill in between replays
    from the one before."""
    for name in names:
        try:
            if name == "state":
                save_state(out / "state.safetensors", model, opt, params, meta)
            else:
                save_checkpoint(out / f"{name}.safetensors", model, meta)
        except OSError as e:
            raise OutputError(f"cannot write {out / name}.safetensors ({e.strerror}); the "
                              "previous file is kept: fix that and run again with --resume to "
                              "continue from the last saved state") from None


def restore(saved, path, model, opt, params):
    """The run's history: a fresh one, or its resume state's, whose tensors and AdamW moments go
    into model and opt."""
    history = {"epoch": 0, "step": 0, "dev": [], "best_epoch": None, "best": None,
               "train_wall_s": 0.0}
    if not saved:
        return history
    tensors, _ = read_checkpoint(path, kind="train-state")
    got = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    names = {stored_name(n): n for n in params}
    if set(got) != set(names):
        raise CheckpointError(f"{path} holds other tensors than this model trains; choose "
                              "another --out")
    load_stored(model, {k: v.to(params[names[k]].device) for k, v in got.items()})
    for n, p in params.items():
        name = stored_name(n)
        if f"step.{name}" not in tensors:
            continue
        moments = {k: tensors[f"{k}.{name}"].to(p.device) for k in ("exp_avg", "exp_avg_sq")}
        # fused AdamW (on GPU) keeps its step count on the parameter's device, the others on the CPU
        step_device = p.device if opt.defaults.get("fused") else "cpu"
        step = tensors[f"step.{name}"].reshape(()).to(step_device)
        opt.state[p] = {"step": step, **moments}
    return {k: saved[k] for k in history}


#END
