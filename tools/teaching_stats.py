"""Teaching numbers of the solution notebooks (issue #21's "Done when"), one row a chapter.

    python tools/teaching_stats.py                       # every solutions/NN_*.ipynb
    python tools/teaching_stats.py solutions/02_embeddings.ipynb solutions/06_model.ipynb

Columns:
- code: lines of code cells, the `### BEGIN/END SOLUTION` marker lines included (issue #21's
  count: a learner sees them, and its reviewers count them). A line is a logical line: a
  statement, or a comment on a line of its own; one that the formatter spreads over several
  lines (inside brackets, or a long string) counts once, so the numbers do not move with the
  layout;
- longest: the most lines in one code cell;
- solution: lines inside BEGIN/END SOLUTION regions, and their share of `code`;
- exercises: markdown headings `### Exercise N.M: ...` (as `gpt2lib.course.format` reads them);
- stated: of those, how many state difficulty and time, `(difficulty: easy|medium|hard, about K min)`;
- thinking: exercises whose markdown cell has a line `Kind: <kind>` with a kind other than
  `write` (design, derive, predict, debug, measure, explain);
- predict / challenge: markdown cells whose first heading starts with `### Predict` /
  `### Challenge`; `challenge cells`: code cells tagged `challenge`.

Exits 1 when a chapter misses a threshold of #21, or, run over every chapter, when the whole
course's solution share (chapters 01 on) is under 25% (pass --no-fail to only print). Chapter 0 is outside the
size and share limits (the issue names chapters 01 on), not the exercise rules.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
EXERCISE = re.compile(r"^\s{0,3}#{1,6}\s*Exercise\b(.*)$", re.MULTILINE)
STATED = re.compile(r"\(difficulty:\s*(easy|medium|hard),\s*about\s+\d+\s*min\)")
KIND = re.compile(r"^\s*\**Kind:?\**:?\s*\**\s*([a-z]+)", re.MULTILINE | re.IGNORECASE)
FIRST_HEADING = re.compile(r"^\s{0,3}#{1,6}\s*(.*)$", re.MULTILINE)

LIMITS = dict(
    code=350,
    code_ch01=500,
    longest=60,
    share=0.20,
    exercises=4,
    predict=1,
    challenge=1,
    overall_share=0.25,
)
# Chapter 0 (start here: the machine check and a warm-up) is outside issue #21's size and share
# limits, which name chapters 01 on; its exercise, prediction and challenge rules still apply.
SIZE_AND_SHARE_EXEMPT = ("00_",)


def source(cell) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def counted_lines(text: str) -> list[str]:
    """The lines of a code cell that count: those that start a logical line (a statement or a
    comment of its own). A line that continues one (inside brackets, or inside a string that
    spans lines) and a blank line do not count."""
    depth, first_depth = 0, {}  # bracket depth before the first token of each line
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
            ):
                continue
            first_depth.setdefault(token.start[0], depth)
            if token.type == tokenize.OP and token.string in "([{":
                depth += 1
            elif token.type == tokenize.OP and token.string in ")]}":
                depth -= 1
    except (tokenize.TokenError, IndentationError, SyntaxError):  # not Python: every line counts
        return [line for line in text.splitlines() if line.strip()]
    return [
        line
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and first_depth.get(number) == 0
    ]


def stats(path: Path) -> dict:
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = longest = inside = 0
    exercises = stated = thinking = predict = challenge = challenge_cells = 0
    for cell in nb["cells"]:
        text = source(cell)
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code":
            in_region, lines = False, 0
            for line in counted_lines(text):
                stripped = line.strip()
                lines += 1  # marker lines count as code, not as the learner's
                if stripped.startswith(BEGIN):
                    in_region = True
                elif stripped.startswith(END):
                    in_region = False
                else:
                    inside += in_region
            code += lines
            longest = max(longest, lines)
            challenge_cells += "challenge" in tags
        elif cell["cell_type"] == "markdown":
            headings = EXERCISE.findall(text)
            if headings:
                exercises += 1
                stated += bool(STATED.search(headings[-1]))
                kind = KIND.search(text)
                thinking += bool(kind and kind.group(1).lower() not in ("write", "transcribe"))
            first = FIRST_HEADING.search(text)
            if first:
                title = first.group(1).strip().lower()
                predict += title.startswith("predict")
                challenge += title.startswith("challenge")
    return dict(
        chapter=path.stem,
        code=code,
        longest=longest,
        inside=inside,
        share=inside / code if code else 0.0,
        exercises=exercises,
        stated=stated,
        thinking=thinking,
        predict=predict,
        challenge=challenge,
        challenge_cells=challenge_cells,
    )


def misses(row: dict) -> list[str]:
    limit = LIMITS["code_ch01"] if row["chapter"].startswith("01") else LIMITS["code"]
    found = []
    sized = not row["chapter"].startswith(SIZE_AND_SHARE_EXEMPT)
    if sized and row["code"] > limit:
        found.append(f"{row['code']} code lines > {limit}")
    if row["longest"] > LIMITS["longest"]:
        found.append(f"a cell of {row['longest']} lines > {LIMITS['longest']}")
    if sized and row["share"] < LIMITS["share"]:
        found.append(f"solution share {row['share']:.0%} < {LIMITS['share']:.0%}")
    if row["exercises"] < LIMITS["exercises"]:
        found.append(f"{row['exercises']} exercises < 4")
    if row["stated"] < row["exercises"]:
        found.append("an exercise without difficulty and time")
    if 2 * row["thinking"] < row["exercises"]:
        found.append(
            f"only {row['thinking']} of {row['exercises']} exercises are not transcription"
        )
    if row["predict"] < 1:
        found.append("no ### Predict prompt")
    if row["challenge"] < 1 or row["challenge_cells"] < 1:
        found.append("no ### Challenge with a `challenge` cell")
    return found


def course_share(rows: list[dict]) -> tuple[int, int]:
    """(code lines, learner's lines) over the chapters the size and share limits apply to."""
    sized = [r for r in rows if not r["chapter"].startswith(SIZE_AND_SHARE_EXEMPT)]
    return sum(r["code"] for r in sized), sum(r["inside"] for r in sized)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--no-fail", action="store_true", help="print only; exit 0")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    rows = [stats(p) for p in paths]
    header = (
        f"{'chapter':<18} {'code':>5} {'longest':>7} {'solution':>13} {'exercises':>9} "
        f"{'stated':>6} {'thinking':>8} {'predict':>7} {'challenge':>9}"
    )
    print(header)
    failed = False
    for r in rows:
        print(
            f"{r['chapter']:<18} {r['code']:>5} {r['longest']:>7} {r['inside']:>6} ({r['share']:4.0%}) "
            f"{r['exercises']:>9} {r['stated']:>6} {r['thinking']:>8} {r['predict']:>7} "
            f"{r['challenge']:>5} ({r['challenge_cells']})"
        )
    total_code, total_inside = course_share(rows)
    if total_code:
        print(
            f"{'all from 01':<18} {total_code:>5} {'':>7} {total_inside:>6} ({total_inside / total_code:4.0%})"
        )
    for r in rows:
        for miss in misses(r):
            failed = True
            print(f"{r['chapter']}: {miss}")
    if not args.notebooks and total_code and total_inside / total_code < LIMITS["overall_share"]:
        failed = True
        print(
            f"all: solution share {total_inside / total_code:.1%} < {LIMITS['overall_share']:.0%}"
        )
    return 0 if args.no_fail or not failed else 1


if __name__ == "__main__":
    sys.exit(main())
