"""Python code blocks of markdown pages (the README, the docs), for the tests that run them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class CodeBlock:
    path: Path
    line: int
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


def python_blocks(path: Path) -> list[CodeBlock]:
    """Every ```` ```python ```` block of ``path`` with the line its code starts on."""
    text = path.read_text(encoding="utf-8")
    return [CodeBlock(path, text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in _FENCE.finditer(text)]


def run_block(block: CodeBlock, namespace: dict) -> None:
    """Execute one block in ``namespace``; a failure names the file and line it came from."""
    # dont_inherit: the block runs as a reader runs it, not under this module's __future__ imports
    code = compile(block.code, f"{block.path}:{block.line}", "exec", dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - running the documented examples is the test
