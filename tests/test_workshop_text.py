"""The workshop texts say what the notebooks do (issue 41: `num_parallel_calls=8` where notebook
05 uses 32, `bash repro/launch.sh` where 11 exports to `repro-data`, exercises whose commands
were not what the notebook runs). No kernels: the texts and the notebooks' sources are read.

What is checked, in docs/workshop.md and docs/facilitator.md:

- Every magic line they quote (inline or in a code block) parses with that magic's own
  arguments, and every ``%tfdist_inject`` kind is one there is.
- Every repository path they name (``docs/...``, ``examples/...``, ``binder/...``) exists.
- In a part about one notebook (a heading, or a paragraph opening ``**NN ...``, that names it:
  ``06_deadlock_stall``, ``notebook 06``, ``: 06`` at a heading's end; a paragraph that names one
  notebook is about that one), every inline code span that is a magic line, a ``--flag value``,
  a numeric ``name=N`` setting, a ``tfdist-*`` file or a ``DIR/launch.sh`` occurs in that notebook's
  code cells. Code the students are to type (an exercise's new cells or changed lines) goes in
  fenced code blocks, which only have to parse.
- The same holds for each notebook's own markdown against its own code, and a flag its text says
  every cell runs with is on every cell that sets it.
- The timetable adds up: each block starts when the one before ends, the core plan ends with
  slack before the 90 minutes, and each block's minutes are its parts' sum as the plan states
  them (measured run time + reading + exercises).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DOCS = [REPO / "docs" / "workshop.md", REPO / "docs" / "facilitator.md"]
NOTEBOOKS = {p.stem[:2]: p for p in sorted(EXAMPLES.glob("*.ipynb"))}
#: a setting the text names one way and the code another: 05's pipeline takes the number of reads
#: in flight as ``parallel_reads`` and passes it on as ``num_parallel_calls``
ALIASES = {"num_parallel_calls": ("parallel_reads",)}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")  # inline code, which may wrap a line
STEM = re.compile(r"\b(0[1-9]|1[01])_[a-z]")
NOTEBOOK_WORD = re.compile(r"\bnotebooks? (0[1-9]|1[01])\b")
HEADING_LIST = re.compile(r":\s*((?:0[1-9]|1[01])(?:\s*,\s*(?:0[1-9]|1[01]))*)\s*$")
BOLD_OPENING = re.compile(r"^\*\*(0[1-9]|1[01])\b")


@cache
def code_of(number: str) -> str:
    nb = nbformat.read(NOTEBOOKS[number], as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


@cache
def markdown_of(number: str) -> str:
    nb = nbformat.read(NOTEBOOKS[number], as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def squeeze(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------- the text, in parts


@dataclass
class Part:
    """One paragraph (or list item, or table) of a text, with the notebook it is about."""

    where: str
    text: str
    notebook: str | None


def paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks, with list items apart, fenced code left out."""
    blocks: list[str] = []
    for block in re.split(r"\n\s*\n", FENCE.sub("\n\n", text)):
        items = re.split(r"\n(?=\s*(?:[-*]|\d+\.) )", block)
        blocks.extend(item.strip() for item in items if item.strip())
    return blocks


def mentioned(text: str) -> set[str]:
    found = set(STEM.findall(text)) | set(NOTEBOOK_WORD.findall(text))
    return {n for n in found if n in NOTEBOOKS}


def parts_of(name: str, text: str) -> list[Part]:
    parts, current = [], None
    for block in paragraphs(text):
        if block.startswith("#"):
            heading = block.splitlines()[0]
            listed = HEADING_LIST.search(heading)
            named = mentioned(heading) | (set(re.split(r"\s*,\s*", listed.group(1)))
                                          if listed else set())
            current = named.pop() if len(named) == 1 else None
            continue
        opening = BOLD_OPENING.match(block)
        if opening:
            current = opening.group(1)
        named = mentioned(block)
        about = named.pop() if len(named) == 1 and not opening else current
        parts.append(Part(f"{name}: {block[:60]!r}", block, about))
    return parts


# ------------------------------------------------------------------- claims in a code span


def magic_lines(text: str) -> list[str]:
    """The lines of ``text`` that call a magic: ``%name ...`` or ``%%name ...``, also after an
    assignment (``report = %tfdist_check env``)."""
    found = []
    for line in text.splitlines():
        m = re.search(r"(?:^|=\s*)(%%?[a-z_]+\b.*)$", line.strip())
        if m:
            found.append(m.group(1).split("  #")[0].strip())
    return found


PLACEHOLDER = re.compile(r"\s(?:[A-Z][A-Z_]*|[A-Z]+(?:\\?\|\w+)+)(?=\s|$)")
VALUED_FLAG = re.compile(r"--[a-z][a-z-]*[ =][^-\s]")


def claims(span: str, runs: bool = True) -> list[str]:
    """What an inline code span says the notebook has: the span itself when it is a magic line
    (up to a placeholder such as ``EXPR``), a flag with its value, or a numeric setting
    (``num_parallel_calls=32``); the ``tfdist-*`` files and ``DIR/launch.sh`` directories named
    in it. A bare ``--flag`` names an option, not something run. ``runs=False`` (a notebook's
    own text, which also names the tools other notebooks show): a magic line only with a flag's
    value in it (``%tfdist_inject hang --on 1``)."""
    span = squeeze(span)
    out = []
    if span.startswith("%"):
        line = PLACEHOLDER.split(span)[0].strip()
        if runs or VALUED_FLAG.search(line):
            out.append(line)
    elif ((span.startswith("--") and VALUED_FLAG.match(span))
          or re.fullmatch(r"[A-Za-z_]\w*=\d[\d.]*", span)):
        out.append(span)
    out += re.findall(r"\btfdist-[\w.-]*\w", span)
    out += [m + "/" for m in re.findall(r"([\w.-]+)/launch\.sh", span)]
    return out


def in_code(claim: str, code: str) -> bool:
    if claim.endswith("/"):  # DIR/launch.sh: the notebook exports (or writes) DIR
        return bool(re.search(rf"(?<![\w-]){re.escape(claim[:-1])}(?![\w-])", code))
    if squeeze(claim) in squeeze(code):
        return True
    name, _, value = claim.partition("=")
    return any(f"{alias}={value}" in code for alias in ALIASES.get(name, ()))


# ------------------------------------------------------------------- magics, without a kernel


@cache
def magic_methods() -> dict[str, object]:
    from tfdist_nb.magics.tfcluster import MAGICS

    methods = {}
    for cls in MAGICS:
        for kind in ("line", "cell"):
            for name, attr in cls.magics.get(kind, {}).items():
                methods[name] = getattr(cls, attr)
    return methods


def parse_error(line: str) -> str | None:
    """Why ``line`` (``%name args`` or ``%%name args``) is not a valid tfdist magic line, or
    None. Lines of other magics (``%run``, ``%%writefile``) are not ours to check."""
    from IPython.core.error import UsageError

    from tfdist_nb.worker.inject import KINDS

    name, _, rest = PLACEHOLDER.split(line)[0].lstrip("%").partition(" ")
    if not (name.startswith("tfdist") or name == "tfcluster"):
        return None
    method = magic_methods().get(name)
    if method is None:
        return f"no magic %{name}"
    parser = getattr(method, "parser", None)
    if parser is None or not rest.strip():  # the magic named, not called
        return None
    try:
        args = parser.parse_args(shlex.split(rest))
    except (UsageError, SystemExit, ValueError) as exc:
        return f"{line!r}: {exc}"
    if name == "tfdist_inject" and args.kind not in (*KINDS, "clear"):
        return f"{line!r}: no fault {args.kind!r}"
    return None


# ------------------------------------------------------------------- the tests


def texts() -> list[tuple[str, str]]:
    return [(p.name, p.read_text()) for p in DOCS if p.exists()]


def test_both_texts_are_there() -> None:
    assert [name for name, _ in texts()] == ["workshop.md", "facilitator.md"]


@pytest.mark.parametrize("doc", [p.name for p in DOCS])
def test_every_magic_line_a_text_quotes_parses(doc: str) -> None:
    text = (REPO / "docs" / doc).read_text()
    lines = [s for s in SPAN.findall(FENCE.sub("", text)) if s.startswith("%")]
    for block in FENCE.findall(text):
        lines += magic_lines(block)
    assert lines, doc
    wrong = [err for line in lines if (err := parse_error(squeeze(line)))]
    assert not wrong, wrong


@pytest.mark.parametrize("doc", [p.name for p in DOCS])
def test_every_repository_path_a_text_names_exists(doc: str) -> None:
    text = (REPO / "docs" / doc).read_text()
    paths = set(re.findall(r"\b((?:docs|examples|binder|tests|tfdist_nb)/[\w./-]*\w)", text))
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, missing


@pytest.mark.parametrize("doc", [p.name for p in DOCS])
def test_what_a_text_says_of_a_notebook_is_in_that_notebooks_code(doc: str) -> None:
    text = (REPO / "docs" / doc).read_text()
    wrong = []
    for part in parts_of(doc, text):
        if part.notebook is None:
            continue
        for span in SPAN.findall(part.text):
            for claim in claims(span):
                if not in_code(claim, code_of(part.notebook)):
                    wrong.append(f"{part.where}: notebook {part.notebook} has no {claim!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_what_a_notebook_says_is_in_its_own_code(number: str) -> None:
    wrong = []
    for span in SPAN.findall(FENCE.sub("", markdown_of(number))):
        for claim in claims(span, runs=False):
            if not in_code(claim, code_of(number)):
                wrong.append(f"{NOTEBOOKS[number].name}: its text names {claim!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_a_flag_said_of_every_cell_is_on_every_cell(number: str) -> None:
    """"Every cell below runs with `--stall-timeout 120`" (06, whose section 5 used 6): a value
    a notebook's text gives a flag for every cell is the value of every cell that sets it."""
    text = " ".join(markdown_of(number).split())
    for sentence in re.split(r"(?<=[.:;])\s", text):
        if not re.search(r"\bevery cell\b", sentence, re.I):
            continue
        for flag, value in re.findall(r"`(--[a-z-]+)[ =]([^`\s]+)`", sentence):
            used = set(re.findall(rf"{flag}[ =](\S+)", code_of(number)))
            assert used == {value}, (NOTEBOOKS[number].name, sentence, used)


def test_the_parts_of_the_texts_are_found() -> None:
    """The checks above see something: each text has parts about most notebooks."""
    for name, text in texts():
        about = {p.notebook for p in parts_of(name, text)} - {None}
        assert len(about) >= 9, (name, sorted(str(n) for n in about))


# ------------------------------------------------------------------- the timetable

ROW = re.compile(r"^\|\s*(\d):(\d\d)\s*\|\s*(\d+)\s*\|([^\n]*)$", re.M)
BLOCK = re.compile(r"^##+ (\d):(\d\d) .*?\((\d+) min(?:: ([^)]*))?\)", re.M)


def test_the_timetable_adds_up_and_leaves_slack() -> None:
    text = (REPO / "docs" / "workshop.md").read_text()
    rows = [(int(h) * 60 + int(m), int(n), rest) for h, m, n, rest in ROW.findall(text)]
    assert len(rows) >= 6, rows
    for (start, minutes, _), (after, _, _) in pairwise(rows):
        assert start + minutes == after, rows
    end = rows[-1][0] + rows[-1][1]
    assert end == 90, end  # the workshop's own length
    slack = [minutes for _, minutes, rest in rows if "slack" in rest.lower()]
    assert slack and slack[0] >= 5, rows  # time left over for the laptop that will not start
    # each block's heading repeats its row, and its minutes are the sum of its parts
    blocks = {(int(h) * 60 + int(m)): (int(n), sums) for h, m, n, sums in BLOCK.findall(text)}
    for start, minutes, rest in rows:
        if "slack" in rest.lower() or "break" in rest.lower():
            continue
        assert start in blocks, (start, sorted(blocks))
        said, sums = blocks[start]
        assert said == minutes, (start, said, minutes)
        parts = [int(x) for x in re.findall(r"(\d+) (?:run|read|ex)", sums or "")]
        assert parts and sum(parts) == minutes, (start, sums, minutes)
