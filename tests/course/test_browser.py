"""End to end: the chapter notebooks run in JupyterLab in a real (headless) Chromium.

Catches what nbval cannot: widgets that fail to render in the browser, a slider that does not
respond, JupyterLab refusing a notebook. One JupyterLab server and one browser serve all tests;
the notebooks are copied to a temp folder first, so the repo is never written to.

Needs Playwright and a Chromium or Chrome (browser_support.find_chromium says where it looks).
Skipped when either is missing, so a learner's laptop does not fail on it, and the run's
summary then says why in one line (tests/conftest.py); in CI (CI=true) it fails instead.
Screenshots go to a temp folder, or to $BROWSER_SCREENSHOTS when set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import browser_support as bs
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
# Seconds a whole notebook may take after "Run All" (chapters 8 and 9 run a model on CPU).
RUN_TIMEOUT = float(os.environ.get("BROWSER_RUN_TIMEOUT", "300"))
CHAPTERS = sorted(p.stem for p in (REPO_ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
# Chapters whose notebook must show at least one working slider.
MUST_HAVE_SLIDER = {"03_attention"}
# Chapters that take minutes in the browser (chapter 10 trains eight classifiers). They run from
# tests/course/test_browser_heavy.py, a module of its own: pytest-xdist's `--dist loadscope` gives each
# module to one worker, so the two workers share the browser runs instead of one doing them all.
HEAVY = ("10_finetuning",)
TIMINGS: dict[str, float] = {}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _require_browser() -> None:
    missing = bs.browser_missing()
    if missing:
        if _in_ci():
            pytest.fail(f"CI=true but {missing}", pytrace=False)
        pytest.skip(f"browser test skipped: {missing}")


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("BROWSER_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    yield path
    if TIMINGS:
        (path / "timings.json").write_text(json.dumps(TIMINGS, indent=1), encoding="utf-8")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    _require_browser()
    work = tmp_path_factory.mktemp("lab")
    served = work / "course"
    bs.copy_course(REPO_ROOT, served)
    write_selftest_notebooks(served / "selftest")
    server = bs.start_lab(work / "jupyter", served)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    chromium, _ = bs.find_chromium()
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=str(chromium),
            headless=True,
            args=bs.CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        context.set_default_timeout(60_000)
        yield context
        context.close()


@pytest.fixture(scope="module")
def lab_page(browser, lab):
    """One JupyterLab page for all notebooks (loading JupyterLab again costs ~10 s each)."""
    page = browser.new_page()
    page.page_errors = []
    page.on("pageerror", lambda exc: page.page_errors.append(str(exc)))
    bs.open_lab(page, lab)
    yield page
    page.close()


@pytest.fixture
def page(lab_page):
    lab_page.page_errors.clear()
    yield lab_page
    # Free the kernel's memory and the DOM before the next notebook.
    lab_page.evaluate(bs.JS_CLOSE_ALL)


def write_selftest_notebooks(folder: Path) -> None:
    """Two tiny notebooks that prove the harness itself can see sliders and errors."""
    folder.mkdir(parents=True)
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(
        new_notebook(
            metadata=kernel,
            cells=[
                new_code_cell(
                    "import ipywidgets as widgets\nslider = widgets.IntSlider(value=3, min=0, max=10)\nslider"
                ),
                new_code_cell(
                    "@widgets.interact(n=(0, 5))\ndef show(n=2):\n    print('n squared is', n * n)"
                ),
                new_code_cell("widgets.FloatSlider(value=0.8, min=0.0, max=2.0, step=0.05)"),
            ],
        ),
        str(folder / "widgets.ipynb"),
    )
    nbformat.write(
        new_notebook(
            metadata=kernel,
            cells=[
                new_code_cell("import warnings\nwarnings.warn('only a warning')\nprint('fine')"),
                new_code_cell("raise ValueError('planted error')"),
                new_code_cell("print('never runs')"),
            ],
        ),
        str(folder / "broken.ipynb"),
    )


def run_and_inspect(page, notebook: str, name: str) -> bs.RunResult:
    result = bs.run_notebook(page, notebook, RUN_TIMEOUT)
    bs.dismiss_toasts(page)
    TIMINGS[name] = round(result.seconds, 1)
    return result


def screenshot(page, shots: Path, name: str) -> Path:
    bs.dismiss_toasts(page)
    # Show a slider if there is one, else any widget, else wherever the run ended.
    for selector in (
        ".jp-OutputArea-output .widget-slider",
        ".jp-OutputArea-output .jupyter-widgets",
    ):
        widget = page.locator(selector).first
        if widget.count():
            widget.scroll_into_view_if_needed()
            break
    path = shots / f"{name}.png"
    page.screenshot(path=str(path))
    return path


# --------------------------------------------------------------------------- the chapters


def _chapter_params(names):
    for name in names:
        path = REPO_ROOT / "solutions" / f"{name}.ipynb"
        marks = (
            []
            if path.exists()
            else [pytest.mark.skip(reason=f"solutions/{name}.ipynb not written yet")]
        )
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("chapter", list(_chapter_params([c for c in CHAPTERS if c not in HEAVY])))
def test_chapter_runs_in_jupyterlab(chapter, page, shots):
    check_chapter_in_lab(chapter, page, shots)


def check_chapter_in_lab(chapter, page, shots):
    """Run All on the chapter in JupyterLab: no errors, every cell run, widgets that render and a
    slider that moves."""
    result = run_and_inspect(page, f"solutions/{chapter}.ipynb", chapter)

    assert result.errors == [], f"{chapter}: cells raised in JupyterLab:\n" + "\n".join(
        result.errors
    )
    assert result.unrun == [], f"{chapter}: cells never ran: {result.unrun}"
    assert bs.rendered_tracebacks(page) == []
    assert bs.widget_problems(page) == [], bs.widget_problems(page)
    # Every widget output the kernel sent is rendered as a widget in the page.
    assert bs.rendered_widget_count(page) == result.widget_outputs

    sliders = page.locator(".jp-OutputArea-output .widget-slider").count()
    if chapter in MUST_HAVE_SLIDER:
        assert sliders > 0, f"{chapter} should show a slider"
    if sliders:
        moved = bs.nudge_first_slider(page)
        assert moved is not None, f"{chapter}: no enabled slider could be focused"
        before, after = moved
        assert before != after, f"{chapter}: slider did not respond to the arrow keys ({before})"
        page.wait_for_timeout(1000)  # the interact function reruns in the kernel
        state = page.evaluate(bs.JS_STATE, f"solutions/{chapter}.ipynb")
        assert bs.error_outputs(state["cells"]) == []
        assert bs.widget_problems(page) == []
    assert page.page_errors == [], page.page_errors
    screenshot(page, shots, chapter)


# --------------------------------------------------------------------------- the harness itself


def test_harness_sees_widgets_and_moves_a_slider(page, shots):
    result = run_and_inspect(page, "selftest/widgets.ipynb", "selftest-widgets")
    assert result.errors == [] and result.unrun == []
    assert result.widget_outputs == 3
    assert bs.rendered_widget_count(page) == 3
    assert bs.widget_problems(page) == []
    output = page.locator(".jp-OutputArea-output .widget-output").first
    page.wait_for_function(
        "el => el.textContent.includes('n squared is 4')", arg=output.element_handle()
    )
    before, after = bs.nudge_first_slider(page)
    assert before.endswith("|3") and after.endswith("|4"), (before, after)
    # The second slider drives `interact`: moving it reruns the function in the kernel.
    handle = page.locator(".jp-OutputArea-output .widget-slider .noUi-handle").nth(1)
    handle.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "el => el.textContent.includes('n squared is 9')", arg=output.element_handle()
    )
    # A float slider moves by its step (its aria-valuenow is rounded, so read the readout).
    handle = page.locator(".jp-OutputArea-output .widget-slider .noUi-handle").nth(2)
    handle.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "el => el.closest('.widget-slider').querySelector('.widget-readout').textContent === '0.85'",
        arg=handle.element_handle(),
    )
    screenshot(page, shots, "selftest-widgets")


def test_harness_reports_an_exception_but_not_a_warning(page):
    result = run_and_inspect(page, "selftest/broken.ipynb", "selftest-broken")
    assert len(result.errors) == 1
    assert result.errors[0].startswith("cell 1: ValueError: planted error")
    assert result.unrun == [2]  # run-all stops at the error
    assert len(bs.rendered_tracebacks(page)) == 1
    stderr = page.locator('.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]')
    assert any("only a warning" in t for t in stderr.all_text_contents())


def no_browser_anywhere(monkeypatch, tmp_path):
    monkeypatch.delenv(bs.CHROMIUM_ENV, raising=False)
    monkeypatch.setattr(bs, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setattr(bs, "OTHER_CHROMIUMS", [tmp_path / "no-chrome"])
    monkeypatch.setattr(bs, "playwright_chromium", lambda: None)


@pytest.mark.parametrize("ci, expected", [("", "skip"), ("true", "fail")])
def test_missing_chromium_skips_on_laptops_but_fails_in_ci(monkeypatch, tmp_path, ci, expected):
    no_browser_anywhere(monkeypatch, tmp_path)
    monkeypatch.setenv("CI", ci)
    outcome = pytest.skip.Exception if expected == "skip" else pytest.fail.Exception
    with pytest.raises(outcome, match="no-chromium is missing.*apt-get install chromium"):
        _require_browser()


def test_chromium_is_looked_for_in_order_and_the_variable_overrides(monkeypatch, tmp_path):
    no_browser_anywhere(monkeypatch, tmp_path)
    chrome = tmp_path / "Google Chrome"
    chrome.write_text("", encoding="utf-8")
    monkeypatch.setattr(bs, "OTHER_CHROMIUMS", [tmp_path / "no-chrome", chrome])
    assert bs.find_chromium() == (chrome, "")
    mine = tmp_path / "my-chromium"
    mine.write_text("", encoding="utf-8")
    monkeypatch.setenv(bs.CHROMIUM_ENV, str(mine))
    assert bs.find_chromium() == (mine, "")
    monkeypatch.setenv(bs.CHROMIUM_ENV, str(tmp_path / "typo"))
    found, missing = bs.find_chromium()  # a wrong path is reported, not silently replaced
    assert found is None and f"{bs.CHROMIUM_ENV}=" in missing and "typo is missing" in missing
