"""The code blocks of the project's markdown (README.md, docs/*.md) and the marks that say how
the docs test runs them.

A mark is an HTML comment on the line right before a fence (blank lines between are allowed):

    <!-- doc-test: skip: REASON -->     not run; REASON says why (a GPU, a server that runs
                                         until stopped, a package install, ...)
    <!-- doc-test: compile-only -->     run in full here; it compiles for a GPU target and
                                         launches nothing (the test checks a cuda kernel came out)
    <!-- doc-test: daemon -->           run with TILED_SERVER pointing at a real daemon
    <!-- doc-test: continues -->        run in the namespace the previous python block of the
                                         same file left (it uses what that block defined)

Flags other than skip combine with commas: `<!-- doc-test: daemon, continues -->`. A python
or bash block without a mark runs in a fresh namespace (python) or a fresh shell (bash). Blocks
of other languages (yaml, json, plain text) are never run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_LANGUAGES = ("python", "bash")
FLAGS = ("compile-only", "daemon", "continues")
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARK = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    path: Path  # the markdown file
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    flags: set[str] = field(default_factory=set)
    skip: str | None = None  # the reason, when the block is marked skip

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


class MarkError(ValueError):
    """A doc-test mark that does not parse, or that is not followed by a block it can mark."""


def markdown_files() -> list[Path]:
    """README.md and every docs/*.md, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse_mark(text: str, where: str) -> tuple[set[str], str | None]:
    """(flags, skip reason) of a mark's text; MarkError naming `where` when it is malformed."""
    if text.startswith("skip"):
        reason = text[len("skip"):].lstrip()
        if not reason.startswith(":") or not reason[1:].strip():
            raise MarkError(f"{where}: a skip mark must say why: <!-- doc-test: skip: REASON -->")
        return set(), reason[1:].strip()
    flags = {f.strip() for f in text.split(",")}
    unknown = flags - set(FLAGS)
    if unknown or not text:
        raise MarkError(f"{where}: unknown doc-test mark {text!r}; marks are skip: REASON, "
                        f"{', '.join(FLAGS)}")
    return flags, None


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of `path`, with the mark before it applied. Raises MarkError for a
    malformed mark, a mark on a block that is never run, or one that marks no block."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    pending: tuple[int, str] | None = None  # (line, mark text) awaiting its fence
    i = 0
    while i < len(lines):
        line = lines[i]
        mark = _MARK.match(line)
        fence = _FENCE.match(line)
        if mark:
            if pending:
                raise MarkError(f"{path.name}:{pending[0]}: a doc-test mark marks no block")
            pending = (i + 1, mark.group(1))
        elif fence:
            start, language = i, fence.group(1)
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                i += 1
            block = Block(path, start + 1, language, "\n".join(lines[start + 1:i]) + "\n")
            if pending:
                where = f"{path.name}:{pending[0]}"
                if language not in RUN_LANGUAGES:
                    raise MarkError(f"{where}: a doc-test mark on a {language or 'plain'} "
                                    "block, which is never run")
                block.flags, block.skip = parse_mark(pending[1], where)
                pending = None
            out.append(block)
        elif line.strip() and pending:
            raise MarkError(f"{path.name}:{pending[0]}: a doc-test mark must come right before "
                            "a fenced block")
        i += 1
    if pending:
        raise MarkError(f"{path.name}:{pending[0]}: a doc-test mark marks no block")
    return out


def all_blocks(language: str | None = None) -> list[Block]:
    """The blocks of every markdown file, of `language` when given."""
    return [b for p in markdown_files() for b in blocks_of(p)
            if language is None or b.language == language]
