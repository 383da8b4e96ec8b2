"""Code snippets of README.md and docs/*.md: fenced and indented code blocks, shell commands with their
continuations, usage synopses and inline ``dsa-runtime ...`` spans, each with its file and line
(``tests/docs/test_snippets.py`` runs or checks them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
DOC_PORT = "127.0.0.1:30000"
SHELL_LANGS = {"", "sh", "bash", "shell", "console"}


@dataclass(frozen=True)
class Snippet:
    path: str  # relative to the checkout: "README.md", "docs/server.md"
    line: int  # 1-based line of the snippet's first line
    kind: str  # "shell", "synopsis", "python", "json", "toml", "text", "inline"
    text: str  # as written (a shell command keeps its continuation lines)

    @property
    def key(self) -> tuple[str, str]:
        return self.path, command_key(self.text) if self.kind == "shell" else self.text.strip()

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def uses_server(self) -> bool:
        return DOC_PORT in self.text or "localhost:30000" in self.text


_LIST_ITEM = re.compile(r"^(\s*)([*+-]|\d+[.)])(\s+)")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
_SYNOPSIS = re.compile(r"\[--?\w")


def strip_comment(line: str) -> str:
    """The line without a trailing shell comment (a ``#`` after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def command_key(command: str) -> str:
    """A command with its continuations joined, comments dropped and spaces collapsed: the allow-list key."""
    parts = [strip_comment(part).rstrip("\\") for part in command.split("\n")]
    return " ".join(" ".join(parts).split())


def code_blocks(text: str) -> list[tuple[str, int, list[str], bool]]:
    """``(language, line of the first body line, body lines, fenced)`` of every fenced and indented code block."""
    lines = text.splitlines()
    blocks: list[tuple[str, int, list[str], bool]] = []
    i, list_indent, prev_blank = 0, None, True
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence and not (fence.group(2)[0] == "`" and "`" in line[fence.end(2):]):
            indent, mark, lang = len(fence.group(1)), fence.group(2), fence.group(3)
            closing = re.compile(rf"^\s*{re.escape(mark[0])}{{{len(mark)},}}\s*$")
            j, body = i + 1, []
            while j < len(lines) and not closing.match(lines[j]):
                body.append(lines[j][indent:] if not lines[j][:indent].strip() else lines[j].lstrip())
                j += 1
            blocks.append((lang.lower(), i + 2, body, True))
            i, prev_blank = j + 1, False
            continue
        if not line.strip():
            i, prev_blank = i + 1, True
            continue
        indent = len(line) - len(line.lstrip())
        need = (list_indent or 0) + 4
        if prev_blank and indent >= need:  # an indented code block (a paragraph line cannot start one)
            j = i
            while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) >= need):
                j += 1
            body = [b[need:] for b in lines[i:j]]
            while body and not body[-1].strip():
                body.pop()
            blocks.append(("", i + 1, body, False))
            i, prev_blank = i + len(body), False
            continue
        item = _LIST_ITEM.match(line)
        if item:
            list_indent = len(item.group(0))
        elif list_indent is not None and prev_blank and indent < list_indent:
            list_indent = None
        i, prev_blank = i + 1, False
    return blocks


def shell_commands(body: list[str], first_line: int) -> list[tuple[int, str]]:
    """``(line, command)``: each non-comment line with its backslash continuations."""
    out, i = [], 0
    while i < len(body):
        if not body[i].strip() or body[i].lstrip().startswith("#"):
            i += 1
            continue
        start, parts = i, [body[i]]
        while strip_comment(body[i]).endswith("\\") and i + 1 < len(body):
            i += 1
            parts.append(body[i])
        out.append((first_line + start, "\n".join(parts).strip()))
        i += 1
    return out


def synopsis_lines(body: list[str], first_line: int) -> list[tuple[int, str]]:
    """``(line, usage)``: each usage line, with the indented lines that continue it."""
    out: list[tuple[int, str]] = []
    for n, line in enumerate(body):
        if not line.strip():
            continue
        if line[0].isspace() and out:
            out[-1] = (out[-1][0], out[-1][1] + " " + line.strip())
        else:
            out.append((first_line + n, line.strip()))
    return out


def inline_spans(text: str) -> list[tuple[int, str]]:
    """``(line, span)`` of every inline code span outside code blocks, line breaks turned into spaces."""
    lines = text.splitlines()
    for _lang, first, body, _fenced in code_blocks(text):
        for n in range(first - 1, first - 1 + len(body)):
            lines[n] = ""
    prose = "\n".join(lines)
    spans = []
    for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", prose, re.S):
        spans.append((prose.count("\n", 0, m.start()) + 1, " ".join(m.group(2).split())))
    return spans


def doc_snippets() -> list[Snippet]:
    snippets: list[Snippet] = []
    for path in DOC_FILES:
        text = (REPO / path).read_text(encoding="utf-8")
        for lang, first, body, _fenced in code_blocks(text):
            if lang in SHELL_LANGS:
                commands = shell_commands(body, first)
                if commands and _SYNOPSIS.search(strip_comment(commands[0][1])):
                    snippets += [Snippet(path, n, "synopsis", s) for n, s in synopsis_lines(body, first)]
                else:
                    snippets += [Snippet(path, n, "shell", c) for n, c in commands]
            elif lang in ("python", "py"):
                snippets.append(Snippet(path, first, "python", "\n".join(body) + "\n"))
            elif lang in ("json", "toml", "text"):
                snippets.append(Snippet(path, first, lang, "\n".join(body) + "\n"))
            else:
                raise AssertionError(f"{path}:{first}: code block in language {lang!r}: teach tests/docs/"
                                     "test_snippets.py how to run it (or mark a diagram ```text)")
        for n, span in inline_spans(text):
            if re.match(r"(\.venv/bin/)?dsa-runtime \S", span):
                snippets.append(Snippet(path, n, "inline", span))
    return snippets
