"""How long each chapter takes at its default setting: in JupyterLab, and under `progress`.

    python tools/chapter_times.py                 # every chapter, both ways
    python tools/chapter_times.py 07 10 --lab     # some chapters, JupyterLab only
    python tools/chapter_times.py --progress      # `course progress` only

Run it with the tests' environment (`.venv-test/bin/python`: it drives JupyterLab in headless
Chromium through tests/browser_support.py, as tests/course/test_browser.py does).

lab: each solution notebook (a learner who has done every exercise) runs top to bottom in a
fresh JupyterLab, as "Run All" does, at the chapter's default setting (GPT2LIB_QUICK unset)
with the PyTorch threads `python3 course.py` gives kernels. progress: `python -m
gpt2lib.course progress NN` on the learner notebook as shipped, which runs at the short
setting with the threads progress chooses. Offline, chapters 8 to 10 run on the stand-in.

Each row gives the wall time, the CPU seconds of everything the run started (the kernel, the
server; not the browser), and the load average before and after, because a shared machine's
other work stretches the wall time: with one PyTorch thread, the CPU seconds are about what
the wall time is on quiet cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import course  # noqa: E402  (the bootstrap: the threads it gives JupyterLab's kernels)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def chapters(wanted: list[str]) -> list[Path]:
    found = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    if wanted:
        found = [p for p in found if p.name[:2] in {w.zfill(2) for w in wanted}]
    return found


def default_env() -> dict[str, str]:
    env = course.course_env()  # OMP_NUM_THREADS as the Lab command sets it
    for name in ("GPT2LIB_QUICK", "GPT2LIB_CHECKPOINT"):
        env.pop(name, None)
    env.setdefault("HF_HUB_OFFLINE", "1")  # no weights here: the chapters take the stand-in
    return env


def save_outputs(cells: list[dict], target: Path) -> None:
    """What the cells printed, cell by cell (the training cells print their own times)."""
    lines = []
    for cell in cells:
        for out in cell["outputs"]:
            text = out.get("text") or out.get("data", {}).get("text/plain") or ""
            text = "".join(text) if isinstance(text, list) else text
            if text.strip():
                lines.append(f"--- cell {cell['index']}\n{text.rstrip()}")
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


OUTPUTS: Path | None = None  # --outputs


def time_in_lab(path: Path, timeout: float) -> tuple[float, float, str]:
    import browser_support as bs
    from playwright.sync_api import sync_playwright

    chromium, why = bs.find_chromium()
    if chromium is None:
        raise SystemExit(f"no browser: {why}")
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(default_env())  # start_lab passes os.environ to the server and kernels
    try:
        with tempfile.TemporaryDirectory(prefix="chapter-times-") as scratch:
            work, served = Path(scratch) / "lab", Path(scratch) / "course"
            bs.copy_course(ROOT, served)
            before = children_cpu()
            server = bs.start_lab(work, served)
            try:
                with sync_playwright() as p:
                    browser = p.chromium.launch(
                        executable_path=str(chromium), args=bs.CHROMIUM_ARGS
                    )
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    bs.open_lab(page, server)
                    result = bs.run_notebook(page, f"solutions/{path.name}", timeout)
                    page.evaluate(bs.JS_CLOSE_ALL)
                    browser.close()
            finally:
                server.stop()
            if OUTPUTS is not None:
                OUTPUTS.mkdir(parents=True, exist_ok=True)
                save_outputs(result.cells, OUTPUTS / f"{path.stem}.lab.txt")
            problem = "; ".join(result.errors[:2]) or ""
            return result.seconds, children_cpu() - before, problem
    finally:
        os.environ.clear()
        os.environ.update(saved)


def time_progress(path: Path, timeout: float) -> tuple[float, float, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "GPT2LIB_QUICK")}
    env.setdefault("HF_HUB_OFFLINE", "1")
    before, start = children_cpu(), time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpt2lib.course",
            "progress",
            path.name[:2],
            "--cell-timeout",
            str(int(timeout)),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - start
    stopped = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("!")]
    noise = [line for line in result.stderr.splitlines() if line.strip()]
    return seconds, children_cpu() - before, "; ".join(stopped + noise[:2])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*")
    parser.add_argument("--lab", action="store_true", help="JupyterLab only")
    parser.add_argument("--progress", action="store_true", help="`course progress` only")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per chapter")
    parser.add_argument("--outputs", type=Path, help="a folder for what each lab run printed")
    args = parser.parse_args(argv)
    global OUTPUTS
    OUTPUTS = args.outputs
    ways = [w for w, on in (("lab", args.lab), ("progress", args.progress)) if on] or [
        "lab",
        "progress",
    ]
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"OMP_NUM_THREADS for kernels: {default_env()['OMP_NUM_THREADS']}",
        flush=True,
    )
    print("| chapter | way | wall | CPU s | load before | load after | problem |", flush=True)
    print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for path in chapters(args.chapters):
        for way in ways:
            before = load()
            measure = time_in_lab if way == "lab" else time_progress
            seconds, cpu, problem = measure(path, args.timeout)
            print(
                f"| {path.stem} | {way} | {seconds / 60:.1f} min | {cpu:.0f} | {before} | "
                f"{load()} | {problem} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
