"""GPT-2 checkpoints both ways: loading (`load_pretrained`) and saving (`save_pretrained`).

Written by hand (not generated from a notebook). Chapter 8 teaches how the weights are read
into the model (`gpt2lib.chapters.weights`: the safetensors file, the names, the tied readout) and
chapter 7 what the two files hold. This module is what stands behind those lessons at the
entry points people call: it owns the file names, the hub's config.json fields and model
names, finds a checkpoint (a folder, or a hub name through the local cache and one quick
probe of the hub), checks every file and value before a model is built, and writes models
atomically.

    from gpt2lib import from_pretrained, save_pretrained   # gpt2lib.model and this module
    model = from_pretrained("gpt2")                  # or a folder: "data/standin"
    save_pretrained(model, "my_model")               # config.json + model.safetensors

`gpt2lib.from_pretrained` (gpt2lib.model) calls `load_pretrained` with the model class that
carries the methods; `gpt2lib.save_pretrained` is `save_pretrained`.

A save writes both files as one unit (`gpt2lib.files.save_files`): into a hidden folder
inside the target, flushed to disk, then a commit record, then the renames (the weights, then
the config). A save killed after its commit record is finished by the next load or save; one
killed earlier leaves the old model and a hidden folder that the next load or save removes.
The weights file also carries a copy of its config in its metadata (what earlier versions
finished a killed save by).
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, fields
from pathlib import Path
from typing import TextIO

import torch
from torch import nn

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.model import GPT2
from gpt2lib.chapters.weights import is_mask_buffer, iter_safetensors, load_weights
from gpt2lib.device import pick_device, resolve_dtype
from gpt2lib.files import (
    folder_lock,
    fsync_dir,
    json_object,
    recover_saves,
    save_files,
    stale_saves,
)
from gpt2lib.validation import (
    DATA_DIR,
    DTYPE_NAMES,
    GPT2_SIZES,
    HUB_ORG,
    SAFETENSORS_DTYPES,
    check_path,
    check_real,
    check_whole,
    released_name,
)

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "HUB_MODELS",
    "HUB_ORG",
    "PROBE_TIMEOUT_S",
    "CheckpointError",
    "HubUnreachable",
    "check_fits",
    "check_values",
    "course_root",
    "download",
    "hub_checkpoint",
    "hub_config_dict",
    "hub_name",
    "is_real_gpt2",
    "load_pretrained",
    "read_config",
    "read_config_dict",
    "read_safetensors",
    "resolve_checkpoint",
    "save_pretrained",
    "standin_folder",
]

HUB_MODELS = tuple(GPT2_SIZES)  # the one list of names of the released GPT-2s
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROBE_TIMEOUT_S = 5  # the one quick request that tells whether the hub can be reached
MAX_CONFIG_BYTES = 1 << 20  # a GPT-2 config.json is about 1 KB; anything near this is not one
CONFIG_METADATA_KEY = "gpt2lib.config"  # the weights file's copy of its config.json

# config.json settings of transformers' GPT-2 that change the computation: the values our
# model computes (anything else is refused, not ignored).
_SUPPORTED = {
    "activation_function": ("gelu_new", "gelu_pytorch_tanh"),  # both are the tanh GELU
    "scale_attn_weights": (True,),  # scores divided by sqrt(head_dim)
    "scale_attn_by_inverse_layer_idx": (False,),
    "add_cross_attention": (False,),
}
# config.json fields that Hugging Face's GPT-2 config has and our GPT2Config does not
_HUB_CONFIG_EXTRA = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "initializer_range": 0.02,
    "model_type": "gpt2",
    "tie_word_embeddings": True,
}
# A save writes into its own hidden folder, .gpt2lib-save.<pid>.<random>, inside the target
# folder (gpt2lib.files.save_files). The safetensors library writes its own temp file beside
# the file it is asked for, so that one lands in there too.
_LEGACY_TEMPS = (WEIGHTS_FILE + ".partial",)  # what earlier versions wrote beside the weights


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message says which file and what is wrong."""


# --------------------------------------------------------------------------- models for shapes

# torch.nn.init's fills; on the meta device each still costs tens of milliseconds (GPT-2 small
# built on meta took 2.5 s with them, 0.02 s without), and there are no values to fill.
_FILLS = (
    "normal_",
    "uniform_",
    "zeros_",
    "ones_",
    "constant_",
    "trunc_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "xavier_uniform_",
    "xavier_normal_",
)
_FILLS_LOCK = threading.Lock()
_fills_skipped = 0  # how many blocks below are open, in every thread


@contextmanager
def fills_skipped_on_meta():
    """Within the block, torch.nn.init's fills leave a meta tensor as it is: a model built on
    the meta device for its shapes (to load weights into, or to check a file against) costs no
    fill. Real tensors are filled as always, in this thread and every other."""
    global _fills_skipped
    with _FILLS_LOCK:
        if _fills_skipped == 0:
            for name in _FILLS:
                fill = getattr(torch.nn.init, name)
                setattr(torch.nn.init, name, _skipping_meta(fill))
        _fills_skipped += 1
    try:
        yield
    finally:
        with _FILLS_LOCK:
            _fills_skipped -= 1
            if _fills_skipped == 0:
                for name in _FILLS:
                    setattr(torch.nn.init, name, getattr(torch.nn.init, name).__wrapped__)


def _skipping_meta(fill):
    @functools.wraps(fill)
    def skipping(tensor, *args, **kwargs):
        return tensor if tensor.is_meta else fill(tensor, *args, **kwargs)

    return skipping


# --------------------------------------------------------------------------- where things are


def course_root() -> Path | None:
    """The course folder (the checkout holding data/ and notebooks/), or None if installed
    without one."""
    return DATA_DIR.parent if DATA_DIR.is_dir() else None


def standin_folder() -> Path | None:
    """The absolute path of data/standin, the small GPT-2 that ships with the course."""
    root = course_root()
    folder = DATA_DIR / "standin" if root is not None else None
    if folder is not None and all((folder / f).is_file() for f in (CONFIG_FILE, WEIGHTS_FILE)):
        return folder
    return None


def _standin_hint(what: str) -> str:
    folder = standin_folder()
    if folder is None:
        return ""
    return (
        f" Without a network, the course's small stand-in (a 4-layer GPT-2 trained on "
        f"Tiny Shakespeare, not OpenAI's model) loads instead: {what.format(folder=folder)}."
    )


class HubUnreachable(CheckpointError):
    """A hub model is not in the local cache and the hub cannot be reached.

    `name` is the model, `reason` what went wrong and `offline` whether offline mode was asked
    for, so that the command line can say what to do in its own terms."""

    def __init__(self, name: str, reason: str, offline: bool = False) -> None:
        self.name, self.reason, self.offline = name, reason, offline
        hint = _standin_hint(
            "from_pretrained('{folder}'). A name such as "
            f"{name!r} always means OpenAI's model, whatever the environment says; "
            "GPT2LIB_CHECKPOINT={folder} changes only what the chapters' loading cells "
            "(gpt2lib.course.models.chapter_checkpoint) and `python -m gpt2lib generate` "
            "without --model load, so set it before starting Jupyter for the chapters"
        )
        super().__init__(
            f"the weights of {name!r} are not in the local Hugging Face cache, and the hub "
            f"cannot be reached ({reason}). While online, run `python -m gpt2lib download "
            f"{name}` once; or pass the path of a local folder that holds {CONFIG_FILE} and "
            f"{WEIGHTS_FILE} instead of the name.{hint}"
        )


def hub_name(text: object) -> str | None:
    """'gpt2' or 'openai-community/gpt2' -> 'gpt2'; None if it names no GPT-2 on the hub."""
    if not isinstance(text, str):
        return None
    name = text.removeprefix(f"{HUB_ORG}/")
    return name if name in HUB_MODELS else None


def hub_checkpoint(name: str, offline: bool | None = None) -> Path:
    """The folder holding config.json and model.safetensors of hub model `name`.

    The local Hugging Face cache is tried first (no network needed). Otherwise one request with
    a short timeout and no retries checks that the hub answers, and only then are the files
    downloaded (with huggingface_hub's cache, resume and progress bar). offline=True, or
    HF_HUB_OFFLINE=1, means the cache only.
    """
    key = hub_name(name)
    if key is None:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(HUB_MODELS)}")
    import huggingface_hub as hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo = f"{HUB_ORG}/{key}"
    try:
        paths = [
            hub.hf_hub_download(repo, f, local_files_only=True) for f in (CONFIG_FILE, WEIGHTS_FILE)
        ]
        return Path(paths[1]).parent
    except LocalEntryNotFoundError:
        pass  # not (fully) cached: the hub is needed
    if offline or hub.constants.HF_HUB_OFFLINE:
        raise HubUnreachable(
            key,
            "offline mode: HF_HUB_OFFLINE=1" if not offline else "offline=True was asked for",
            offline=True,
        )
    try:  # a single quick request: is the hub there at all?
        hub.get_hf_file_metadata(
            hub.hf_hub_url(repo, CONFIG_FILE), timeout=PROBE_TIMEOUT_S, retry_on_errors=False
        )
    except HfHubHTTPError as exc:
        raise CheckpointError(f"the hub refused {repo}/{CONFIG_FILE}: {exc}") from None
    except Exception as exc:  # connection refused, no DNS, timeout: the network is not there
        raise HubUnreachable(key, f"{type(exc).__name__}: {exc}") from None
    try:
        paths = [hub.hf_hub_download(repo, f) for f in (CONFIG_FILE, WEIGHTS_FILE)]
    except (HfHubHTTPError, OSError) as exc:
        raise CheckpointError(
            f"downloading {repo} failed ({type(exc).__name__}: {exc}); run the same command "
            f"again to resume, or pass a local folder holding {CONFIG_FILE} and {WEIGHTS_FILE}"
        ) from None
    return Path(paths[1]).parent


def _check_folder(path: Path) -> Path:
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (path / f).is_file()]
    if missing:
        raise CheckpointError(
            f"folder {str(path)!r} does not hold {' and '.join(missing)} (as regular files); "
            f"a GPT-2 checkpoint folder needs {CONFIG_FILE} and {WEIGHTS_FILE} (the hub layout)"
        )
    return path


def resolve_checkpoint(name_or_folder: str | os.PathLike) -> Path:
    """A local folder for a hub model name or a folder path; clear errors for anything else.

    A relative path is looked up from the current folder and then from the course folder, so
    that 'data/standin' works from notebooks/ as well as from the course folder. A hub name
    loses only to a folder of that name in the current folder.
    """
    if not isinstance(name_or_folder, (str, os.PathLike)):
        raise TypeError(
            f"name_or_folder must be a model name ({', '.join(HUB_MODELS)}) or a folder path, "
            f"got {type(name_or_folder).__name__}"
        )
    text = os.fspath(name_or_folder)
    if not isinstance(text, str):
        raise TypeError(f"name_or_folder must be a text path, got bytes {text!r}")
    if not text.strip():
        raise ValueError(
            f"name_or_folder is empty; give a model name ({', '.join(HUB_MODELS)}) or the path "
            "of a checkpoint folder ('.' for the current folder)"
        )
    if "\0" in text:
        raise ValueError(f"name_or_folder {text!r} holds a NUL character")
    path = Path(text).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path]
    root = course_root()
    if not path.is_absolute() and root is not None and root / path not in candidates:
        candidates.append(root / path)
    is_name = not isinstance(name_or_folder, os.PathLike) and hub_name(text) is not None
    for i, candidate in enumerate(candidates):
        if i > 0 and is_name:
            break  # 'gpt2' means the hub unless the current folder has a folder of that name
        if candidate.is_dir():
            return _check_folder(path if i == 0 else candidate)
        if candidate.exists():
            raise CheckpointError(
                f"{str(candidate)!r} is a file; pass the folder that holds {CONFIG_FILE} and "
                f"{WEIGHTS_FILE}"
            )
    if is_name:
        return hub_checkpoint(text)
    if (
        isinstance(name_or_folder, os.PathLike)
        or os.sep in text
        or "/" in text
        or text.startswith((".", "~"))
    ):
        looked = " and ".join(repr(str(c)) for c in candidates)
        where = (
            ""
            if path.is_absolute()
            else (
                "; a relative path is looked up from the current folder, then from the course folder"
            )
        )
        raise FileNotFoundError(f"no such checkpoint folder: {text!r} (looked in {looked}{where})")
    raise ValueError(
        f"unknown model {text!r}: not one of {', '.join(HUB_MODELS)} and not an existing folder "
        f"(looked in {' and '.join(repr(str(c)) for c in candidates)})"
    )


# --------------------------------------------------------------------------- config.json


def _config_problem(values: dict) -> str | None:
    """What makes a config.json dict unusable for our GPT-2, or None."""
    if values.get("model_type", "gpt2") != "gpt2":
        return f"describes a {values['model_type']!r} model, not GPT-2 (model_type must be 'gpt2')"
    for key, allowed in _SUPPORTED.items():
        if key in values and values[key] not in allowed:
            return (
                f"sets {key}={values[key]!r}, which this GPT-2 does not implement (it "
                f"computes {key}={allowed[0]!r}); the model would silently compute "
                "something else, so it is refused"
            )
    for f in fields(GPT2Config):
        if f.name not in values:
            continue
        try:
            if f.type in (int, "int"):
                check_whole(f.name, values[f.name])
            elif f.type in (float, "float"):
                check_real(f.name, values[f.name])
        except (TypeError, ValueError) as exc:  # other kinds of field: GPT2Config checks them
            return f"has a bad value: {exc}"
    n_embd = values.get("n_embd", GPT2Config.n_embd)
    if values.get("n_inner") not in (None, 4 * n_embd):
        return f"sets n_inner={values['n_inner']!r}; this GPT-2's MLP is 4 * n_embd wide"
    return None


def _parse_config(text: str, where: str) -> GPT2Config:
    values = json_object(text, where, CheckpointError, "a readable JSON config")
    problem = _config_problem(values)
    if problem:
        raise CheckpointError(f"{where} {problem}")
    try:
        return GPT2Config.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where} has a bad value: {exc}") from None


def _read_text(path: Path, what: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(
            f"{what} is not a readable JSON config ({exc.strerror or exc})"
        ) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise CheckpointError(
            f"{what} is not a readable JSON config (over "
            f"{MAX_CONFIG_BYTES // 1024} KiB; a GPT-2 config is about 1 KiB)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{what} is not a readable JSON config (not UTF-8: {exc})") from None


def read_config(folder: str | os.PathLike) -> GPT2Config:
    """The GPT2Config of a checkpoint folder; CheckpointError naming config.json if it is bad."""
    path = Path(folder) / CONFIG_FILE
    return _parse_config(_read_text(path, repr(str(path))), repr(str(path)))


def read_config_dict(folder: str | os.PathLike) -> dict:
    """A checkpoint folder's config.json as a dict, unchecked beyond being a JSON object;
    CheckpointError naming the file if it cannot be read."""
    path = Path(folder) / CONFIG_FILE
    where = repr(str(path))
    return json_object(_read_text(path, where), where, CheckpointError, "a readable JSON config")


def is_real_gpt2(folder: str | os.PathLike) -> bool:
    """True if the checkpoint folder has the sizes of one of OpenAI's released GPT-2 models."""
    return released_name(read_config_dict(folder)) is not None


def hub_config_dict(config: GPT2Config) -> dict:
    """A GPT2Config as the dict of a Hugging Face config.json (their field names)."""
    if not isinstance(config, GPT2Config):
        raise TypeError(f"config must be a GPT2Config, got {type(config).__name__}")
    values = {**_HUB_CONFIG_EXTRA, **asdict(config)}
    values["n_ctx"] = config.n_positions
    values["bos_token_id"] = values["eos_token_id"] = config.vocab_size - 1  # <|endoftext|>
    return dict(sorted(values.items()))


# --------------------------------------------------------------------------- checks of tensors


def _listing(names, limit=8) -> str:
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def check_fits(
    model: nn.Module,
    state: Mapping[str, torch.Tensor | Sequence[int]],
    where: str = "checkpoint",
) -> None:
    """Refuse a state dict (name -> tensor or shape) whose keys or shapes differ from the
    model's, naming them all."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes = {k: tuple(v.shape) if hasattr(v, "shape") else tuple(v) for k, v in state.items()}
    missing = expected.keys() - shapes.keys()
    unexpected = shapes.keys() - expected.keys()
    wrong = [
        f"{k} {shapes[k]} (model expects {expected[k]})"
        for k in sorted(expected.keys() & shapes.keys())
        if shapes[k] != expected[k]
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_listing(unexpected)}")
    if wrong:
        problems.append(
            f"wrong shapes: {'; '.join(wrong[:8])}"
            + (f"; ... ({len(wrong) - 8} more)" if len(wrong) > 8 else "")
        )
    if problems:
        c = model.config
        raise CheckpointError(
            f"{where} does not fit GPT-2 with n_layer={c.n_layer}, n_head={c.n_head}, "
            f"n_embd={c.n_embd}, vocab_size={c.vocab_size}, n_positions={c.n_positions}: "
            + "; ".join(problems)
        )


def _non_finite(tensor: torch.Tensor) -> int:
    # in slices: isfinite makes temporaries as large as its input, and wte is 147 MiB
    flat = tensor.detach().reshape(-1)
    if all(bool(torch.isfinite(part).all()) for part in flat.split(1 << 20)):
        return 0
    return int((~torch.isfinite(flat)).sum())


def check_values(name: str, tensor: torch.Tensor, where: str) -> None:
    """Refuse a weight that is not floating point, or that holds NaN or infinity."""
    if not tensor.is_floating_point():
        raise CheckpointError(
            f"{where}: tensor {name!r} has dtype {tensor.dtype}; GPT-2's weights are floating "
            "point (float32, bfloat16 or float16), so this file is not a GPT-2 checkpoint"
        )
    count = _non_finite(tensor)
    if count:
        raise CheckpointError(
            f"{where}: tensor {name!r} holds {count} NaN or infinite value(s); the model would "
            "compute NaN. The file is damaged, or was saved from a training run that diverged"
        )


def _header(path: Path) -> tuple[dict, dict]:
    """The safetensors header of `path` ({name: {dtype, shape, ...}}, metadata), validated by
    the safetensors library (no unpickling; a truncated or corrupt file is refused)."""
    bad = f"{str(path)!r} is not a valid safetensors file"
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            names = list(handle.keys())
            metadata = handle.metadata() or {}
            slices = {n: handle.get_slice(n) for n in names}
            header = {
                n: {"dtype": s.get_dtype(), "shape": list(s.get_shape())} for n, s in slices.items()
            }
    except Exception as exc:  # safetensors raises its own error types for every kind of damage
        raise CheckpointError(
            f"{bad} (truncated or corrupt: {exc}); delete it and download or save it again"
        ) from None
    return header, metadata


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """({name: tensor}, metadata) of a whole safetensors file, read by the safetensors library
    (no unpickling; a truncated, oversized or corrupt file is refused with a CheckpointError
    naming the file). For small files (adapters): every tensor is read into memory."""
    path = Path(path)
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as exc:  # safetensors raises its own error types for every kind of damage
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointError(
            f"{str(path)!r} is not a valid safetensors file (truncated or corrupt: {first}); "
            "delete it and save it again"
        ) from None
    return tensors, metadata


# --------------------------------------------------------------------------- locks and temp files


def _folder_lock(folder: Path, exclusive: bool):
    """The folder's lock (gpt2lib.files.folder_lock): saves exclusive, loads shared."""
    return folder_lock(folder, exclusive)


def _stale_temps(folder: Path) -> list:
    """What dead saves left in `folder`: their hidden save folders (and earlier versions'
    `.partial` file)."""
    return stale_saves(folder, _LEGACY_TEMPS)


def _metadata_config(weights: Path) -> str | None:
    try:
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as handle:
            return (handle.metadata() or {}).get(CONFIG_METADATA_KEY)
    except Exception:
        return None


def _finish_legacy_save(save_dir: Path) -> None:
    """A save of an earlier version (no commit record) whose folder still holds its
    config.json, and whose text is the config the weights file now carries, got as far as
    renaming the weights: renaming its config too finishes that save."""
    folder = save_dir.parent
    pending = save_dir / CONFIG_FILE
    carried = _metadata_config(folder / WEIGHTS_FILE)
    if (
        not (save_dir / WEIGHTS_FILE).exists()
        and pending.is_file()
        and carried is not None
        and pending.read_text(encoding="utf-8") == carried
    ):
        os.replace(pending, folder / CONFIG_FILE)
        fsync_dir(folder)


def _recover(folder: Path) -> None:
    """Finish or undo saves that were killed (call with the folder locked exclusively); see
    gpt2lib.files.recover_saves."""
    recover_saves(folder, _finish_legacy_save, _LEGACY_TEMPS)


# --------------------------------------------------------------------------- from_pretrained


def load_pretrained(
    name_or_folder: str | os.PathLike,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    model_cls: Callable[[GPT2Config], nn.Module],
) -> nn.Module:
    """A model of class `model_cls` with real weights, from a hub name or a checkpoint folder
    (`gpt2lib.from_pretrained` calls this with `gpt2lib.GPT2` unless told another class).

    name_or_folder: 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl' (also with the prefix
    'openai-community/'), or a folder holding config.json and model.safetensors (a relative
    path is looked up from the current folder, then from the course folder).
    device: None picks CUDA, then MPS, then CPU (see gpt2lib.device.pick_device).
    dtype: None means float32 on CPU and MPS, bfloat16 on a CUDA GPU that supports it.
    model_cls: the class to build, called as model_cls(config).
    Returns the model in eval mode. Everything is checked before the model is built: the
    files (no unpickling; truncated and corrupt files refused), config.json's values, every
    tensor's name, shape and dtype, and afterwards that no weight is NaN or infinite.
    """
    if isinstance(model_cls, str) or not callable(model_cls):
        raise TypeError(f"model_cls must be a model class such as GPT2, got {model_cls!r}")
    device = pick_device(device)
    dtype = resolve_dtype(dtype, device)
    folder = resolve_checkpoint(name_or_folder)
    if _stale_temps(folder):
        with _folder_lock(folder, exclusive=True):
            _recover(folder)
    with _folder_lock(folder, exclusive=False):
        return _load(folder, device, dtype, model_cls)


def _load(folder: Path, device, dtype, model_cls):
    config = read_config(folder)
    weights = folder / WEIGHTS_FILE
    where = str(weights)
    header, _ = _header(weights)
    shapes = {}
    for name, info in header.items():
        if is_mask_buffer(name):
            continue
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"{str(weights)!r} is not a valid safetensors file: tensor "
                f"{name!r} has unsupported dtype {info['dtype']}"
            )
        file_dtype = SAFETENSORS_DTYPES[info["dtype"]]
        if not file_dtype.is_floating_point:
            check_values(name, torch.empty(0, dtype=file_dtype), where)  # refuses, naming it
        if name == "lm_head.weight":
            continue
        key = name.removeprefix("transformer.")
        if key in shapes:
            raise CheckpointError(f"{where} holds {key!r} twice (with and without prefix)")
        shapes[key] = tuple(info["shape"])
    _check_layer_count(config, shapes, where)  # before building: a huge n_layer takes long
    with fills_skipped_on_meta(), torch.device("meta"):
        probe = model_cls(config)
    check_fits(probe, shapes, where=where)
    if "lm_head.weight" in header and tuple(header["lm_head.weight"]["shape"]) != shapes.get(
        "wte.weight"
    ):
        raise CheckpointError(
            f"{where!r} has an lm_head.weight that differs from wte.weight "
            "in shape; GPT-2 ties its readout to the token embedding"
        )
    del probe

    with fills_skipped_on_meta():  # load_weights builds the model on meta for its shapes
        model = load_weights(weights, config, device=device, dtype=dtype, model_cls=model_cls)

    for name, tensor in model.state_dict().items():
        if tensor.is_meta:
            continue
        count = _non_finite(tensor) if tensor.is_floating_point() else 0
        if count:
            raise CheckpointError(
                f"{where}: tensor {name!r} holds {count} NaN or infinite value(s)"
                + (
                    " in the file"
                    if tensor.dtype != torch.float16
                    else " (in the file, or too large for float16)"
                )
                + "; the model would compute NaN. The file is damaged, or was saved from a "
                "training run that diverged"
            )
    if "lm_head.weight" in header:
        for _, lm_head in iter_safetensors(weights, keep=lambda n: n == "lm_head.weight"):
            if not torch.equal(lm_head.to(device=device, dtype=dtype), model.wte.weight):
                raise CheckpointError(
                    f"{where!r} has an lm_head.weight that differs from wte.weight; GPT-2 ties "
                    "its readout to the token embedding, so this checkpoint is not a GPT-2 one"
                )
    left_on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left_on_meta:
        raise CheckpointError(
            f"after loading, {_listing(left_on_meta)} still have no data: the model class has "
            "tensors that are not in the checkpoint (non-persistent buffers?)"
        )
    return model.eval()


def _check_layer_count(config, shapes: dict, where: str) -> None:
    """Refuse weights whose blocks (h.0, h.1, ...) are not the n_layer of config.json, before a
    model of that many layers is built (4,096 layers took half a minute to be refused)."""
    found = set()
    for name in shapes:
        match = re.match(r"^h\.(\d+)\.", name)
        if match:
            found.add(int(match.group(1)))
    expected = set(range(config.n_layer))
    if found and found != expected:
        missing, extra = sorted(expected - found), sorted(found - expected)
        listed = [
            f"{kind}: {', '.join(f'h.{i}.*' for i in blocks[:4])}"
            f"{f' and {len(blocks) - 4} more' if len(blocks) > 4 else ''}"
            for kind, blocks in (("missing keys", missing), ("unexpected keys", extra))
            if blocks
        ]
        raise CheckpointError(
            f"{where} does not fit its {CONFIG_FILE}: the config says n_layer={config.n_layer}, "
            f"but the weights hold {len(found)} block(s); {'; '.join(listed)}. The two files "
            "do not belong together"
        )


def download(names: str | Sequence[str], out: TextIO | None = None) -> list[Path]:
    """Fetch hub checkpoints into the Hugging Face cache so that later runs work offline."""
    if isinstance(names, str):
        names = [names]
    unknown = [n for n in names if hub_name(n) is None]
    if unknown:
        raise ValueError(
            f"unknown model {', '.join(map(repr, unknown))}; choose from {', '.join(HUB_MODELS)}"
        )
    folders = []
    for name in names:
        folder = hub_checkpoint(name, offline=False)
        if out is not None:
            print(f"{name}: {folder}", file=out)
        folders.append(folder)
    return folders


# --------------------------------------------------------------------------- save_pretrained


def _storage_dtype(dtype):
    if dtype is None:
        return None
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key not in DTYPE_NAMES:
            raise ValueError(
                f"unknown dtype {dtype!r}; store weights as float32, bfloat16 or "
                "float16 (or None to keep the model's own)"
            )
        return DTYPE_NAMES[key]
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(
            f"dtype must be float32, bfloat16 or float16 (or None to keep the "
            f"model's own), got {dtype!r}: GPT-2's weights are floating point"
        )
    return dtype


def _hub_tensors(model, dtype) -> dict:
    """The tensors to write, in the hub's names, on the CPU, each with its own storage."""
    state = model.state_dict()
    if (
        "lm_head.weight" in state
        and "wte.weight" in state
        and not torch.equal(state["lm_head.weight"], state["wte.weight"])
    ):
        raise ValueError(
            "the model's lm_head.weight differs from wte.weight; the GPT-2 format "
            "ties the readout to the token embedding and stores wte only"
        )
    tensors = {}
    for name, tensor in state.items():
        if name == "lm_head.weight":  # a tied copy of wte.weight: the hub file leaves it out
            continue
        if tensor.is_meta:
            raise ValueError(
                f"the model's tensor {name!r} has no data (it is on the meta "
                "device): load or initialise the model before saving it"
            )
        if not tensor.is_floating_point():
            raise ValueError(
                f"the model's tensor {name!r} has dtype {tensor.dtype}; a GPT-2 "
                "checkpoint holds floating-point weights only"
            )
        tensor = tensor.detach().to("cpu")
        if dtype is not None:
            tensor = tensor.to(dtype)
        count = _non_finite(tensor)
        if count:
            how = "" if dtype is None or dtype == state[name].dtype else f" in {dtype}"
            raise ValueError(
                f"the model's tensor {name!r} holds {count} NaN or infinite value(s){how}; "
                "nothing was written. A model that diverged in training cannot be saved "
                "(load the last good save instead)"
                + (
                    "; float16 cannot hold values beyond 65504, try dtype=torch.bfloat16"
                    if dtype == torch.float16
                    else ""
                )
            )
        tensors[name] = tensor.contiguous().clone()  # own storage: tied tensors share memory
    return tensors


def save_pretrained(
    model: nn.Module,
    folder: str | os.PathLike,
    overwrite: bool = False,
    dtype: torch.dtype | str | None = None,
) -> Path:
    """Write `model` in the hub's GPT-2 layout: folder/config.json and folder/model.safetensors.

    The safetensors keys are the hub's (`wte.weight`, `h.0.attn.c_attn.weight`, ...), with the
    Conv1D weights [in, out] and no `lm_head` (tied to `wte`), so from_pretrained(folder)
    and transformers' GPT2LMHeadModel.from_pretrained(folder) both read it. A folder that
    already holds a model is refused unless overwrite=True, which replaces those two files
    (and nothing else in the folder). dtype (torch.float16 or "float16", say) stores smaller
    weights. Everything is checked and serialised before the folder is touched (config,
    dtype, finite weights), and the write is atomic: after a crash at any point, the folder
    loads as the old model or the new one. Returns the folder as a Path.
    """
    from safetensors.torch import save_file

    # 1. every argument, before anything is written
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a GPT-2 model (an nn.Module), got {type(model).__name__}")
    config = getattr(model, "config", None)
    if not isinstance(config, GPT2Config):
        raise TypeError(f"model.config must be a GPT2Config, got {type(config).__name__}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
    dtype = _storage_dtype(dtype)
    folder = check_path(folder)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{str(folder)!r} is a file; give a folder to save the model in")

    def refuse_existing():
        existing = [n for n in (CONFIG_FILE, WEIGHTS_FILE) if os.path.lexists(folder / n)]
        if existing and not overwrite:
            raise FileExistsError(
                f"{str(folder)!r} already holds a model ({', '.join(existing)}); nothing was "
                "written. Choose another folder, or pass overwrite=True to replace it"
            )

    refuse_existing()

    # 2. serialise and check everything in memory
    values = hub_config_dict(config)
    try:
        config_text = json.dumps(values, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"the model's config cannot be written as JSON ({exc}); nothing was written"
        ) from None
    try:
        written = _parse_config(config_text, "the model's config")
    except CheckpointError as exc:
        raise ValueError(f"{exc}; nothing was written") from None
    changed = [
        f.name for f in fields(GPT2Config) if getattr(written, f.name) != getattr(config, f.name)
    ]
    if changed:
        raise ValueError(
            f"the model's config does not survive config.json ({', '.join(changed)} "
            "read back differently); nothing was written"
        )
    tensors = _hub_tensors(model, dtype)
    with fills_skipped_on_meta(), torch.device("meta"):
        reference = GPT2(written)
    try:
        check_fits(reference, tensors, where="the model's weights")
    except CheckpointError as exc:
        raise ValueError(
            f"{exc}; from_pretrained could not read them back, so nothing was written"
        ) from None
    del reference
    metadata = {"format": "pt", CONFIG_METADATA_KEY: config_text}

    # 3. one unit (gpt2lib.files.save_files): both files into a hidden folder, a commit
    # record, then the renames, weights first; killed saves are finished or undone first
    try:
        save_files(
            folder,
            {
                WEIGHTS_FILE: lambda path: save_file(tensors, str(path), metadata=metadata),
                CONFIG_FILE: config_text,
            },
            before=refuse_existing,  # another process may have saved here since the first look
            legacy=_finish_legacy_save,
            legacy_names=_LEGACY_TEMPS,
        )
    except OSError as exc:
        if isinstance(exc, FileExistsError):
            raise
        raise OSError(
            exc.errno,
            f"could not write the model into {str(folder)!r} ({exc.strerror or exc}); the "
            "folder holds what it held before",
        ) from None
    return folder
