"""How tokens are counted: bytes (the default), a local `tokenizer.json`, or the server's `usage`.

`bytes` counts one token per UTF-8 byte, which is what the reference server's demo text models
do, and needs nothing installed. A path names a Hugging Face `tokenizer.json` read with the
`tokenizers` package (`pip install tokenizers`); nothing is downloaded. `usage` takes the counts
the server reports in its `usage` object (OpenAI's `prompt_tokens` / `completion_tokens`) and
counts nothing itself; synthetic prompts are then built by bytes. The results say which was used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from perfkit.errors import PerfkitError

__all__ = ["BYTES", "USAGE", "ByteTokenizer", "FileTokenizer", "Tokenizer", "load_tokenizer"]

BYTES = "bytes"
USAGE = "usage"


class Tokenizer(Protocol):
    @property
    def name(self) -> str: ...

    def count(self, text: str) -> int: ...

    def truncate(self, text: str, tokens: int) -> str:
        """The longest start of `text` that is at most `tokens` tokens."""
        ...


class ByteTokenizer:
    name = BYTES

    def count(self, text: str) -> int:
        return len(text.encode())

    def truncate(self, text: str, tokens: int) -> str:
        return text.encode()[:tokens].decode(errors="ignore")


class FileTokenizer:
    def __init__(self, path: Path, tokenizer: Any) -> None:
        self.name = str(path)
        self._tokenizer = tokenizer

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def truncate(self, text: str, tokens: int) -> str:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids[:tokens]
        return str(self._tokenizer.decode(ids))


def load_tokenizer(name: str) -> Tokenizer:
    """The tokenizer `--tokenizer NAME` names (`usage` builds prompts by bytes)."""
    if name in (BYTES, USAGE):
        return ByteTokenizer()
    path = Path(name)
    if not path.is_file():
        raise PerfkitError(
            f"--tokenizer {name}: no such file; give a local tokenizer.json, '{BYTES}' (1 byte = 1 token) "
            f"or '{USAGE}' (the server's usage figures)"
        )
    try:
        # Deferred: an optional package, needed only for this flag.
        from tokenizers import Tokenizer as HfTokenizer
    except ImportError:
        raise PerfkitError(f"--tokenizer {name}: reading a tokenizer.json needs `pip install tokenizers`") from None
    try:
        return FileTokenizer(path, HfTokenizer.from_file(str(path)))
    except Exception as exc:
        raise PerfkitError(f"--tokenizer {name}: not a tokenizer.json the tokenizers package reads ({exc})") from None
