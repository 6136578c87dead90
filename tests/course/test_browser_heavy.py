"""The chapters that take minutes in JupyterLab (test_browser.HEAVY), in a module of their own so
that pytest-xdist runs them beside the other chapters' browser runs, not after them."""

from __future__ import annotations

import pytest
from test_browser import (  # noqa: F401  (fixtures are found by name in this module)
    HEAVY,
    _chapter_params,
    browser,
    check_chapter_in_lab,
    lab,
    lab_page,
    page,
    shots,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.mark.parametrize("chapter", list(_chapter_params(HEAVY)))
def test_heavy_chapter_runs_in_jupyterlab(chapter, page, shots):  # noqa: F811 - fixtures
    check_chapter_in_lab(chapter, page, shots)
