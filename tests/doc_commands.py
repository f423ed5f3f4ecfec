"""The commands and Python snippets that README.md and docs/*.md show, taken from the text.

A *command* is a logical line of a ```bash block (continuation lines joined), a line of a plain
``` block that starts with a known program, or an inline code span that starts with one.

What a command needs that the test machine lacks is said in the text, where a reader sees it:

* a ```bash block whose first line is `# needs: <what>` (every command of the block);
* `(needs <what>; ...)` right after an inline code span;
* a page's `**Needs <what>:** every `prog` ... command` line (every such program on the page).

Placeholders a reader fills in are UPPERCASE words from `PLACEHOLDERS` (HEAD, BUCKET, ...), or
`<...>`, `[...]`, `...` and ` | `: a command with one is a synopsis, checked against the real
program's `--help`. A bare mention (`ray job submit`, `ray-ormas train`) is checked the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = {
    "ray-ormas",
    "ray",
    "python",
    "python3",
    "python3.11",
    "pip",
    "kubectl",
    "helm",
    "docker",
    "kind",
    "mlflow",
    "ormas-monitor",
    "grep",
    "export",
}
PLACEHOLDERS = {"HEAD", "BUCKET", "REGISTRY", "CONFIG.yaml", "RUN", "DIR", "N", "NAME", "KEY=VALUE", "SUBMISSION_ID"}
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")
PAGE_NEEDS = re.compile(r"\*\*Needs ([^:*]+):\*\*\s*every (.*?) command", re.S)
INLINE_NEEDS = re.compile(r"\s*\(needs ([^;)]+)")
TRAILING_COMMENT = re.compile(r"\s+#\s.*$")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class DocCommand:
    """One command as a document shows it.

    Attributes:
        doc: the document, relative to the repository root.
        line: its line in the document (1-based).
        text: the command, continuation lines joined, trailing comment removed.
        needs: what it needs that this machine lacks, as the text says (None: nothing).
        block: (doc, first line) of its fenced block; None for an inline span.
    """

    doc: str
    line: int
    text: str
    needs: str | None
    block: tuple[str, int] | None

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def words(self) -> list[str]:
        return self.text.split()

    @property
    def program(self) -> str:
        return self.words[0]

    def has_placeholder(self) -> bool:
        if any(mark in self.text for mark in ("<", "...", " | ")) or re.search(r"\s\[", self.text):
            return True
        return any(part in PLACEHOLDERS for word in self.words for part in re.split(r"[/:@=]", word)) or any(
            word in PLACEHOLDERS for word in self.words
        )

    def is_mention(self) -> bool:
        """Only a program and sub-command words (`ray job submit`): a name, not a command line."""
        return (
            self.block is None
            and all(re.fullmatch(r"[a-z][a-z-]*", w) for w in self.words[1:])
            and self.program in ("ray", "ray-ormas", "mlflow", "ormas-monitor", "kubectl")
        )


@dataclass(frozen=True)
class Snippet:
    doc: str
    line: int
    code: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def install(self) -> str | None:
        """The `pip install ...` its first line says it needs, if any."""
        first = self.code.splitlines()[0] if self.code else ""
        return first.removeprefix("# needs:").strip() if first.startswith("# needs: pip install ") else None


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _page_needs(text: str) -> dict[str, str]:
    needs: dict[str, str] = {}
    for what, programs in PAGE_NEEDS.findall(text):
        for program in re.findall(r"`([\w.-]+)`", programs):
            needs[program] = what.strip()
    return needs


def _block_commands(doc: str, text: str, match: re.Match) -> list[DocCommand]:
    lang, body = match.group(1), match.group(2)
    first = _line_of(text, match.start()) + 1
    lines = body.splitlines()
    needs = None
    head = next((ln.strip() for ln in lines if ln.strip()), "")
    if head.startswith("# needs:"):
        needs = head.removeprefix("# needs:").strip()
    commands: list[DocCommand] = []
    pending, start = "", 0
    for i, raw in enumerate(lines):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if not pending:
            start = first + i
            if lang not in ("bash", "sh", "shell") and stripped.split()[0] not in PROGRAMS:
                continue
        line = TRAILING_COMMENT.sub("", stripped)
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        commands.append(DocCommand(doc, start, (pending + line).strip(), needs, (doc, first - 1)))
        pending = ""
    return commands


def harvest(paths: list[Path] | None = None) -> list[DocCommand]:
    """Every command shown in README.md and docs/*.md, in document order."""
    found: list[DocCommand] = []
    for path in paths or documents():
        doc = str(path.relative_to(ROOT))
        text = path.read_text()
        page = _page_needs(text)
        blocks = list(FENCE.finditer(text))
        in_blocks: list[DocCommand] = []
        for m in blocks:
            if m.group(1) in ("python", "json", "yaml", "text"):
                continue
            in_blocks.extend(_block_commands(doc, text, m))
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        inline: list[DocCommand] = []
        for m in SPAN.finditer(prose):
            words = m.group(1).split()
            if len(words) < 2 or words[0] not in PROGRAMS:
                continue
            after = INLINE_NEEDS.match(prose, m.end())
            needs = after.group(1).strip() if after else page.get(words[0])
            inline.append(DocCommand(doc, _line_of(prose, m.start()), " ".join(words), needs, None))
        for c in in_blocks:
            found.append(
                c if c.needs or c.program not in page else DocCommand(c.doc, c.line, c.text, page[c.program], c.block)
            )
        found.extend(inline)
    return sorted(found, key=lambda c: (c.doc, c.line))


def snippets(paths: list[Path] | None = None) -> list[Snippet]:
    """The ```python blocks of README.md, docs/quickstart.md and docs/adoption.md: complete
    programs. One whose first line is `# needs: pip install ...` needs that installed first."""
    found = []
    for path in paths or [ROOT / "README.md", ROOT / "docs" / "quickstart.md", ROOT / "docs" / "adoption.md"]:
        text = path.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) == "python":
                found.append(Snippet(str(path.relative_to(ROOT)), _line_of(text, m.start()), m.group(2)))
    return found
