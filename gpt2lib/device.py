"""Where to run: pick a device (CUDA, Apple's MPS or the CPU) and a number format.

Written by hand (not generated from a notebook). Chapter 8 calls it in one cell; every
loader and the command line use it, so a workshop gets the same clear error everywhere
when it asks for a device that is not there.

    from gpt2lib.device import pick_device, resolve_dtype, available_devices
    device = pick_device()                  # CUDA, then MPS, then CPU
    dtype = resolve_dtype(None, device)     # float32, or bfloat16 on a CUDA GPU that has it
"""

import warnings

import torch

from gpt2lib.validation import DTYPE_NAMES

__all__ = ["available_devices", "default_dtype", "pick_device", "resolve_dtype"]


def pick_device(requested: torch.device | str | None = None) -> torch.device:
    """The device to run on: the one asked for, or else CUDA, then Apple's MPS, then the CPU.

    `requested` may be None or "auto" (pick), a string such as "cpu", "cuda", "cuda:1", "mps",
    or a torch.device. Asking for a device that this machine does not have raises a ValueError
    that says what is there: silently running a workshop on the CPU when the GPU was meant is
    worse than a clear stop.
    """
    if requested is None or (isinstance(requested, str) and requested.strip().lower() == "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if not isinstance(requested, (str, torch.device)):
        raise TypeError(
            f"device must be a string such as 'cpu', 'cuda' or 'mps', or a torch.device; "
            f"got {type(requested).__name__}"
        )
    try:
        name = requested.strip().lower() if isinstance(requested, str) else requested
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"unknown device {requested!r}; use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'"
        ) from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                "device 'cuda' was requested but this PyTorch sees no CUDA GPU "
                f"(available: {', '.join(available_devices())}); pass device='cpu' or "
                "leave device unset to pick automatically"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s), cuda:0 .. "
                f"cuda:{torch.cuda.device_count() - 1}"
            )
        return device
    if device.type == "mps":
        if not _mps_available():
            raise ValueError(
                "device 'mps' was requested but Apple's MPS backend is not available here "
                f"(available: {', '.join(available_devices())}); pass device='cpu' or leave "
                "device unset to pick automatically"
            )
        return device
    raise ValueError(
        f"unsupported device {str(device)!r}; use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'"
    )


def available_devices() -> list[str]:
    """Names of the devices this machine can run on, fastest first."""
    names = []
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        names.append("mps")
    return names + ["cpu"]


def default_dtype(device: torch.device | str) -> torch.dtype:
    """float32 on the CPU and MPS; bfloat16 on a CUDA GPU that supports it (else float32)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device | str) -> torch.dtype:
    """None -> default_dtype(device); a name ('bfloat16', 'fp16', ...) or a torch float dtype."""
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key not in DTYPE_NAMES:
            raise ValueError(
                f"unknown dtype {dtype!r}; use one of float32, bfloat16, float16 (or None/'auto')"
            )
        dtype = DTYPE_NAMES[key]
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    if dtype == torch.float16 and torch.device(device).type == "cpu":
        warnings.warn(
            "float16 on the CPU is slow and loses precision; prefer bfloat16 or float32",
            stacklevel=3,
        )
    return dtype


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())
