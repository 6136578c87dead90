"""JupyterLab in headless Chromium, for tests/course/test_browser.py.

A throw-away JupyterLab server (temp config/data/runtime folders, random token, free port,
serving a temp copy of the notebooks) and helpers that drive one notebook through Playwright:
open it, run all cells, wait, and read back errors and widgets.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")  # Debian's `apt-get install chromium`
CHROMIUM_ENV = "GPT2LIB_CHROMIUM"  # any Chromium or Chrome executable, to override the search
# Where else a Chromium or Chrome usually is, tried in order after CHROMIUM.
OTHER_CHROMIUMS = [
    Path("/usr/bin/chromium-browser"),
    Path("/Applications/Google Chrome.app/Contents/MacOS/Google Chrome"),
    Path("/Applications/Chromium.app/Contents/MacOS/Chromium"),
]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

# User settings for the temp JupyterLab: no news or update toasts, and every cell kept in the
# page (no windowing), so widgets far down a notebook are rendered and can be counted.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def playwright_chromium() -> Path | None:
    """Playwright's own Chromium (`python -m playwright install chromium`), if downloaded."""
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            path = Path(p.chromium.executable_path)
    except Exception:  # no playwright, or its driver cannot start: no browser from it
        return None
    return path if path.is_file() else None


def find_chromium() -> tuple[Path | None, str]:
    """The browser the test drives, and, when there is none, what is missing and how to get it.

    $GPT2LIB_CHROMIUM if set (and then only that), else CHROMIUM, else OTHER_CHROMIUMS, else
    Playwright's own Chromium."""
    chosen = os.environ.get(CHROMIUM_ENV, "").strip()
    if chosen:
        path = Path(chosen).expanduser()
        if path.is_file():
            return path, ""
        return (
            None,
            f"{CHROMIUM_ENV}={chosen} is missing (it must name a Chromium or Chrome executable)",
        )
    for path in [CHROMIUM, *OTHER_CHROMIUMS]:
        if path.is_file():
            return path, ""
    path = playwright_chromium()
    if path is not None:
        return path, ""
    return None, (
        f"{CHROMIUM} is missing, and no other Chromium or Chrome was found (Debian: "
        "apt-get install chromium; elsewhere: python -m playwright install chromium, or set "
        f"{CHROMIUM_ENV} to a Chrome executable)"
    )


def browser_missing() -> str:
    """'' when the browser tests can run here, else what is missing and how to get it."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install -r requirements.txt)"
    return find_chromium()[1]


def solution_chapter(nodeid: str) -> str | None:
    """'10_finetuning' for an nbval item of solutions/10_finetuning.ipynb, else None."""
    path = nodeid.split("::")[0]
    if (
        path.startswith("solutions/")
        and path.endswith(".ipynb")
        and "/" not in path[len("solutions/") :]
    ):
        return path[len("solutions/") : -len(".ipynb")]
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LabServer:
    """A running JupyterLab; `root` is the folder it serves."""

    root: Path
    port: int
    token: str
    process: subprocess.Popen
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def start_lab(workdir: Path, served: Path, timeout: float = 90.0) -> LabServer:
    """Start JupyterLab serving `served`, with every Jupyter folder inside `workdir`."""
    env = dict(os.environ)  # GPT2LIB_CHECKPOINT and COURSE_* reach the kernels
    for name, sub in [
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"),
        ("IPYTHONDIR", "ipython"),
    ]:
        (workdir / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(workdir / sub)
    for rel, settings in LAB_SETTINGS.items():
        path = workdir / "lab-settings" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings), encoding="utf-8")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")

    token = secrets.token_hex(24)
    port = free_port()
    log_path = workdir / "jupyterlab.log"
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        "--allow-root",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.extension_manager=readonly",
        "--LabApp.news_url=None",
        f"--ServerApp.root_dir={served}",
    ]
    log = open(log_path, "wb")
    process = subprocess.Popen(command, cwd=served, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    server = LabServer(served, port, token, process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(
                f"{server.base_url}/api/status?token={token}", timeout=2
            ) as r:
                if r.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    server.stop()
    raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{server.log_tail()}")


def copy_course(repo: Path, target: Path) -> None:
    """The notebooks and the data they read, copied so that a run never writes into the repo."""
    for folder in ("solutions", "notebooks"):
        src = repo / folder
        if src.is_dir():
            shutil.copytree(
                src, target / folder, ignore=shutil.ignore_patterns("backups", ".ipynb_checkpoints")
            )
    if (repo / "data").is_dir():
        shutil.copytree(repo / "data", target / "data")


# --------------------------------------------------------------------------- in the page

# Everything below runs inside JupyterLab through `window.jupyterapp` (expose_app_in_browser).
# One page serves every notebook: each is opened with `docmanager:open` and disposed after,
# which saves reloading JupyterLab (about 10 s a notebook on a 2-core machine).

JS_OPEN = """
async (path) => {
  const app = window.jupyterapp;
  await app.restored;
  const widget = await app.commands.execute("docmanager:open", {path, factory: "Notebook"});
  app.shell.activateById(widget.id);
}
"""

# The open notebook panel for `path`, from the notebook tracker's point of view (the shell).
_JS_PANEL = """
  const app = window.jupyterapp;
  const panel = Array.from(app.shell.widgets("main")).find(
    w => w.context && w.context.path === path && w.sessionContext);
"""

# True once the notebook is loaded and its kernel is idle; polled, so it can never hang.
JS_READY = (
    """
(path) => {"""
    + _JS_PANEL
    + """
  if (!panel || !panel.context.isReady) { return false; }
  const session = panel.sessionContext.session;
  return Boolean(session && session.kernel && session.kernel.status === "idle");
}
"""
)

JS_RUN_ALL = (
    """
async (path) => {"""
    + _JS_PANEL
    + """
  app.shell.activateById(panel.id);
  await app.commands.execute("notebook:run-all-cells");
}
"""
)

# Busy prompts, plus every code cell's execution count and outputs, read from the model.
JS_STATE = (
    """
(path) => {"""
    + _JS_PANEL
    + """
  const busy = Array.from(panel.content.node.querySelectorAll(".jp-InputPrompt"))
    .filter(p => p.textContent.includes("[*]")).length;
  const cells = [];
  const model = panel.content.model;
  for (let i = 0; i < model.cells.length; i++) {
    const cell = model.cells.get(i);
    if (cell.type !== "code") { continue; }
    cells.push({index: i, count: cell.executionCount, outputs: cell.outputs.toJSON(),
                source: cell.sharedModel.getSource().slice(0, 200)});
  }
  const session = panel.sessionContext.session;
  return {busy, cells, kernel: session && session.kernel ? session.kernel.status : "no kernel"};
}
"""
)

# Shut down every open notebook's kernel and close it without a "save changes?" dialog.
JS_CLOSE_ALL = """
async () => {
  const app = window.jupyterapp;
  for (const widget of Array.from(app.shell.widgets("main"))) {
    if (widget.sessionContext) {
      try { await widget.sessionContext.shutdown(); } catch (e) {}
      widget.dispose();
    }
  }
}
"""


@dataclass
class RunResult:
    seconds: float
    cells: list[dict]
    errors: list[str] = field(default_factory=list)

    @property
    def widget_outputs(self) -> int:
        return sum(
            1
            for cell in self.cells
            for out in cell["outputs"]
            if WIDGET_MIME in out.get("data", {})
        )

    @property
    def unrun(self) -> list[int]:
        return [c["index"] for c in self.cells if c["count"] is None and c["source"].strip()]


def error_outputs(cells: list[dict]) -> list[str]:
    """One line per output of type `error` (an exception), never for warnings on stderr."""
    found = []
    for cell in cells:
        for out in cell["outputs"]:
            if out.get("output_type") == "error":
                found.append(
                    f"cell {cell['index']}: {out.get('ename')}: {out.get('evalue', '')[:300]}"
                )
    return found


def dismiss_toasts(page) -> None:
    """Answer the 'get notified about Jupyter news?' toast (or any toast) if one shows."""
    for label in ("No", "Dismiss", "Close"):
        for button in page.locator(".jp-toast-container button, .Toastify__toast button").all():
            try:
                if button.is_visible() and label in (button.text_content() or ""):
                    button.click(timeout=2000)
            except Exception:  # a toast that vanished on its own is fine
                pass


def open_lab(page, server: LabServer) -> None:
    """Load JupyterLab once in `page` (fresh workspace)."""
    page.goto(f"{server.base_url}/lab?reset&token={server.token}", wait_until="domcontentloaded")
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=90_000)
    page.evaluate("async () => { await window.jupyterapp.restored; }")
    dismiss_toasts(page)


def run_notebook(page, notebook: str, timeout: float) -> RunResult:
    """Open `notebook` (path relative to the served folder), run all cells, wait for the end."""
    start = time.monotonic()
    page.evaluate(JS_OPEN, notebook)
    try:
        page.wait_for_function(JS_READY, arg=notebook, timeout=90_000)
    except Exception as exc:
        dialogs = page.locator(".jp-Dialog").all_text_contents()
        raise AssertionError(
            f"{notebook}: notebook or kernel not ready after 90 s"
            + (f"; a dialog is open: {dialogs}" if dialogs else "")
        ) from exc
    dismiss_toasts(page)
    page.evaluate(JS_RUN_ALL, notebook)
    deadline = time.monotonic() + timeout
    state = page.evaluate(JS_STATE, notebook)
    while time.monotonic() < deadline:
        state = page.evaluate(JS_STATE, notebook)
        finished = state["busy"] == 0 and state["kernel"] == "idle"
        if finished and (
            error_outputs(state["cells"])
            or all(c["count"] is not None or not c["source"].strip() for c in state["cells"])
        ):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(
            f"{notebook}: still running after {timeout:.0f} s "
            f"({state['busy']} cells show [*], kernel {state['kernel']})"
        )
    page.wait_for_timeout(500)  # let widget views finish rendering
    state = page.evaluate(JS_STATE, notebook)
    result = RunResult(time.monotonic() - start, state["cells"])
    result.errors = error_outputs(state["cells"])
    return result


def rendered_tracebacks(page) -> list[str]:
    """Error text rendered in the page (stderr-styled output containing a traceback)."""
    texts = page.locator(
        '.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'
    ).all_text_contents()
    return [t[:300] for t in texts if "Traceback" in t]


def widget_problems(page) -> list[str]:
    """Widget outputs that did not render: 'Error displaying widget' or still 'Loading'."""
    problems = []
    for phrase in ("Error displaying widget", "Loading widget"):
        count = page.get_by_text(phrase).count()
        if count:
            problems.append(f"{count}× '{phrase}'")
    return problems


def rendered_widget_count(page) -> int:
    """Cell outputs that hold a rendered widget view (widgets nested inside them not counted)."""
    return page.locator(".jp-OutputArea-output").evaluate_all(
        """outputs => outputs.filter(o =>
             !o.parentElement.closest('.jupyter-widgets') &&
             Array.from(o.children).some(c => c.classList.contains('jupyter-widgets'))).length"""
    )


def slider_value(handle) -> str:
    value = handle.get_attribute("aria-valuenow") or ""
    slider = handle.locator("xpath=ancestor::div[contains(@class,'widget-slider')][1]")
    readout = slider.locator(".widget-readout")
    text = readout.first.text_content() if readout.count() else ""
    return f"{value}|{text}"


def nudge_first_slider(page) -> tuple[str, str] | None:
    """Focus the first enabled slider, press ArrowRight (ArrowLeft at the end); old and new value."""
    handles = page.locator(".jp-OutputArea-output .widget-slider .noUi-handle")
    for i in range(handles.count()):
        handle = handles.nth(i)
        if handle.get_attribute("aria-disabled") == "true" or not handle.is_visible():
            continue
        handle.scroll_into_view_if_needed()
        before = slider_value(handle)
        handle.focus()
        for key in ("ArrowRight", "ArrowLeft"):
            page.keyboard.press(key)
            # Poll both readings: aria-valuenow is rounded (0.85 shows as 0.8), the readout
            # may be hidden (readout=False); either one moving is the slider responding.
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                after = slider_value(handle)
                if after != before:
                    return before, after
                page.wait_for_timeout(100)
        return before, slider_value(handle)
    return None
