"""GPU check: gpt2lib's KV-cached generation against transformers on one CUDA GPU.

    python benchmarks/gpu_check.py                        # CUDA, GPT-2 small shapes, random weights
    python benchmarks/gpu_check.py --checkpoint DIR       # real weights (config.json + model.safetensors)
    python benchmarks/gpu_check.py --device cpu --quick   # the CI smoke run: tiny model, few tokens

Meant for a machine with an NVIDIA GPU and nothing installed but Python. It first installs
what it needs (torch, transformers, safetensors, tiktoken, regex, numpy) with pip: from the
wheels in a `.whl/` folder at the repository root when there is one (`pip download` them on
a machine with internet), else from PyPI. Then, in about two minutes on an H200:

1. greedy tokens: gpt2lib's equal transformers' (float32, TF32 off: the strict check; in
   bfloat16 the number of agreeing tokens is reported, since the two libraries round
   differently);
2. decoding speed at batch 1 and 8, in bfloat16 and float32, for transformers' generate(),
   gpt2lib eager and gpt2lib with the captured CUDA graph (generate(compile=True)): tokens/s
   of the decode steps (the prefill is subtracted) and the GB/s of weights that this means,
   next to the GPU's measured memory read speed;
3. training (CUDA only, `training_check`): `torchrun -m gpt2lib train` on every visible GPU
   with NCCL, bf16 autocast, torch.compile and the padded vocabulary at GPT-2 small's shapes;
   tokens/s, MFU, and whether the loss fell and the saved model loads;
4. a JSON record in benchmarks/records/ (and in $OUT when that variable is set).

Both libraries get the same weights: random ones at GPT-2 small's shapes (seed 0) unless
--checkpoint is given. The exit code is 1 if the float32 tokens differ.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NEEDED = {
    "torch": "torch",
    "transformers": "transformers",
    "safetensors": "safetensors",
    "tiktoken": "tiktoken",
    "regex": "regex",
    "numpy": "numpy",
}  # module -> pip name


# --------------------------------------------------------------------------- set-up


def missing_packages() -> list[str]:
    return [pip for module, pip in NEEDED.items() if importlib.util.find_spec(module) is None]


def install(packages: list[str]) -> None:
    """pip install the packages: from .whl/ when present (offline), else from PyPI."""
    if importlib.util.find_spec("pip") is None:
        subprocess.run([sys.executable, "-m", "ensurepip", "--upgrade"], check=True)
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    wheels = REPO / ".whl"
    if wheels.is_dir() and any(wheels.glob("*.whl")):
        print(f"installing {', '.join(packages)} from {wheels}", flush=True)
        done = subprocess.run(pip + ["--no-index", "--find-links", str(wheels), *packages])
        if done.returncode == 0:
            return
        print("  the local wheels were not enough; trying PyPI", flush=True)
    print(f"installing {', '.join(packages)} from PyPI", flush=True)
    subprocess.run(pip + packages, check=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke run)")
    p.add_argument("--checkpoint", type=Path, help="folder with config.json + model.safetensors")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny random model, few tokens, 1 repeat: proves the script runs",
    )
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="where to write the record")
    p.add_argument("--no-install", action="store_true", help="never call pip")
    args = p.parse_args(argv)
    if args.quick:
        args.new_tokens, args.prompt_len, args.repeats = 8, 8, 1
    return args


# --------------------------------------------------------------------------- measuring


def hf_generate(model, prompt, new_tokens):
    import torch

    with torch.inference_mode():
        return model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
        )


def ours_generate(model, prompt, new_tokens, graph):
    import torch

    from gpt2lib.generation import generate

    with torch.inference_mode():
        return generate(model, prompt, new_tokens, temperature=0, compile=graph)


def decode_tokens_per_second(fn, prompt, new_tokens, repeats, sync):
    """Tokens/s of the decode steps alone: time(new_tokens) - time(1 token) is the decoding."""
    from gpt2lib.speed.measure import median_seconds

    one = median_seconds(lambda: fn(prompt, 1), repeats, sync=sync)
    many = median_seconds(lambda: fn(prompt, new_tokens), repeats, sync=sync)
    return prompt.shape[0] * (new_tokens - 1) / max(many - one, 1e-9)


def agreeing_tokens(a, b) -> int:
    """How many leading positions (in every row) two generations share."""
    differ = (a.cpu() != b.cpu()).any(0).nonzero()
    return int(differ[0]) if len(differ) else a.shape[1]


def run_dtype(dtype_name, folder, args, record) -> bool:
    import torch
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    from gpt2lib.model import from_pretrained
    from gpt2lib.speed.measure import decode_bytes_per_token

    hf_logging.set_verbosity_error()
    dtype = getattr(torch, dtype_name)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    ours = from_pretrained(str(folder), device=device, dtype=dtype).eval()
    hf = GPT2LMHeadModel.from_pretrained(str(folder), dtype=dtype).to(device).eval()
    hf.generation_config.pad_token_id = hf.config.eos_token_id
    per_token = decode_bytes_per_token(ours)
    gen = torch.Generator().manual_seed(1)
    vocab = ours.config.vocab_size
    implementations = {
        "transformers generate": lambda p, n: hf_generate(hf, p, n),
        "gpt2lib eager": lambda p, n: ours_generate(ours, p, n, graph=False),
    }
    if device.type == "cuda":
        implementations["gpt2lib captured graph"] = lambda p, n: ours_generate(ours, p, n, True)
    section = record["results"].setdefault(dtype_name, {})
    ok = True
    for batch in (1, 8):
        prompt = torch.randint(0, vocab, (batch, args.prompt_len), generator=gen).to(device)
        theirs = implementations["transformers generate"](prompt, args.new_tokens)
        rows = section.setdefault(f"batch {batch}", {})
        for name in implementations:
            if name.startswith("gpt2lib"):
                mine = implementations[name](prompt, args.new_tokens)
                agree = agreeing_tokens(mine, theirs)
                same = agree == theirs.shape[1]
                rows.setdefault("greedy_identical", {})[name] = same
                rows.setdefault("agreeing_positions", {})[name] = agree
                if dtype_name == "float32" and not same:
                    ok = False
                    print(
                        f"  {dtype_name} batch {batch} {name}: tokens differ from "
                        f"transformers from position {agree}",
                        flush=True,
                    )
        for name, fn in implementations.items():
            rate = decode_tokens_per_second(fn, prompt, args.new_tokens, args.repeats, sync)
            gbps = rate / batch * per_token / 1e9  # one step reads every weight once
            rows[name] = {"tokens_per_s": rate, "weights_gb_per_s": gbps}
            print(
                f"  {dtype_name:8s} batch {batch}: {name:24s} {rate:9.1f} tokens/s "
                f"({gbps:7.1f} GB/s of weights)",
                flush=True,
            )
        base = rows["transformers generate"]["tokens_per_s"]
        for name in implementations:
            if name.startswith("gpt2lib"):
                rows[name]["vs_transformers"] = rows[name]["tokens_per_s"] / base
    section["weight_bytes_per_token"] = per_token
    ours = hf = None  # free both models before the next dtype
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ok


def training_check(args, record, steps=30) -> bool:
    """The training path on the GPU(s): `torchrun -m gpt2lib train` with NCCL, bf16 autocast,
    torch.compile and the padded vocabulary, GPT-2 small's shapes, on Tiny Shakespeare.

    Records tokens/s and MFU (median of the last steps) and whether the loss fell and the saved
    model loads. CUDA only: the CPU path (gloo) is tested in tests/library/test_scaling.py.
    """
    import statistics

    import torch

    if args.device != "cuda":
        record["results"]["training"] = "skipped: CUDA only"
        return True
    from gpt2lib.model import from_pretrained
    from gpt2lib.tokenfile import prepare

    gpus = torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as tmp:
        prepare(REPO / "data" / "tinyshakespeare.txt", Path(tmp) / "s.bin", 0.1, progress=False)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={gpus}",
            "-m",
            "gpt2lib",
            "train",
            "--data",
            f"{tmp}/s.bin",
            "--val-data",
            f"{tmp}/s.val.bin",
            "--n-layer",
            "12",
            "--n-head",
            "12",
            "--n-embd",
            "768",
            "--block-size",
            "1024",
            "--batch-size",
            "16",
            "--grad-accum",
            "2",
            "--steps",
            str(steps),
            "--lr",
            "6e-4",
            "--dtype",
            "bfloat16",
            "--compile",
            "--pad-vocab",
            "--no-progress",
            "--out",
            f"{tmp}/run",
        ]
        began = time.perf_counter()
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        section = {
            "command": " ".join(command[2:]),
            "gpus": gpus,
            "seconds": time.perf_counter() - began,
            "returncode": done.returncode,
        }
        record["results"]["training"] = section
        if done.returncode != 0:
            section["stderr"] = done.stderr[-3000:]
            print(f"  training: torchrun failed\n{done.stderr[-3000:]}", flush=True)
            return False
        log = [
            json.loads(line)
            for line in Path(tmp, "run", "log.jsonl").read_text(encoding="utf-8").splitlines()
        ]
        tail = log[len(log) // 2 :]  # after compilation and warm-up
        section.update(
            tokens_per_s=statistics.median(x["tokens_per_s"] for x in tail),
            mfu=statistics.median(x["mfu"] for x in tail),
            first_loss=log[0]["loss"],
            last_loss=log[-1]["loss"],
            run=json.loads(Path(tmp, "run", "run.json").read_text(encoding="utf-8")),
        )
        loaded = from_pretrained(str(Path(tmp, "run")), device="cpu")
        section["saved_model_loads"] = loaded.config.vocab_size == 50257
    ok = section["last_loss"] < section["first_loss"] and section["saved_model_loads"]
    print(
        f"  training ({gpus} GPU(s), NCCL, bf16, compile): {section['tokens_per_s']:,.0f} "
        f"tokens/s, MFU {section['mfu']:.1%}, loss {section['first_loss']:.3f} -> "
        f"{section['last_loss']:.3f}",
        flush=True,
    )
    return ok


def machine(args) -> dict:
    import torch
    import transformers

    from gpt2lib.speed.measure import memory_read_gbps

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": args.device,
    }
    if args.device == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    info["memory_read_gb_per_s"] = memory_read_gbps(64 if args.quick else 1024, device=args.device)
    return info


def write_record(record, args) -> list[Path]:
    name = (record["machine"].get("device_name") or args.device).lower()
    name = "".join(c if c.isalnum() else "-" for c in name).strip("-")
    filename = f"gpu-check-{name}-{time.strftime('%Y-%m-%d-%H%M%S')}.json"
    targets = [args.json] if args.json else [REPO / "benchmarks" / "records" / filename]
    if os.environ.get("OUT"):
        targets.append(Path(os.environ["OUT"]) / filename)
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2), encoding="utf-8")
        print(f"record written to {path}")
    return targets


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = missing_packages()
    if missing:
        if args.no_install:
            print(f"missing packages: {', '.join(missing)} (and --no-install was given)")
            return 2
        install(missing)
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))  # checkpoints.py writes the hub's exact layout
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("this PyTorch sees no CUDA GPU; run with --device cpu for the smoke run")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 must be float32 for the token check
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    began = time.perf_counter()
    record = {
        "script": "benchmarks/gpu_check.py",
        "machine": machine(args),
        "results": {},
        "settings": {
            "new_tokens": args.new_tokens,
            "prompt_len": args.prompt_len,
            "repeats": args.repeats,
            "quick": args.quick,
        },
    }
    print(
        f"{record['machine'].get('device_name', args.device)}, torch {torch.__version__}; "
        f"memory read speed {record['machine']['memory_read_gb_per_s']:.0f} GB/s",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.checkpoint
        if folder is None:
            from checkpoints import write_hub_checkpoint

            folder = Path(tmp)
            sizes = (
                dict(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64)
                if args.quick
                else dict(n_layer=12, n_head=12, n_embd=768)
            )
            write_hub_checkpoint(folder, seed=0, **sizes)
            record["weights"] = f"random (seed 0), {sizes}"
        else:
            record["weights"] = str(folder)
        ok = all([run_dtype(name, folder, args, record) for name in ("bfloat16", "float32")])
    record["results"]["training_ok"] = training_check(args, record)
    record["results"]["greedy_identical_float32"] = ok
    record["seconds"] = time.perf_counter() - began
    write_record(record, args)
    print(f"done in {record['seconds']:.0f} s; float32 greedy tokens identical: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
