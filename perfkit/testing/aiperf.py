"""Running NVIDIA's AIPerf (from $PERFKIT_PEERS/bin/aiperf, a virtual environment of its own) beside
perfkit, for the peer tests and benchmarks of the generative endpoints.

AIPerf counts tokens with a Hugging Face tokenizer; `write_byte_tokenizer` writes a byte-level one
locally (one token per UTF-8 byte, as the reference server's generative models and perfkit's
default `bytes` count), so nothing is downloaded. It runs with AIPerf's own interpreter, which has
`tokenizers`: perfkit does not depend on it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["aiperf_profile", "aiperf_stat", "write_byte_tokenizer"]

_TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
tokenizer.decoder = decoders.ByteLevel()
tokenizer.save(sys.argv[1])
"""


def write_byte_tokenizer(folder: Path, python: Path) -> Path:
    """A byte-level BPE without merges in `folder` (tokenizer.json and tokenizer_config.json),
    written by `python` (AIPerf's interpreter); returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(python), "-c", _TOKENIZER, str(folder / "tokenizer.json")], check=True, timeout=120)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder


def aiperf_profile(aiperf: Path, args: Sequence[str], out: Path, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run `aiperf profile ARGS` with its artifacts in `out`; returns its summary export
    (profile_export_aiperf.json). RuntimeError with AIPerf's output tail when it fails."""
    command = [str(aiperf), "profile", *args, "--output-artifact-dir", str(out), "--ui-type", "none"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if result.returncode != 0 or not exports:
        raise RuntimeError(f"aiperf exited with {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    document: dict[str, Any] = json.loads(exports[-1].read_text())
    return document


def aiperf_stat(export: dict[str, Any], tag: str, stat: str = "p50") -> float:
    """A figure of AIPerf's summary export (its layout moved between releases: a list of records or
    a mapping by tag)."""
    records = export.get("records", export)
    entry = records.get(tag) if isinstance(records, dict) else next(r for r in records if r.get("tag") == tag)
    if entry is None:
        raise KeyError(f"AIPerf's export has no '{tag}'")
    return float(entry[stat])
