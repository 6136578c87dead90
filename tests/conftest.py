"""Hooks for tests/ only (the shared set-up is the root conftest.py).

A skipped browser test says why in the run's summary, without `-rs`: the browser tests skip
on a machine without Chromium or Playwright, and a dozen bare "s" gave a learner no way to
know that a browser was missing, or how to install one.
"""

from __future__ import annotations

BROWSER_SKIP_PREFIX = "browser test skipped: "  # what tests/test_browser.py puts in front


def skip_reason(report) -> str:
    """The text a skipped test gave pytest.skip(), or '' if there is none."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return ""


def browser_skip_lines(reports) -> list[str]:
    """One line per distinct reason the browser tests were skipped, with how many it skipped."""
    counts: dict[str, int] = {}
    for report in reports:
        reason = skip_reason(report)
        if reason.startswith(BROWSER_SKIP_PREFIX):
            reason = reason.removeprefix(BROWSER_SKIP_PREFIX)
            counts[reason] = counts.get(reason, 0) + 1
    return [
        f"{n} browser test{'s' if n != 1 else ''} skipped: {reason} (see the README's Test section)"
        for reason, n in counts.items()
    ]


def pytest_terminal_summary(terminalreporter):
    for line in browser_skip_lines(terminalreporter.stats.get("skipped", [])):
        terminalreporter.write_line(line, yellow=True, bold=True)
