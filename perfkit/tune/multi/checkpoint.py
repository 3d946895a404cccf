"""The checkpoint of a tune of several models: every combination's levels (each measured model's
level), its failure, the leaders' re-measurements, and what the server served before the tune, saved
as they happen. A resumed tune (`--checkpoint FILE`) replays the search against the saved levels
and measures only what is missing, as a one-model tune does (`perfkit.tune.state.Checkpoint`).

The fingerprint holds what makes measurements comparable (the models and their configs, the server,
protocol, windows and inputs); the objective, constraints, weights and search may change between runs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from perfkit.errors import PerfkitError
from perfkit.results.files import write_text_atomic
from perfkit.results.model import LevelResult, to_jsonable
from perfkit.tune.multi.study import CombinationResult, Study
from perfkit.tune.state import TuneSpec, levels_from_json

__all__ = ["CombinationCheckpoint", "fingerprint"]

SCHEMA = 1
KIND = "tune_combination_checkpoint"

Levels = dict[str, LevelResult]  # one level: measured model -> its level


def fingerprint(spec: TuneSpec, study: Study, server: str) -> dict[str, Any]:
    """What must be equal for saved levels to stand beside new ones."""
    return to_jsonable({  # type: ignore[no-any-return]
        "models": {m.name: m.base for m in study.members},
        "endpoint": None if study.endpoint is None else study.endpoint.name,
        "server": server, "protocol": spec.target.protocol, "windows": dataclasses.asdict(spec.windows),
        "shapes": spec.shapes, "input_data": spec.input_data, "seed": spec.seed,
    })  # fmt: skip


def _levels(entries: list[dict[str, Any]]) -> list[Levels]:
    """[{model: level JSON}] back into LevelResults, through the one-model reader."""
    out: list[Levels] = [{} for _ in entries]
    for name in dict.fromkeys(name for entry in entries for name in entry):
        at = [i for i, entry in enumerate(entries) if name in entry]
        for i, level in zip(at, levels_from_json([entries[i][name] for i in at])):
            out[i][name] = level
    return [{name: lv[name] for name in entry if name in lv} for entry, lv in zip(entries, out)]


class CombinationCheckpoint:
    """Saved levels and failures by combination key; `served` is what the server had before the tune."""

    def __init__(self, path: Path, fingerprint: dict[str, Any]) -> None:
        self.path, self.fingerprint = path, fingerprint
        self.levels: dict[str, dict[int, Levels]] = {}  # combination -> concurrency -> levels
        self.failures: dict[str, str] = {}
        self.remeasures: dict[str, list[Levels]] = {}
        self.served: dict[str, dict[str, Any] | None] | None = None
        if not path.exists():
            return
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            found = doc["fingerprint"]
            kind = doc.get("kind")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PerfkitError(f"--checkpoint {path}: not a tune checkpoint ({exc}); pass another file") from None
        if kind != KIND:
            raise PerfkitError(
                f"--checkpoint {path} is the checkpoint of a one-model tune; a tune of several models needs its own: "
                "pass a new --checkpoint file"
            )
        differ = sorted(k for k in set(found) | set(fingerprint) if found.get(k) != fingerprint.get(k))
        if doc.get("schema") != SCHEMA or differ:
            raise PerfkitError(
                f"--checkpoint {path} was written by a different tune ({', '.join(differ) or 'schema'} differ); "
                "its measurements would not compare: pass a new --checkpoint file or delete this one"
            )
        for key, entry in doc["combinations"].items():
            levels = _levels(entry["levels"])
            self.levels[key] = {int(next(iter(lv.values())).level): lv for lv in levels if lv}
            if entry.get("error"):
                self.failures[key] = entry["error"]
        self.remeasures = {k: _levels(v) for k, v in doc.get("remeasures", {}).items()}
        self.served = doc.get("served")

    def save(self, result: CombinationResult, served: dict[str, dict[str, Any] | None]) -> None:
        combinations = {
            k: {
                "levels": [to_jsonable(lv) for lv in r.levels],
                "error": r.error if r.status == "failed" and not r.levels else "",
            }
            for k, r in result.records.items()
        }
        remeasures = {k: [to_jsonable(lv) for lv in r.remeasure_levels] for k, r in result.records.items()}
        doc = {"schema": SCHEMA, "kind": KIND, "fingerprint": self.fingerprint, "served": served,
               "combinations": combinations, "remeasures": {k: v for k, v in remeasures.items() if v}}  # fmt: skip
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(doc))
