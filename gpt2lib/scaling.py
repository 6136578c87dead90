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
  mfu) and the checkpoints; DIR/checkpoint.safetensors holds model, optimizer, step, every
  rank's RNG state, the data position and which token files were read, written beside and
  renamed into place. It is a safetensors file with the rest of the state as JSON in its
  metadata: resuming never unpickles anything, and every field is checked first.
- the run folder is locked while a run uses it (DIR/.gpt2lib-run.lock, through the filelock
  library; the lock goes with the process, kill -9 included): a second run in it is refused
  at once. A run never replaces a file it did not write (a --log-file of someone's notes, a
  --config inside DIR, a folder holding another run's model).
- every setting, token file and checkpoint is checked before the first step; a loss that
  becomes NaN or infinite stops the run, naming the step and the learning rate.

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

from gpt2lib.files import atomic_write, read_small_file, save_files
from gpt2lib.validation import check_real, check_whole

CHECKPOINT_FILE = "checkpoint.safetensors"
LEGACY_CHECKPOINT_FILE = "checkpoint.pt"  # earlier versions' pickles: never read
LOG_FILE = "log.jsonl"
RUN_FILE = "run.json"
LOCK_FILE = ".gpt2lib-run.lock"  # held while a run uses the folder
CHECKPOINT_FORMAT = "gpt2lib-training-checkpoint"
CHECKPOINT_VERSION = 2  # 1: the pickles of checkpoint.pt
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
    out: (
        str  # folder: log.jsonl, checkpoint.safetensors, at the end config.json + model.safetensors
    )
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
    max_grad_norm: float = 1.0  # gradient clipping; inf turns it off
    seed: int = 0
    resume: bool = False  # continue from DIR/checkpoint.safetensors
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
    # seconds a process waits for the others to join, and for any one collective (torchrun's
    # rendezvous waits 600 s for the nodes to join, NCCL 600 s for a collective)
    dist_timeout: float = 600.0

    def run_dict(self):
        return {k: v for k, v in asdict(self).items() if k in RUN_FIELDS}


# --------------------------------------------------------------------------- settings

# (name, smallest, largest) of the whole-number settings; None: no bound there
_WHOLE = {
    "n_layer": (1, 2**12),
    "n_head": (1, 2**12),
    "n_embd": (1, 2**16),
    "block_size": (1, 2**21),
    "batch_size": (1, None),
    "grad_accum": (1, None),
    "steps": (1, None),
    "eval_batches": (1, None),
    "seed": (0, 2**63 - 1),
    "checkpoint_every": (0, None),
    "eval_every": (0, None),
    "global_batch": (1, None),  # or None
    "warmup_steps": (0, None),  # or None
}
_OPTIONAL = ("global_batch", "warmup_steps", "min_lr", "peak_tflops", "val_data", "log_file")
_FLAGS = ("resume", "compile", "pad_vocab", "progress")
_PATHS = ("data", "out", "val_data", "log_file")


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _settings(values: dict) -> TrainSettings:
    """TrainSettings from `values`, every one checked (type and range) before any work;
    TrainingSetupError naming the flag otherwise."""
    known = {f.name for f in fields(TrainSettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TrainingSetupError(
            f"unknown training setting(s) {', '.join(unknown)}; the "
            f"settings are: {', '.join(sorted(known))}"
        )
    for name in ("data", "out"):
        if values.get(name) is None or values.get(name) == "":
            raise TrainingSetupError(f"the setting {name!r} is required (--{name})")
    s = TrainSettings(**values)
    try:
        for name in _PATHS:
            value = getattr(s, name)
            if value is None and name in _OPTIONAL:
                continue
            if not isinstance(value, (str, os.PathLike)):
                raise TypeError(
                    f"{_flag(name)} must be a path, got {value!r} ({type(value).__name__})"
                )
            text = os.fspath(value)
            if not isinstance(text, str) or not text.strip() or "\0" in text:
                raise ValueError(f"{_flag(name)} must be a non-empty text path, got {text!r}")
            setattr(s, name, text)
        for name, (low, high) in _WHOLE.items():
            value = getattr(s, name)
            if value is None and name in _OPTIONAL:
                continue
            setattr(s, name, check_whole(_flag(name), value, low, high))
        for name in _FLAGS:
            if not isinstance(getattr(s, name), bool):
                raise TypeError(
                    f"{_flag(name)} is a switch: true or false, got {getattr(s, name)!r} "
                    f"({type(getattr(s, name)).__name__})"
                )
        s.lr = check_real("--lr", s.lr, 0, low_inclusive=False, why=" (GPT-2 used 6e-4)")
        if s.min_lr is not None:
            s.min_lr = check_real("--min-lr", s.min_lr, 0)
        s.weight_decay = check_real(
            "--weight-decay", s.weight_decay, 0, why=" (0 turns weight decay off; 0.1 is usual)"
        )
        s.max_grad_norm = check_real(
            "--max-grad-norm",
            s.max_grad_norm,
            0,
            low_inclusive=False,
            allow_inf=True,
            why=" (the largest gradient norm kept by clipping; 1.0 is usual, inf turns it off; "
            "a negative norm would climb the loss and 0 would train nothing)",
        )
        s.dropout = check_real("--dropout", s.dropout, 0, 1, high_inclusive=False)
        if s.peak_tflops is not None:
            s.peak_tflops = check_real("--peak-tflops", s.peak_tflops, 0, low_inclusive=False)
        s.dist_timeout = check_real("--dist-timeout", s.dist_timeout, 0, low_inclusive=False)
        if s.device is not None and not isinstance(s.device, str):
            raise TypeError(f"--device must be a name such as cpu or cuda, got {s.device!r}")
    except (TypeError, ValueError) as exc:
        raise TrainingSetupError(str(exc)) from None
    if s.n_embd % s.n_head:
        raise TrainingSetupError(
            f"--n-embd ({s.n_embd}) must be divisible by --n-head ({s.n_head})"
        )
    s.min_lr = s.lr / 10 if s.min_lr is None else s.min_lr
    s.warmup_steps = max(1, s.steps // 20) if s.warmup_steps is None else s.warmup_steps
    if not s.min_lr <= s.lr:
        raise TrainingSetupError(f"need 0 <= min_lr <= lr, got min_lr={s.min_lr}, lr={s.lr}")
    if s.dtype not in (None, "float32", "bfloat16"):
        raise TrainingSetupError(
            f"--dtype must be float32 or bfloat16 (autocast), got {s.dtype!r}; float16 would "
            "need a gradient scaler, and bfloat16 does the same job without one"
        )
    return s


MAX_CONFIG_BYTES = 1 << 20  # a settings file is a few hundred bytes


def load_config_file(path) -> dict:
    """A small config file (JSON or TOML) of settings; keys as the flags, - or _ alike."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"--config must be a path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {str(path)!r}")
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    data = read_small_file(
        path,
        MAX_CONFIG_BYTES,
        TrainingSetupError,
        repr(str(path)),
        "a settings file is a few lines",
    )
    try:
        text = data.decode("utf-8")
        if kind == "TOML":
            import tomllib

            values = tomllib.loads(text)
        else:
            values = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and the parsers' errors
        raise TrainingSetupError(f"{str(path)!r} is not valid {kind}: {exc}") from None
    if not isinstance(values, dict):
        raise TrainingSetupError(f"{str(path)!r} must hold one table/object of settings")
    if not all(isinstance(k, str) for k in values):
        raise TrainingSetupError(f"{str(path)!r}: the settings' names must be text")
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
        """torchrun's WORLD_SIZE, RANK and LOCAL_RANK (1, 0, 0 when unset), checked."""

        def read(name, default, low, high=None):
            text = os.environ.get(name, default)
            hint = "; torchrun sets it (leave it unset for one process)"
            try:
                value = int(text)
            except ValueError:
                raise TrainingSetupError(
                    f"the environment variable {name}={text!r} is not a whole number{hint}"
                ) from None
            try:
                return check_whole(name, value, low, high)
            except ValueError as exc:
                raise TrainingSetupError(f"the environment variable {exc}{hint}") from None

        world = read("WORLD_SIZE", "1", 1)
        return cls(read("RANK", "0", 0, world - 1), world, read("LOCAL_RANK", "0", 0))


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
    try:
        device = torch.device(s.device)
    except (RuntimeError, ValueError):
        raise TrainingSetupError(
            f"unknown device {s.device!r}; use cpu, cuda, cuda:N or mps"
        ) from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise TrainingSetupError(f"--device {s.device!r} is not supported; use cpu, cuda or mps")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise TrainingSetupError("--device mps, but this PyTorch sees no Apple GPU (MPS)")
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
#
# A training checkpoint is one safetensors file: every tensor (the model's, the optimizer's,
# the random generators' states) by a plain name, and in the metadata the rest of the state as
# JSON, with {"__tensor__": name} where a tensor goes. Nothing is pickled, so a hostile file
# cannot run code when it is read (torch.load unpickles); the safetensors library refuses a
# truncated or damaged file, and every field is checked before the run uses it.

_METADATA_KEY = "gpt2lib.training"
_ARRAY_DTYPES = ("uint32", "int32", "int64", "float64")  # numpy arrays a state may hold
_MAX_METADATA_BYTES = 64 << 20  # the JSON part: settings, optimizer groups, RNG states (~50 KB)


def _flatten(value, tensors: dict, seen: dict, depth: int = 0):
    """A JSON-able tree of `value` ({"__tensor__": name} for each tensor, kept in `tensors`)."""
    if depth > 32:
        raise TypeError("the training state is nested too deeply to be saved")
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu")
        key = tensor.untyped_storage().data_ptr()
        if key in seen or not tensor.is_contiguous():  # safetensors wants its own memory
            tensor = tensor.contiguous().clone()
        seen[key] = True
        name = f"t{len(tensors)}"
        tensors[name] = tensor
        return {"__tensor__": name}
    if isinstance(value, np.ndarray):  # numpy's random state: uint32 keys
        if value.dtype.kind not in "iuf" or value.dtype.name not in _ARRAY_DTYPES:
            raise TypeError(f"a training checkpoint cannot hold a {value.dtype} array")
        name = f"t{len(tensors)}"
        wide = np.float64 if value.dtype.kind == "f" else np.int64  # holds every value exactly
        tensors[name] = torch.from_numpy(np.ascontiguousarray(value).astype(wide))
        return {"__ndarray__": name, "dtype": value.dtype.name}
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, tuple):
        return {"__tuple__": [_flatten(v, tensors, seen, depth + 1) for v in value]}
    if isinstance(value, list):
        return [_flatten(v, tensors, seen, depth + 1) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _flatten(v, tensors, seen, depth + 1) for k, v in value.items()}
        return {
            "__dict__": [
                [_flatten(k, tensors, seen, depth + 1), _flatten(v, tensors, seen, depth + 1)]
                for k, v in value.items()
            ]
        }
    raise TypeError(f"a training checkpoint cannot hold a {type(value).__name__}")


def _unflatten(tree, handle, where: str):
    """The value a _flatten tree stands for, tensors read from the open safetensors file."""
    names = set(handle.keys())

    def tensor(name):
        if not isinstance(name, str) or name not in names:
            raise TrainingSetupError(f"{where} names a tensor {name!r} that it does not hold")
        return handle.get_tensor(name)

    def build(node):
        if isinstance(node, list):
            return [build(v) for v in node]
        if not isinstance(node, dict):
            return node
        if "__tensor__" in node:
            return tensor(node["__tensor__"])
        if "__ndarray__" in node:
            dtype = node.get("dtype")
            if dtype not in _ARRAY_DTYPES:
                raise TrainingSetupError(f"{where} holds an array of unknown dtype {dtype!r}")
            return tensor(node["__ndarray__"]).numpy().astype(dtype)
        if "__float__" in node:
            if node["__float__"] not in ("nan", "inf", "-inf"):
                raise TrainingSetupError(f"{where} holds a bad number {node['__float__']!r}")
            return float(node["__float__"])
        if "__tuple__" in node:
            return tuple(build(v) for v in _list(node["__tuple__"]))
        if "__dict__" in node:
            pairs = [build(p) for p in _list(node["__dict__"])]
            if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise TrainingSetupError(f"{where} holds a damaged table")
            try:
                return {k: v for k, v in pairs}
            except TypeError:
                raise TrainingSetupError(f"{where} holds a table with a bad key") from None
        return {k: build(v) for k, v in node.items()}

    def _list(node):
        if not isinstance(node, list):
            raise TrainingSetupError(f"{where} holds a damaged list")
        return node

    return build(tree)


def save_checkpoint(path, state: dict) -> Path:
    """Write a training state (a dict of tensors, numbers, text and the containers of them) as
    one safetensors file, atomically: a crash leaves the old one whole. Nothing is pickled."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors: dict = {}
    tree = _flatten(state, tensors, {})
    metadata = {"format": "pt", _METADATA_KEY: json.dumps(tree, allow_nan=False)}
    save_files(
        path.parent, {path.name: lambda target: save_file(tensors, str(target), metadata=metadata)}
    )
    return path


def load_checkpoint(path) -> dict:
    """The training state in `path` (as save_checkpoint wrote it), every field checked.

    The file is read by the safetensors library (no unpickling: a hostile file cannot run
    code) and refused with a TrainingSetupError naming it when it is not a gpt2lib training
    checkpoint, is damaged, or lacks a field; weights and optimizer state must be finite."""
    from safetensors import safe_open

    path = Path(path)
    where = repr(str(path))
    try:
        with safe_open(str(path), framework="pt") as handle:
            text = (handle.metadata() or {}).get(_METADATA_KEY)
            if text is None:
                raise TrainingSetupError(f"{where} is not a gpt2lib training checkpoint")
            if len(text) > _MAX_METADATA_BYTES:
                raise TrainingSetupError(f"{where}: its training state is too large to be ours")
            try:
                tree = json.loads(text)
            except (ValueError, RecursionError):
                raise TrainingSetupError(f"{where}: its training state is damaged") from None
            state = _unflatten(tree, handle, where)
    except TrainingSetupError:
        raise
    except Exception as exc:  # the safetensors library's errors: truncated, damaged, not one
        if _is_pickle(path):
            raise TrainingSetupError(
                f"{where} is a pickle (torch.save), as gpt2lib wrote training checkpoints "
                "before; it is not read, because unpickling a file can run any code in it. "
                "Start the run again in a new --out folder"
            ) from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrainingSetupError(
            f"{where} cannot be read as a training checkpoint (truncated or damaged: {first}); "
            "resume from a copy, or start again in a new --out folder"
        ) from None
    _check_state(state, where)
    return state


def _is_pickle(path: Path) -> bool:
    """Whether a file starts as torch.save's files do (a zip archive, or a bare pickle)."""
    try:
        with open(path, "rb") as file:
            head = file.read(4)
    except OSError:
        return False
    return head == b"PK\x03\x04" or head[:1] == b"\x80"


def _check_state(state, where: str) -> None:
    """Refuse a training state that lacks a field or holds a bad value, naming it."""

    def bad(field, why):
        return TrainingSetupError(
            f"{where} is not a usable gpt2lib training checkpoint: {field} {why}; resume from "
            "a copy, or start again in a new --out folder"
        )

    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise TrainingSetupError(f"{where} is not a gpt2lib training checkpoint")
    if state.get("version") != CHECKPOINT_VERSION:
        raise bad(
            "version", f"is {state.get('version')!r}, this gpt2lib reads {CHECKPOINT_VERSION}"
        )
    required = {
        "step": int,
        "model": dict,
        "optimizer": dict,
        "model_size": dict,
        "run": dict,
        "global_batch": int,
        "world_size": int,
        "rng": list,
        "data_position": dict,
        "data": dict,
    }
    for field, kind in required.items():
        if field not in state:
            raise bad(f"the field {field!r}", "is missing")
        if not isinstance(state[field], kind) or isinstance(state[field], bool):
            raise bad(f"the field {field!r}", f"is a {type(state[field]).__name__}")
    try:
        check_whole("step", state["step"], 0)
        check_whole("global_batch", state["global_batch"], 1)
        check_whole("world_size", state["world_size"], 1)
    except (TypeError, ValueError) as exc:
        raise bad("the field", str(exc)) from None
    for field, names in (("model_size", MODEL_FIELDS), ("run", RUN_FIELDS)):
        missing = [n for n in names if n not in state[field]]
        if missing:
            raise bad(f"{field!r}", f"lacks {', '.join(missing)}")
    for name, tensor in state["model"].items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise bad("'model'", f"holds {name!r}, which is not a named tensor")
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise bad(f"the weight {name!r}", "is not finite floating point (NaN or infinite)")
    optimizer = state["optimizer"]
    if not isinstance(optimizer.get("state"), dict) or not isinstance(
        optimizer.get("param_groups"), list
    ):
        raise bad("'optimizer'", "lacks its state or param_groups")
    for index, values in optimizer["state"].items():
        for key, value in values.items() if isinstance(values, dict) else []:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                if not bool(torch.isfinite(value).all()):
                    raise bad(f"the optimizer's {key} of parameter {index}", "is NaN or infinite")
    if len(state["rng"]) != state["world_size"]:
        raise bad("'rng'", f"holds {len(state['rng'])} states for {state['world_size']} processes")
    for rank, rng in enumerate(state["rng"]):
        try:
            _check_rng_state(rng)
        except (TypeError, ValueError, KeyError, RuntimeError, IndexError) as exc:
            raise bad(
                f"the random state of process {rank}", f"cannot be restored ({exc})"
            ) from None


def _check_rng_state(state) -> None:
    """Raise unless `state` (from _rng_state) restores: tried on generators of their own."""
    import random

    if not isinstance(state, dict):
        raise TypeError("not a table")
    torch_state = state["torch"]
    if not isinstance(torch_state, torch.Tensor) or torch_state.dtype != torch.uint8:
        raise TypeError("the torch state is not a byte tensor")
    torch.Generator().set_state(torch_state)
    np.random.RandomState().set_state(state["numpy"])
    python = state["python"]
    if isinstance(python, tuple) and len(python) == 3 and isinstance(python[1], tuple):
        random.Random().setstate(python)
    else:
        raise TypeError("the Python state is not random.getstate()'s")
    cuda = state.get("cuda")
    if cuda is not None and not (isinstance(cuda, torch.Tensor) and cuda.dtype == torch.uint8):
        raise TypeError("the CUDA state is not a byte tensor")


def _data_identity(meta: dict | None):
    """What identifies a token file's ids: the SHA-256 of its source text, its vocabulary and
    its length."""
    if meta is None:
        return None
    return {k: meta.get(k) for k in ("source_sha256", "vocabulary", "count")}


def _check_resumable(state, s: TrainSettings, global_batch: int, path, data=None):
    size = {k: getattr(s, k) for k in MODEL_FIELDS}
    saved_size = {k: state["model_size"].get(k) for k in MODEL_FIELDS}
    if saved_size != size:
        raise TrainingSetupError(
            f"the checkpoint {str(path)!r} is of another model size: it has "
            f"{_fmt(saved_size)}, the flags ask for {_fmt(size)}. Give the run's "
            "own flags to resume it, or another --out for a new run"
        )
    changed = {
        k: (state["run"].get(k), v) for k, v in s.run_dict().items() if state["run"].get(k) != v
    }
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
    for flag, key in (("--data", "train"), ("--val-data", "val")):
        if data is None or state["data"].get(key) == data.get(key):
            continue
        saved, now = state["data"].get(key), data.get(key)
        raise TrainingSetupError(
            f"--resume continues the same run, but {flag} is not the run's "
            f"{'training' if key == 'train' else 'validation'} data: the checkpoint was trained "
            f"on {_describe_data(saved)}, {flag} now holds {_describe_data(now)}. Give the "
            "run's own token file, or start a new run in another --out"
        )
    if state["step"] > s.steps:
        raise TrainingSetupError(
            f"the checkpoint is at step {state['step']}, beyond --steps {s.steps}"
        )


def _describe_data(identity) -> str:
    if not identity:
        return "no file"
    sha = str(identity.get("source_sha256") or "")[:12] or "unknown"
    return f"{identity.get('count')} ids of text with SHA-256 {sha}..."


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
    problem. The run folder is locked while the run uses it (a second run in it is refused at
    once), and no file the run did not write is ever replaced. Returns a summary: the final
    step's loss, the last validation loss, where the log, checkpoint and model were written.
    """
    s = _settings(settings)
    from gpt2lib.chapters.config import GPT2Config
    from gpt2lib.tokenfile import VOCAB_SIZE, open_tokens, read_header

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
    data = {
        "train": _data_identity(read_header(s.data)),
        "val": _data_identity(read_header(s.val_data)) if s.val_data else None,
    }
    out = Path(s.out)
    if out.exists() and not out.is_dir():
        raise TrainingSetupError(f"--out {s.out!r} is a file; give a folder for the run")
    checkpoint_path, log_path = _run_paths(s)
    refuse_inputs_among_outputs(s, {"--data": s.data, "--val-data": s.val_data})
    if s.resume and not checkpoint_path.exists():
        legacy = out / LEGACY_CHECKPOINT_FILE
        if legacy.exists():
            load_checkpoint(legacy)  # refuses the pickle, saying why
        raise TrainingSetupError(
            f"--resume, but {str(out)!r} holds no {CHECKPOINT_FILE} to continue from"
        )
    lock = _RunLock(out) if ranks.rank == 0 else None  # rank 0 alone writes, so it locks
    try:
        state = None
        if lock is not None:
            lock.acquire()
            _refuse_files_of_others(s, out, log_path)
        if s.resume:
            state = load_checkpoint(checkpoint_path)
            _check_resumable(state, s, global_batch, checkpoint_path, data)
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
    except BaseException:
        if lock is not None:
            lock.release(undo_folder=True)
        raise
    try:
        return _run(s, ranks, device, config, train_ids, val_ids, state, global_batch, data)
    finally:
        if lock is not None:
            lock.release()


def run_outputs(s: TrainSettings) -> dict[str, Path]:
    """{what: path} of every file a run with these settings writes."""
    out = Path(s.out)
    return {
        "the run's checkpoint": out / CHECKPOINT_FILE,
        "the run's log": Path(s.log_file) if s.log_file else out / LOG_FILE,
        "the run's run.json": out / RUN_FILE,
        "the trained model's config.json": out / "config.json",
        "the trained model's weights": out / "model.safetensors",
    }


def refuse_inputs_among_outputs(s: TrainSettings, inputs: dict) -> None:
    """Refuse a file the run reads ({flag: path}) that is also one the run writes."""
    outputs = {os.path.realpath(p): what for what, p in run_outputs(s).items()}
    for flag, path in inputs.items():
        if path is None:
            continue
        what = outputs.get(os.path.realpath(path))
        if what is not None:
            raise TrainingSetupError(
                f"{flag} {str(path)!r} is {what}, a file this run writes: it would be "
                f"overwritten. Keep it outside --out {s.out!r} (or under another name); "
                "nothing was changed"
            )
    log = Path(s.log_file) if s.log_file else None
    if log is not None and log.is_dir():
        raise TrainingSetupError(f"--log-file {s.log_file!r} is a folder; give a file path")


def _is_our_run_file(path: Path):
    """The parsed run.json if it is one a gpt2lib run wrote, else None."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(info, dict) and isinstance(info.get("settings"), dict) and "world_size" in info:
        return info
    return None


def _refuse_files_of_others(s: TrainSettings, out: Path, log_path: Path) -> None:
    """Refuse, before anything is written, a run that would replace a file it did not write:
    a model or checkpoint of another run (without --resume), a run.json that is not a run's,
    or a log file that is not this folder's run log (`--log-file notes.txt`)."""
    if not s.resume:
        held = [
            name
            for name in (
                CHECKPOINT_FILE,
                LEGACY_CHECKPOINT_FILE,
                "model.safetensors",
                "config.json",
            )
            if os.path.lexists(out / name)
        ]
        if held:
            raise TrainingSetupError(
                f"{str(out)!r} already holds a run ({', '.join(held)}); pass --resume to "
                "continue it, or choose another --out (nothing was changed)"
            )
    info = None
    if os.path.lexists(out / RUN_FILE):
        info = _is_our_run_file(out / RUN_FILE)
        if info is None:
            raise TrainingSetupError(
                f"{str(out / RUN_FILE)!r} exists and is not a gpt2lib run's record; the run "
                "writes that file. Move it away or choose another --out (nothing was changed)"
            )
    if os.path.lexists(log_path):
        recorded = None
        if info is not None:
            recorded = info.get("log") or (info["settings"].get("log_file") or str(out / LOG_FILE))
        ours = recorded is not None and os.path.realpath(recorded) == os.path.realpath(log_path)
        if not ours:
            raise TrainingSetupError(
                f"the log file {str(log_path)!r} already exists and is not this run folder's "
                "log; the run would replace it. Give another --log-file, or leave it out to "
                f"log into {str(out / LOG_FILE)!r} (nothing was changed)"
            )


class _RunLock:
    """The run folder's lock: a file lock (the filelock library) on DIR/.gpt2lib-run.lock,
    taken without waiting. The operating system lets it go when the process dies (kill -9
    included), so a crashed run never leaves its folder locked."""

    def __init__(self, out: Path):
        self.out, self.lock, self.created = out, None, False

    def acquire(self) -> None:
        from filelock import FileLock, Timeout

        if not self.out.exists():
            self.out.mkdir(parents=True)
            self.created = True
        self.lock = FileLock(str(self.out / LOCK_FILE), timeout=0)
        try:
            self.lock.acquire()
        except Timeout:
            self.lock = None
            raise TrainingSetupError(
                f"another training run is using {str(self.out)!r} (its lock "
                f"{LOCK_FILE} is held); wait for it to finish, or choose another --out "
                "(nothing was changed)"
            ) from None

    def release(self, undo_folder: bool = False) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if undo_folder and self.created:  # a refused run leaves no folder behind
            try:
                (self.out / LOCK_FILE).unlink(missing_ok=True)
                self.out.rmdir()
            except OSError:
                pass


def _run_paths(s) -> tuple[Path, Path]:
    """Where a run with settings `s` keeps its checkpoint and its log."""
    out = Path(s.out)
    return out / CHECKPOINT_FILE, Path(s.log_file) if s.log_file else out / LOG_FILE


def _run(s, ranks, device, config, train_ids, val_ids, state, global_batch, data=None):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpt2lib.chapters.model import GPT2
    from gpt2lib.chapters.training import make_optimizer
    from gpt2lib.tokenfile import windows
    from gpt2lib.training import lm_loss, lr_schedule

    checkpoint_path, log_path = _run_paths(s)
    distributed = ranks.world > 1
    if distributed:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _join(dist, "nccl" if device.type == "cuda" else "gloo", ranks, s.dist_timeout)
    try:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # float32 matmuls on tensor cores
            torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(s.seed)  # the same initial weights on every rank
        raw = GPT2(config).to(device)
        optimizer = make_optimizer(raw, s.lr, s.weight_decay)  # fused AdamW on CUDA
        start = 0
        if state is not None:
            try:
                raw.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
            except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise TrainingSetupError(
                    f"the checkpoint {str(checkpoint_path)!r} does not fit this model or its "
                    f"optimizer ({first}); resume from a copy, or start a new run in another "
                    "--out"
                ) from None
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
            info["log"] = str(log_path.resolve())  # which log is this run's (see --log-file)
            atomic_write(checkpoint_path.parent / RUN_FILE, json.dumps(info, indent=2) + "\n")
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
                        "version": CHECKPOINT_VERSION,
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
                        "data": data or {"train": None, "val": None},
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
        last_saved = start if state is not None else None
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
                kept = (
                    f"; {checkpoint_path} keeps step {last_saved}"
                    if last_saved is not None
                    else "; nothing was saved"
                )
                raise FloatingPointError(
                    f"the training loss became {loss} at step {step} (learning rate {lr:.3g}); "
                    f"training stopped. Lower the learning rate (--lr {s.lr:g}, try "
                    f"{_lower_lr(s.lr):.2g}) or keep gradient clipping on{kept}"
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
                last_saved = done
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


def _lower_lr(lr: float) -> float:
    """The learning rate to try after a run diverged: a third of it, or GPT-2's 6e-4 when a
    third would still be far above what such runs use."""
    return lr / 3 if lr / 3 <= 1e-2 else 6e-4


def _join(dist, backend: str, ranks: Ranks, timeout: float) -> None:
    """init_process_group, waiting at most `timeout` seconds for every process to join (and,
    later, for any one collective), with one clear error when they do not."""
    from datetime import timedelta

    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    except Exception as exc:  # DistStoreError, RuntimeError: the others never came
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RuntimeError(
            f"process {ranks.rank} of {ranks.world} gave up after --dist-timeout {timeout:g} s: "
            f"the other processes did not all join ({first}). Start every process (torchrun "
            "--nproc_per_node=N starts them all), check MASTER_ADDR and MASTER_PORT, or give "
            "a longer --dist-timeout"
        ) from None


def _save_final(raw, config, folder):
    """config.json + model.safetensors (the hub's layout), the vocabulary cut back to GPT-2's."""
    from dataclasses import replace

    from gpt2lib.chapters.model import GPT2
    from gpt2lib.checkpoint import fills_skipped_on_meta, save_pretrained
    from gpt2lib.tokenfile import VOCAB_SIZE

    model = raw
    if config.vocab_size != VOCAB_SIZE:  # the padded rows are never a target: drop them
        with fills_skipped_on_meta(), torch.device("meta"):
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


def run_command(args) -> int:
    """Run `prepare` or `train` from parsed CLI arguments (gpt2lib/cli.py parses them). -> exit
    code."""
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
    if config:  # the settings file must not be one the run writes (RUN/config.json, say)
        refuse_inputs_among_outputs(_settings(dict(settings)), {"--config": config})
    summary = pretrain(**settings)
    if Ranks.from_env().rank == 0:
        print(json.dumps(summary, indent=2))
    return 0
