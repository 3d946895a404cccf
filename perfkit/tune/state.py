"""What a `perfkit tune` is asked for and what it keeps: the validated `TuneSpec`, the model
read from its config.pbtxt, one `Record` per variant, the `TuneResult`, and the `Checkpoint` that a
resumed tune reads its measurements from. No measuring happens here; `perfkit.tune.tuner` drives the tune.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.errors import PerfkitError
from perfkit.measure.level import WindowSpec
from perfkit.results.files import write_text_atomic
from perfkit.results.model import RESULT_SCHEMA_VERSION, LevelResult, sweep_from_json, to_jsonable
from perfkit.target import TargetSpec
from perfkit.tune.objectives import Constraint, Figures, Objective, Ranking, combine, figures_of, rank
from perfkit.tune.space import Space, SpaceSpec, Variant, variant_of
from v2kit.model_config import ConfigError, config_to_json, parse_config_text

CHECKPOINT_SCHEMA = 1
#: --search: model_analyzer's brute and quick, and a model-based one (`perfkit.tune.bayesian`).
SEARCHES = ("brute", "quick", "bayesian")


@dataclass(frozen=True, slots=True)
class TuneSpec:
    config_path: Path
    #: -u (the first of several), -i, -H (in tune.json only within argv, redacted), TLS, --request-timeout.
    target: TargetSpec = field(default_factory=lambda: TargetSpec(None))
    search: str = "brute"
    objective: Objective = field(default_factory=Objective)
    constraints: tuple[Constraint, ...] = ()
    concurrency: tuple[int, int] = (1, 1024)
    #: With --request-rate-range START:END, each variant gets the request-rate search (open loop)
    #: over these rates instead of the concurrency sweep; (0, 0): concurrency.
    request_rates: tuple[int, int] = (0, 0)
    request_distribution: str = "constant"
    #: --search bayesian: at most this many variants measured (the default's included).
    budget: int = 0
    space: SpaceSpec = field(default_factory=SpaceSpec)
    windows: WindowSpec = field(default_factory=lambda: WindowSpec(interval_ms=1000.0, warmup_request_count=20))
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    input_data: str = "random"
    seed: int = 0
    top: int = 3
    leaders: int = 3
    remeasure_rounds: int = 2
    checkpoint: Path | None = None
    output_dir: Path | None = None
    quiet: bool = False
    collect_metrics: bool = False
    metrics_url: str | None = None
    #: Several servers, each measured by its own Ray actor (`perfkit.tune.distributed`); () with one.
    endpoints: tuple[str, ...] = ()
    workers: int = 0  # Ray actors, one per endpoint; 0: measured in this process, one variant at a time
    ray_address: str | None = None

    def validate(self) -> None:
        if self.search not in SEARCHES:
            raise PerfkitError(f"--search must be one of {', '.join(SEARCHES)}, got '{self.search}'")
        if self.budget < 0 or (self.budget and self.search != "bayesian"):
            raise PerfkitError(
                "--search-budget N (N >= 2 variants) applies to --search bayesian; add it or drop the budget"
            )
        if self.search == "bayesian" and self.budget == 1:
            raise PerfkitError("--search-budget 1 measures only the default; give 2 or more")
        if not 1 <= self.concurrency[0] <= self.concurrency[1]:
            raise PerfkitError("--concurrency-range START:END needs 1 <= START <= END")
        if self.rate_mode and not 1 <= self.request_rates[0] <= self.request_rates[1]:
            raise PerfkitError("--request-rate-range START:END needs whole requests per second, 1 <= START <= END")
        if self.request_distribution not in ("constant", "poisson"):
            raise PerfkitError(f"--request-distribution must be constant or poisson, got '{self.request_distribution}'")
        self.space.validate()
        for flag, value in (("--top", self.top), ("--leaders", self.leaders)):
            if value < 1:
                raise PerfkitError(f"{flag} must be at least 1")
        if self.remeasure_rounds < 0:
            raise PerfkitError("--remeasure must be 0 (no re-measurement) or more rounds")
        self._validate_workers()
        # The measurement and connection flags are perfkit sweep's, checked by its own rules.
        for url in self.endpoints or (self.target.url,):
            dataclasses.replace(self.target, url=url).validate()
        self.windows.validate()

    @property
    def rate_mode(self) -> bool:
        """Whether variants are searched by request rate (open loop) rather than concurrency."""
        return self.request_rates != (0, 0)

    @property
    def load_mode(self) -> str:
        return "request_rate" if self.rate_mode else "concurrency"

    def _validate_workers(self) -> None:
        if self.workers < 0:
            raise PerfkitError(f"--workers must be 1 or more Ray actors, got {self.workers}")
        if self.ray_address is not None and not self.workers:
            raise PerfkitError("--ray-address applies with --workers N; add it, or leave --ray-address out")
        if not self.workers:
            if len(self.endpoints) > 1:
                raise PerfkitError("several -u endpoints are measured by Ray actors: add --workers N, one per -u")
            return
        if not self.endpoints:
            raise PerfkitError("--workers needs -u endpoints: each Ray actor measures a server of its own")
        if len(set(self.endpoints)) != len(self.endpoints):
            raise PerfkitError("-u names the same endpoint twice; give each server once")
        if self.workers != len(self.endpoints):
            raise PerfkitError(
                f"--workers {self.workers} runs one Ray actor per endpoint: give {self.workers} -u endpoints "
                f"(got {len(self.endpoints)}), or --workers {len(self.endpoints)}"
            )
        if self.metrics_url is not None and len(self.endpoints) > 1:
            raise PerfkitError(
                "--metrics-url names one server; with several -u leave it out (each endpoint's metrics are read "
                "from port 8002 of its host)"
            )


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    folder: Path
    base: dict[str, Any]  # config.pbtxt as Triton's JSON


def read_model(config_path: Path) -> Model:
    """The model whose folder holds `config_path`; the config as the JSON the load API takes."""
    try:
        text = config_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"{config_path}: cannot read the model configuration: {exc}") from None
    try:
        config = parse_config_text(text, config_path)
    except ConfigError as exc:
        raise PerfkitError(str(exc)) from None
    folder = config_path.resolve().parent
    if config.name and config.name != folder.name:
        raise PerfkitError(
            f"{config_path}: name '{config.name}' differs from its folder '{folder.name}' (Triton's rule)"
        )
    config.name = folder.name
    return Model(folder.name, folder, config_to_json(config))


class DefaultRefused(PerfkitError):
    """The server would not load the model's own configuration, the first variant of every tune:
    every variant would be refused the same way, so the tune stops (exit 2, nothing measured)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(
            f"the server cannot load {what} (the default variant, tried first), so no variant can be measured; "
            f"the server said: {reason.strip().rstrip(';')}. Fix the model (its files, its config.pbtxt) until it "
            "loads, then tune again"
        )


# --- what a tune keeps ----------------------------------------------------------------------------


@dataclass(slots=True)
class Record:
    variant: Variant
    config: dict[str, Any]
    default: bool
    status: str = "pending"  # ok | failed
    error: str = ""
    levels: list[LevelResult] = field(default_factory=list)
    chosen: int | None = None
    remeasures: list[LevelResult] = field(default_factory=list)
    measured: int = 0  # levels measured by this run (the rest came from the checkpoint)
    endpoint: str = ""  # the server that measured it, with --workers
    refused: bool = False  # the server would not load it (`error` is its reason)

    def params(self) -> dict[str, Any]:
        """The variant's parameters; with --param values, the knobs as the config it loads has them."""
        if not self.variant.settings:
            return self.variant.params()
        return {**variant_of(self.config).params(), "settings": self.variant.params()["settings"]}

    def figures(self) -> Figures | None:
        return None if self.chosen is None else figures_of(self.levels[self.chosen])

    def combined(self) -> Figures | None:
        first = self.figures()
        if first is None:
            return None
        return combine([first, *(f for f in map(figures_of, self.remeasures) if f is not None)])


@dataclass(slots=True)
class TuneResult:
    spec: TuneSpec
    model: Model
    space: Space
    default_key: str
    records: dict[str, Record] = field(default_factory=dict)
    ranking: Ranking | None = None
    leaders: list[str] = field(default_factory=list)
    completed: bool = False
    stop_reason: str = ""
    server: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    lost_endpoints: list[str] = field(default_factory=list)  # with --workers: "URL: why" for each left out

    def rank(self, final: bool = False) -> Ranking:
        candidates = [(k, r.variant.cost, r.combined() if final else r.figures()) for k, r in self.records.items()]
        remeasured = self.leaders if final and any(self.records[k].remeasures for k in self.leaders) else None
        return rank(candidates, self.spec.objective, self.spec.constraints, remeasured)

    @property
    def best(self) -> Record | None:
        return None if self.ranking is None or self.ranking.best is None else self.records[self.ranking.best]


def levels_from_json(levels: list[Any]) -> list[LevelResult]:
    # Through the sweep reader, which owns LevelResult's JSON form.
    doc = {"schema_version": RESULT_SCHEMA_VERSION, "model": "", "model_version": "", "url": "", "protocol": "",
           "mode": "concurrency"}  # fmt: skip
    return list(sweep_from_json(json.dumps({**doc, "levels": levels, "provenance": {}})).levels)


class Checkpoint:
    """Levels and failures saved as they happen; a resumed tune takes them instead of measuring."""

    def __init__(self, path: Path, fingerprint: dict[str, Any]) -> None:
        self.path, self.fingerprint = path, fingerprint
        self.levels: dict[str, dict[int, LevelResult]] = {}
        self.failures: dict[str, str] = {}
        self.remeasures: dict[str, list[LevelResult]] = {}
        self.default_config: dict[str, Any] | None = None
        self.server_had_model = False
        if not path.exists():
            return
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            found = doc["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PerfkitError(f"--checkpoint {path}: not a tune checkpoint ({exc}); pass another file") from None
        if doc.get("kind") == "tune_combination_checkpoint":
            raise PerfkitError(f"--checkpoint {path} is a tune of several models'; pass a new --checkpoint file")
        differ = sorted(k for k in set(found) | set(fingerprint) if found.get(k) != fingerprint.get(k))
        if doc.get("schema") != CHECKPOINT_SCHEMA or differ:
            raise PerfkitError(
                f"--checkpoint {path} was written by a different tune ({', '.join(differ) or 'schema'} differ); "
                "its measurements would not compare: pass a new --checkpoint file or delete this one"
            )
        for key, entry in doc["variants"].items():
            self.levels[key] = {int(lv.level): lv for lv in levels_from_json(entry["levels"])}
            if entry.get("error"):
                self.failures[key] = entry["error"]
        self.remeasures = {k: levels_from_json(v) for k, v in doc.get("remeasures", {}).items()}
        self.default_config = doc.get("default_config")
        self.server_had_model = bool(doc.get("server_had_model"))

    def save(self, result: TuneResult, default_config: dict[str, Any]) -> None:
        variants = {
            k: {"levels": to_jsonable(r.levels), "error": r.error if r.status == "failed" and not r.levels else ""}
            for k, r in result.records.items()
        }
        remeasures = {k: to_jsonable(r.remeasures) for k, r in result.records.items() if r.remeasures}
        doc = {"schema": CHECKPOINT_SCHEMA, "fingerprint": self.fingerprint, "default_config": default_config,
               "server_had_model": self.server_had_model, "variants": variants, "remeasures": remeasures}  # fmt: skip
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(doc))
