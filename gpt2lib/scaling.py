"""Training at scale: one loop that runs in one process or under torchrun (chapter 11).

    python -m gpt2lib prepare data/tinyshakespeare.txt data/shakespeare.bin --val-fraction 0.1
    python -m gpt2lib train --data data/shakespeare.bin --val-data data/shakespeare.val.bin \\
        --n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 8 --steps 200 --out run
    torchrun --nproc_per_node=8 -m gpt2lib train --data ... --out run      # 8 GPUs, DDP + NCCL

From Python (notebooks): `gpt2lib.pretrain(data=..., out=..., n_layer=..., ...)`, the same
settings as the flags with `_` for `-` (TrainSettings lists them). It lives here, not in
gpt2lib.training, because training.py is chapter 7's generated module and must not import
this later, hand-written one; `from gpt2lib import pretrain` is its public name.

The loop reuses chapter 7's pieces (gpt2lib.training: lm_loss, lr_schedule, make_optimizer
with its decay_groups, get_batch's windows) and adds what several processes need:

- DDP: every process (rank) holds the whole model, computes gradients on its own part of the
  global batch, and DDP averages the gradients across ranks during backward, so every rank
  takes the same optimizer step. Gloo on CPU, NCCL on CUDA.
- gradient accumulation: K micro-steps per optimizer step, each loss divided by K; DDP's
  `no_sync` skips the all-reduce on all but the last micro-step.
- the windows of step s are drawn from a generator seeded by (seed, s) for the whole global
  batch (batch_size x grad_accum x world size); rank r takes its slice. So a step sees the
  same windows however they are split among processes and micro-steps, and a resumed run
  sees the same windows as an uninterrupted one.
- bf16 autocast and TF32 on CUDA, torch.compile as an option, fused AdamW on CUDA, the
  vocabulary padded to a multiple of 64 as an option (50,257 -> 50,304).
- rank 0 writes DIR/log.jsonl (one line per optimizer step: step, loss, lr, tokens_per_s,
  mfu) and the checkpoints; DIR/checkpoint.pt holds model, optimizer, step, every rank's RNG
  state and the data position, written beside and renamed into place.

Several machines: torchrun's own rendezvous, nothing here changes. On every node:

    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=R --rdzv_backend=c10d \\
        --rdzv_endpoint=HOST:29500 --rdzv_id=myrun -m gpt2lib train ...

(or --master_addr/--master_port with --node_rank), and every node must see the same token
files and --out folder paths (rank 0 alone writes).

Written by hand (not generated from a notebook).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from gpt2lib.files import atomic_write

CHECKPOINT_FILE = "checkpoint.pt"
LOG_FILE = "log.jsonl"
RUN_FILE = "run.json"
CHECKPOINT_FORMAT = "gpt2lib-training-checkpoint"
# fields of the settings that make the model a different size: a checkpoint must match them
MODEL_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "pad_vocab")
# fields that change which windows or updates a step makes: a resumed run must keep them
RUN_FIELDS = ("seed", "lr", "min_lr", "warmup_steps", "weight_decay", "max_grad_norm", "steps")
# dense bf16 tensor-core peaks (FLOP/s) of common GPUs, from their data sheets; others are
# measured with a matrix multiply
GPU_PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


class TrainingSetupError(ValueError):
    """Settings, files or a checkpoint that cannot make a run; raised before any step."""


@dataclass
class TrainSettings:
    """Everything `python -m gpt2lib train` takes; the flags are these names with - for _."""

    data: str  # training token file (python -m gpt2lib prepare)
    out: str  # folder: log.jsonl, checkpoint.pt, and at the end config.json + model.safetensors
    val_data: str | None = None  # validation token file
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024  # tokens per window; also the model's n_positions
    batch_size: int = 8  # windows per process per micro-step
    grad_accum: int = 1  # micro-steps per optimizer step
    global_batch: int | None = None  # windows per optimizer step; sets grad_accum when given
    steps: int = 100  # optimizer steps
    lr: float = 6e-4  # peak learning rate
    min_lr: float | None = None  # the cosine's floor (default lr / 10)
    warmup_steps: int | None = None  # default 5% of the steps, at least 1
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 0
    resume: bool = False  # continue from DIR/checkpoint.pt
    log_file: str | None = None  # default DIR/log.jsonl
    checkpoint_every: int = 0  # steps between checkpoints; 0: only at the end
    eval_every: int = 0  # steps between validation estimates; 0: only at the end
    eval_batches: int = 4  # batches per validation estimate (per process)
    dtype: str | None = None  # autocast: float32 or bfloat16 (default bf16 on CUDA that has it)
    compile: bool = False  # torch.compile the model
    device: str | None = None  # cpu, cuda, mps (default: cuda:LOCAL_RANK when there is CUDA)
    dropout: float = 0.0
    pad_vocab: bool = False  # vocab_size rounded up to a multiple of 64 (50,304)
    peak_tflops: float | None = None  # the device's peak for MFU (default: table or measured)
    progress: bool = True  # a progress bar on rank 0

    def run_dict(self):
        return {k: v for k, v in asdict(self).items() if k in RUN_FIELDS}


# --------------------------------------------------------------------------- settings


def _settings(values: dict) -> TrainSettings:
    known = {f.name for f in fields(TrainSettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TrainingSetupError(
            f"unknown training setting(s) {', '.join(unknown)}; the "
            f"settings are: {', '.join(sorted(known))}"
        )
    for name in ("data", "out"):
        if not values.get(name):
            raise TrainingSetupError(f"the setting {name!r} is required (--{name})")
    s = TrainSettings(**values)
    for name in ("data", "out", "val_data", "log_file"):  # paths given as Path objects too
        if getattr(s, name) is not None:
            setattr(s, name, os.fspath(getattr(s, name)))
    for name in (
        "n_layer",
        "n_head",
        "n_embd",
        "block_size",
        "batch_size",
        "grad_accum",
        "steps",
        "eval_batches",
    ):
        _whole(name, getattr(s, name), 1)
    for name in ("seed", "checkpoint_every", "eval_every"):
        _whole(name, getattr(s, name), 0)
    if s.global_batch is not None:
        _whole("global_batch", s.global_batch, 1)
    if s.warmup_steps is not None:
        _whole("warmup_steps", s.warmup_steps, 0)
    if s.n_embd % s.n_head:
        raise TrainingSetupError(
            f"--n-embd ({s.n_embd}) must be divisible by --n-head ({s.n_head})"
        )
    if not (isinstance(s.lr, (int, float)) and s.lr > 0 and math.isfinite(s.lr)):
        raise TrainingSetupError(f"--lr must be a positive number, got {s.lr!r}")
    s.min_lr = s.lr / 10 if s.min_lr is None else s.min_lr
    s.warmup_steps = max(1, s.steps // 20) if s.warmup_steps is None else s.warmup_steps
    if not 0 <= s.min_lr <= s.lr:
        raise TrainingSetupError(f"need 0 <= min_lr <= lr, got min_lr={s.min_lr}, lr={s.lr}")
    if not 0 <= s.dropout < 1:
        raise TrainingSetupError(f"--dropout must be in [0, 1), got {s.dropout}")
    if s.dtype not in (None, "float32", "bfloat16"):
        raise TrainingSetupError(
            f"--dtype must be float32 or bfloat16 (autocast), got {s.dtype!r}; float16 would "
            "need a gradient scaler, and bfloat16 does the same job without one"
        )
    return s


def _whole(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TrainingSetupError(
            f"--{name.replace('_', '-')} must be a whole number >= {minimum}, got {value!r}"
        )


def load_config_file(path) -> dict:
    """A small config file (JSON or TOML) of settings; keys as the flags, - or _ alike."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {str(path)!r}")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            import tomllib

            values = tomllib.loads(text)
        else:
            values = json.loads(text)
    except ValueError as exc:
        raise TrainingSetupError(
            f"{str(path)!r} is not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {exc}"
        ) from None
    if not isinstance(values, dict):
        raise TrainingSetupError(f"{str(path)!r} must hold one table/object of settings")
    return {k.replace("-", "_"): v for k, v in values.items()}


# --------------------------------------------------------------------------- the pieces


@dataclass
class Ranks:
    """Who this process is: rank, world size and local rank, from torchrun's variables."""

    rank: int = 0
    world: int = 1
    local: int = 0

    @classmethod
    def from_env(cls):
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))


def step_starts(seed: int, step: int, global_batch: int, n_tokens: int, block_size: int):
    """The window starts of one optimizer step, (global_batch,): they depend only on these.

    Drawn as gpt2lib.training.get_batch draws them (torch.randint over len - block_size),
    from a generator seeded by (seed, step), so any step can be recreated on its own.
    """
    state = np.random.SeedSequence([seed, step]).generate_state(2, np.uint32)
    generator = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    return torch.randint(n_tokens - block_size, (global_batch,), generator=generator)


def rank_slice(starts, ranks: Ranks, batch_size: int, grad_accum: int):
    """This rank's starts, split into grad_accum micro-batches of batch_size. -> list."""
    per_rank = batch_size * grad_accum
    mine = starts[ranks.rank * per_rank : (ranks.rank + 1) * per_rank]
    return [mine[k * batch_size : (k + 1) * batch_size] for k in range(grad_accum)]


def flops_per_token(model, block_size: int) -> float:
    """Training FLOPs per token: 6 x parameters (forward 2, backward 4) + attention's scores.

    The parameters leave out the position table (a lookup, no multiply); the readout shares
    wte and counts once. Attention adds 12 x n_layer x block_size x n_embd (PaLM's formula).
    """
    c = model.config
    params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * params + 12 * c.n_layer * block_size * c.n_embd


def device_peak_flops(device: torch.device, dtype, measure_seconds: float = 0.3):
    """(peak FLOP/s of one device, where the number comes from): a data sheet or a measurement."""
    if device.type == "cuda" and dtype == torch.bfloat16:
        name = torch.cuda.get_device_name(device)
        for key, peak in GPU_PEAK_BF16.items():
            if key in name:
                return peak, f"data sheet ({key}, dense bf16)"
    size = 2048 if device.type == "cuda" else 256
    generator = torch.Generator(device).manual_seed(0)  # leaves the global streams alone
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    best, deadline = 0.0, time.perf_counter() + measure_seconds
    while time.perf_counter() < deadline:
        _sync(device)
        began = time.perf_counter()
        for _ in range(4):
            a @ a
        _sync(device)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - began))
    return best, f"measured ({size}x{size} {str(dtype).removeprefix('torch.')} matmul)"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pick_device(s: TrainSettings, ranks: Ranks) -> torch.device:
    if s.device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", ranks.local)
        return torch.device("cpu")
    device = torch.device(s.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TrainingSetupError("--device cuda, but this PyTorch sees no CUDA GPU")
        if device.index is None:
            device = torch.device("cuda", ranks.local)
    return device


def _autocast_dtype(s: TrainSettings, device):
    if s.dtype is None:
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, s.dtype)


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    """vocab_size rounded up to a multiple (50,257 -> 50,304): friendlier matrix shapes."""
    return -(-vocab_size // multiple) * multiple


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(path, state: dict) -> Path:
    """torch.save beside the target, fsync, then rename: a crash leaves the old one whole."""
    return atomic_write(path, lambda file: torch.save(state, file))


def load_checkpoint(path) -> dict:
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same advice
        raise TrainingSetupError(
            f"{str(path)!r} cannot be read as a training checkpoint ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise TrainingSetupError(f"{str(path)!r} is not a gpt2lib training checkpoint")
    return state


def _check_resumable(state, s: TrainSettings, global_batch: int, path):
    size = {k: getattr(s, k) for k in MODEL_FIELDS}
    if state["model_size"] != size:
        raise TrainingSetupError(
            f"the checkpoint {str(path)!r} is of another model size: it has "
            f"{_fmt(state['model_size'])}, the flags ask for {_fmt(size)}. Give the run's "
            "own flags to resume it, or another --out for a new run"
        )
    changed = {k: (state["run"][k], v) for k, v in s.run_dict().items() if state["run"][k] != v}
    if state["global_batch"] != global_batch:
        changed["global batch (batch-size x grad-accum x processes)"] = (
            state["global_batch"],
            global_batch,
        )
    if changed:
        listed = "; ".join(
            f"{k}: {a!r} in the checkpoint, {b!r} now" for k, (a, b) in changed.items()
        )
        raise TrainingSetupError(
            f"--resume continues the same run, but these settings "
            f"differ from the checkpoint's: {listed}"
        )
    if state["step"] > s.steps:
        raise TrainingSetupError(
            f"the checkpoint is at step {state['step']}, beyond --steps {s.steps}"
        )


def _fmt(d):
    return ", ".join(f"{k}={v}" for k, v in d.items())


def _rng_state(device):
    import random

    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def _set_rng_state(state, device):
    import random

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def _rewrite_log(path: Path, before_step: int):
    """Keep the log lines of steps before `before_step` (the resumed run writes the rest)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] < before_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            break  # a line cut short by the crash, and everything after it
    atomic_write(path, "".join(k + "\n" for k in kept))


# --------------------------------------------------------------------------- the run


def pretrain(**settings) -> dict:
    """Train a GPT-2 from token files, in this process or as one rank under torchrun.

    Takes the settings of TrainSettings (the flags of `python -m gpt2lib train`, `_` for
    `-`). Every check on the settings, the token files and a checkpoint to resume runs
    before the first step, and a failure raises TrainingSetupError (a ValueError) naming the
    problem. Returns a summary: the final step's loss, the last validation loss, where the
    log, checkpoint and model were written.
    """
    s = _settings(settings)
    from gpt2lib.chapters.config import GPT2Config
    from gpt2lib.tokenfile import VOCAB_SIZE, open_tokens

    ranks = Ranks.from_env()
    device = _pick_device(s, ranks)
    per_step = s.batch_size * ranks.world  # windows per micro-step, all ranks together
    if s.global_batch is not None:
        if s.global_batch % per_step:
            raise TrainingSetupError(
                f"--global-batch {s.global_batch} is not a whole number of micro-batches: "
                f"{ranks.world} process(es) x --batch-size {s.batch_size} = {per_step} windows "
                f"per micro-step does not divide it; choose a global batch that is a multiple "
                f"of {per_step}, or another --batch-size"
            )
        accum = s.global_batch // per_step
        if "grad_accum" in settings and settings["grad_accum"] != accum:
            raise TrainingSetupError(
                f"--grad-accum {s.grad_accum} contradicts --global-batch {s.global_batch} "
                f"= {accum} micro-steps x {per_step} windows; give one of the two"
            )
        s.grad_accum = accum
    global_batch = per_step * s.grad_accum

    train_ids = open_tokens(s.data, vocab_size=VOCAB_SIZE)
    val_ids = open_tokens(s.val_data, vocab_size=VOCAB_SIZE) if s.val_data else None
    for name, ids in (("--data", train_ids), ("--val-data", val_ids)):
        if ids is not None and len(ids) < s.block_size + 1:
            raise TrainingSetupError(
                f"{name} holds {len(ids)} tokens, fewer than --block-size + 1 = {s.block_size + 1}"
            )
    out = Path(s.out)
    checkpoint_path = out / CHECKPOINT_FILE
    log_path = Path(s.log_file) if s.log_file else out / LOG_FILE
    state = None
    if s.resume:
        if not checkpoint_path.exists():
            raise TrainingSetupError(
                f"--resume, but {str(out)!r} holds no {CHECKPOINT_FILE} to continue from"
            )
        state = load_checkpoint(checkpoint_path)
        _check_resumable(state, s, global_batch, checkpoint_path)
    elif checkpoint_path.exists() or (out / "model.safetensors").exists():
        raise TrainingSetupError(
            f"{str(out)!r} already holds a run; pass --resume to continue "
            "it, or choose another --out (nothing was changed)"
        )
    vocab = padded_vocab(VOCAB_SIZE) if s.pad_vocab else VOCAB_SIZE
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=s.block_size,
        n_embd=s.n_embd,
        n_layer=s.n_layer,
        n_head=s.n_head,
        embd_pdrop=s.dropout,
        attn_pdrop=s.dropout,
        resid_pdrop=s.dropout,
    )
    return _run(
        s, ranks, device, config, train_ids, val_ids, state, global_batch, checkpoint_path, log_path
    )


def _run(
    s, ranks, device, config, train_ids, val_ids, state, global_batch, checkpoint_path, log_path
):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpt2lib.chapters.model import GPT2
    from gpt2lib.chapters.training import make_optimizer
    from gpt2lib.tokenfile import windows
    from gpt2lib.training import lm_loss, lr_schedule

    distributed = ranks.world > 1
    if distributed:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # float32 matmuls on tensor cores
            torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(s.seed)  # the same initial weights on every rank
        raw = GPT2(config).to(device)
        optimizer = make_optimizer(raw, s.lr, s.weight_decay)  # fused AdamW on CUDA
        start = 0
        if state is not None:
            raw.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = state["step"]
        model = (
            DDP(raw, device_ids=[device.index] if device.type == "cuda" else None)
            if distributed
            else raw
        )
        if s.compile:
            model = torch.compile(model)
        dtype = _autocast_dtype(s, device)
        autocast = (
            torch.autocast(device.type, dtype=dtype)
            if dtype != torch.float32
            else contextlib.nullcontext()
        )
        flops_token = flops_per_token(raw, s.block_size)
        peak, peak_source = (
            (s.peak_tflops * 1e12, "given (--peak-tflops)")
            if s.peak_tflops
            else device_peak_flops(device, dtype)
        )
        tokens_per_step = global_batch * s.block_size
        log = None
        if ranks.rank == 0:
            checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            if state is not None:
                _rewrite_log(log_path, start)
            elif log_path.exists():
                log_path.unlink()  # a log left by an earlier run in a fresh --out
            info = {
                "settings": asdict(s),
                "world_size": ranks.world,
                "device": str(device),
                "autocast": str(dtype),
                "compile": s.compile,
                "global_batch": global_batch,
                "tokens_per_step": tokens_per_step,
                "vocab_size": config.vocab_size,
                "parameters": sum(p.numel() for p in raw.parameters()),
                "flops_per_token": flops_token,
                "peak_flops_per_device": peak,
                "peak_source": peak_source,
                "fused_adamw": bool(optimizer.defaults.get("fused")),
            }
            (checkpoint_path.parent / RUN_FILE).write_text(
                json.dumps(info, indent=2) + "\n", encoding="utf-8"
            )
            log = open(log_path, "a", encoding="utf-8")
        bar = _bar(s.steps, start) if (ranks.rank == 0 and s.progress) else None

        def reduce_mean(value):
            value = value.detach().float().reshape(1)
            if distributed:
                value = value.to(device)
                dist.all_reduce(value)  # SUM: gloo has no AVG
                value = value / ranks.world
            return float(value)

        @torch.no_grad()
        def estimate_val():
            raw.eval()
            total = torch.zeros((), device=device)
            for b in range(s.eval_batches):
                starts = step_starts(
                    s.seed + 10_000, b, s.batch_size * ranks.world, len(val_ids), s.block_size
                )
                mine = rank_slice(starts, ranks, s.batch_size, 1)[0]
                x, y = (t.to(device) for t in windows(val_ids, mine, s.block_size))
                with autocast:
                    total += lm_loss(raw(x), y)
            raw.train()
            return reduce_mean(total / s.eval_batches)

        def checkpoint(next_step):
            rng = _rng_state(device)
            rngs = [None] * ranks.world
            if distributed:
                dist.all_gather_object(rngs, rng)
            else:
                rngs = [rng]
            if ranks.rank == 0:
                save_checkpoint(
                    checkpoint_path,
                    {
                        "format": CHECKPOINT_FORMAT,
                        "version": 1,
                        "step": next_step,
                        "model": raw.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "model_size": {k: getattr(s, k) for k in MODEL_FIELDS},
                        "run": s.run_dict(),
                        "global_batch": global_batch,
                        "world_size": ranks.world,
                        "rng": rngs,
                        "data_position": {
                            "seed": s.seed,
                            "next_step": next_step,
                            "global_batch": global_batch,
                        },
                    },
                )
            if distributed:
                dist.barrier()

        raw.train()
        torch.manual_seed(s.seed + 1 + ranks.rank)  # dropout: its own stream on each rank
        if state is not None:  # restored last: nothing above may draw from these streams
            if state["world_size"] == ranks.world:
                _set_rng_state(state["rng"][ranks.rank], device)
            elif ranks.rank == 0:
                print(
                    f"note: the checkpoint was written by {state['world_size']} process(es), "
                    f"this run has {ranks.world}: the windows stay the same, the dropout "
                    "random streams start afresh",
                    file=sys.stderr,
                )
        loss = val_loss = None
        for step in range(start, s.steps):
            _sync(device)
            began = time.perf_counter()
            lr = lr_schedule(step, s.lr, s.warmup_steps, s.steps, s.min_lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            micro = rank_slice(
                step_starts(s.seed, step, global_batch, len(train_ids), s.block_size),
                ranks,
                s.batch_size,
                s.grad_accum,
            )
            step_loss = torch.zeros((), device=device)
            for k, starts in enumerate(micro):
                x, y = (
                    t.to(device, non_blocking=True)
                    for t in windows(train_ids, starts, s.block_size)
                )
                last = k == s.grad_accum - 1
                sync = contextlib.nullcontext() if (last or not distributed) else model.no_sync()
                with sync:
                    with autocast:
                        micro_loss = lm_loss(model(x), y) / s.grad_accum  # (,)
                    micro_loss.backward()  # the last micro-step's backward all-reduces
                step_loss += micro_loss.detach()
            torch.nn.utils.clip_grad_norm_(raw.parameters(), s.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss = reduce_mean(step_loss)  # the mean over the whole global batch
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"the training loss became {loss} at step {step} (learning rate {lr:.3g}); "
                    f"training stopped. Lower --lr (try {s.lr / 3:.2g})"
                )
            _sync(device)
            seconds = time.perf_counter() - began
            line = {
                "step": step,
                "loss": loss,
                "lr": lr,
                "tokens_per_s": tokens_per_step / seconds,
                "mfu": flops_token * tokens_per_step / seconds / (peak * ranks.world),
            }
            done = step + 1
            if val_ids is not None and (
                (s.eval_every and done % s.eval_every == 0) or done == s.steps
            ):
                val_loss = line["val_loss"] = estimate_val()
            if log is not None:
                log.write(json.dumps(line) + "\n")
                log.flush()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    loss=f"{loss:.4f}",
                    lr=f"{lr:.2e}",
                    tok_s=f"{line['tokens_per_s']:,.0f}",
                    mfu=f"{line['mfu']:.1%}",
                )
            if (s.checkpoint_every and done % s.checkpoint_every == 0) or done == s.steps:
                checkpoint(done)
        if bar is not None:
            bar.close()
        if log is not None:
            log.close()
        model_dir = None
        if ranks.rank == 0:
            model_dir = str(_save_final(raw, config, checkpoint_path.parent))
        if distributed:
            dist.barrier()
        return {
            "steps": s.steps,
            "loss": loss,
            "val_loss": val_loss,
            "log": str(log_path),
            "checkpoint": str(checkpoint_path),
            "model": model_dir,
            "world_size": ranks.world,
            "global_batch": global_batch,
        }
    finally:
        if distributed and dist.is_initialized():
            dist.destroy_process_group()


def _save_final(raw, config, folder):
    """config.json + model.safetensors (the hub's layout), the vocabulary cut back to GPT-2's."""
    from dataclasses import replace

    from gpt2lib.chapters.model import GPT2
    from gpt2lib.checkpoint import save_pretrained
    from gpt2lib.tokenfile import VOCAB_SIZE

    model = raw
    if config.vocab_size != VOCAB_SIZE:  # the padded rows are never a target: drop them
        with torch.device("meta"):
            model = GPT2(replace(config, vocab_size=VOCAB_SIZE))
        weights = {k: v.detach().cpu() for k, v in raw.state_dict().items()}
        weights["wte.weight"] = weights["wte.weight"][:VOCAB_SIZE]
        model.load_state_dict(weights, assign=True)
    return save_pretrained(model, folder, overwrite=True)


def _bar(total, done):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=done, desc="training", unit="step", file=sys.stderr)


# --------------------------------------------------------------------------- the CLI


TRAIN_EPILOG = """\
Several processes: torchrun --nproc_per_node=N -m gpt2lib train ... (gloo on CPU, NCCL on
CUDA). Several machines, torchrun's rendezvous, on every node:
  torchrun --nnodes=2 --nproc_per_node=8 --node_rank=R --rdzv_backend=c10d \\
      --rdzv_endpoint=HOST:29500 --rdzv_id=RUN -m gpt2lib train ...
The windows of a step depend only on --seed, the step and the global batch
(--batch-size x --grad-accum x processes). A --config FILE (JSON or TOML, keys as the flags)
gives defaults; flags on the command line win.
"""


def add_subcommands(sub):
    """Add `prepare` and `train` to the CLI's subparsers (gpt2lib/cli.py calls this)."""
    import argparse

    from gpt2lib.tokenfile import val_path

    prep = sub.add_parser(
        "prepare",
        help="tokenize text into a token file for `train`",
        description="Tokenize INPUT (a text file, or a folder of .txt/.md "
        "files joined with <|endoftext|> between them) with GPT-2's tokenizer "
        "into OUT: a 1,024-byte header (vocabulary, count, source SHA-256) "
        "and uint16 ids.",
    )
    prep.add_argument("input", metavar="INPUT", help="a text file or a folder of text files")
    prep.add_argument("out", metavar="OUT", help="the token file to write")
    prep.add_argument(
        "--val-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="put the last F of the ids in a validation file beside OUT, named "
        f"with .val before the suffix (OUT=data/x.bin -> "
        f"{val_path('data/x.bin')}); default 0, no validation file",
    )
    prep.add_argument(
        "--processes",
        type=int,
        default=None,
        help="worker processes for tokenizing (default: CPU count, at most 8)",
    )

    S = argparse.SUPPRESS  # only flags given on the command line reach the settings
    tr = sub.add_parser(
        "train",
        help="train a GPT-2 from token files (single process or torchrun)",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=S,
    )
    add = tr.add_argument
    add("--config", help="a JSON or TOML file of settings (keys as the flags)")
    add("--data", help="training token file (python -m gpt2lib prepare)")
    add("--val-data", help="validation token file")
    add(
        "--out",
        help="run folder: log.jsonl, run.json, checkpoint.pt, and at the end "
        "config.json + model.safetensors",
    )
    for name, default in (("n-layer", 12), ("n-head", 12), ("n-embd", 768), ("block-size", 1024)):
        add(f"--{name}", type=int, help=f"default {default}")
    add("--batch-size", type=int, help="windows per process per micro-step (default 8)")
    add("--grad-accum", type=int, help="micro-steps per optimizer step (default 1)")
    add(
        "--global-batch",
        type=int,
        help="windows per optimizer step; sets --grad-accum, "
        "and must be a multiple of processes x --batch-size",
    )
    add("--steps", type=int, help="optimizer steps (default 100)")
    add("--lr", type=float, help="peak learning rate (default 6e-4)")
    add("--min-lr", type=float, help="the cosine's floor (default lr / 10)")
    add("--warmup-steps", type=int, help="linear warm-up steps (default 5%% of --steps)")
    add("--weight-decay", type=float, help="default 0.1")
    add("--seed", type=int, help="default 0")
    add(
        "--resume",
        action="store_true",
        help="continue from OUT/checkpoint.pt; it must be of the same model size and run settings",
    )
    add("--log-file", help="the JSONL log (default OUT/log.jsonl)")
    add(
        "--checkpoint-every",
        type=int,
        help="steps between checkpoints (default 0: only at the end)",
    )
    add("--eval-every", type=int, help="steps between validation estimates (default 0: at the end)")
    add(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="autocast dtype (default bfloat16 on a CUDA GPU that has it, else float32)",
    )
    add("--compile", action="store_true", help="torch.compile the model")
    add("--device", help="cpu, cuda or mps (default: cuda:LOCAL_RANK when CUDA is there)")
    add("--dropout", type=float, help="dropout probability (default 0)")
    add(
        "--pad-vocab",
        action="store_true",
        help="pad the vocabulary to a multiple of 64 "
        "(50,304); the saved model is cut back to 50,257",
    )
    add(
        "--peak-tflops",
        type=float,
        help="the device's peak for MFU (default: a data "
        "sheet for known GPUs, else a measured matmul)",
    )
    add("--no-progress", action="store_true", help="no progress bar")


def run_command(args) -> int:
    """Run `prepare` or `train` from parsed CLI arguments. -> exit code."""
    if args.command == "prepare":
        from gpt2lib.tokenfile import prepare

        summary = prepare(args.input, args.out, args.val_fraction, processes=args.processes)
        print(json.dumps(summary, indent=2))
        return 0
    values = vars(args).copy()
    values.pop("command")
    config = values.pop("config", None)
    settings = load_config_file(config) if config else {}
    if values.pop("no_progress", False):
        values["progress"] = False
    settings.update(values)
    summary = pretrain(**settings)
    if Ranks.from_env().rank == 0:
        print(json.dumps(summary, indent=2))
    return 0
