"""What a sweep shows while it runs, following hyperfine's `--style auto` rules: on a terminal a live
status line per level (rich), with a verdict line left behind when the level ends; when the output
is piped, one plain line per event; nothing at all with `--quiet`. NO_COLOR turns colour off.
With `-v` (perf_analyzer's verbose mode) every window's line is kept on a terminal too, and each
level's verdict is followed by its validity checks, one line each, with the advice of a failed one.

Errors are not progress: the CLI prints them itself, so `--quiet` silences everything here.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from perfkit.results.model import Check, LevelResult, level_name

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status

__all__ = ["Progress"]


def _window_text(label: str, window_index: int, max_trials: int, throughput: float, latency_us: float,
                 stable_so_far: bool, unit: str = "infer/s") -> str:  # fmt: skip
    state = "stable" if stable_so_far else "not stable yet"
    return (
        f"{label}: window {window_index + 1}/{max_trials}: {throughput:.1f} {unit}, "
        f"latency {latency_us / 1000:.3f} ms, {state}"
    )


def _verdict_text(result: LevelResult) -> str:
    tokens = result.tokens  # a generative level: requests/s, its tokens/s and its token latencies
    parts = [f"{result.throughput_infer_per_s:.1f} {'infer/s' if tokens is None else 'req/s'}"]
    if tokens is not None:
        parts.append(f"{tokens.output_tokens_per_s:,.1f} output tokens/s")
        parts += [f"{name} p90 {stats.p90:.2f} ms" for name, stats in (("TTFT", tokens.ttft_ms), ("ITL", tokens.itl_ms))
                  if stats.count]  # fmt: skip
    if result.latency.count > 0:
        parts.append(f"p99 {result.latency.p99_us / 1000:.3f} ms")
    if result.error_count or result.early_error_count:
        # Every failure of the level: those before its reported windows are in no count but this one.
        early, late = result.early_error_count, result.late_count - result.late_ok_count
        when = [f"{early} before the reported windows"] if early else []
        when += [f"{late} after the last window"] if late else []
        parts.append(f"{result.error_count + early} errors" + (f" ({', '.join(when)})" if when else ""))
    parts.append("stable" if result.stable else "UNSTABLE")
    failed = [check.name for check in result.checks if not check.passed]
    parts.append(f"INVALID ({', '.join(failed)})" if failed else "valid")
    return f"{level_name(result.mode, result.level)}: {', '.join(parts)}"


def _check_text(check: Check) -> str:
    """One validity check of a level, for -v: what it measured, and what to do when it failed."""
    text = f"  {'passed' if check.passed else 'FAILED'} {check.name}" + (f": {check.detail}" if check.detail else "")
    return text + (f" ({check.advice})" if check.advice and not check.passed else "")


class Progress:
    """Progress of a sweep, written to `stream` (stderr by default).

    `force_terminal` overrides the stream's own `isatty()`; `no_color` defaults to whether NO_COLOR
    is set (non-empty). `window_done`'s `window_index` counts from 0 (shown as `window 1/N`).
    """

    def __init__(
        self,
        quiet: bool = False,
        stream: TextIO | None = None,
        *,
        force_terminal: bool | None = None,
        no_color: bool | None = None,
        verbose: int = 0,
        unit: str = "infer/s",
    ) -> None:
        self._stream = sys.stderr if stream is None else stream
        self._unit = unit  # of the windows' throughput: "req/s" for generative requests
        self._quiet = quiet
        self._verbose = verbose
        self._mode = "concurrency"
        self._console: Console | None = None
        self._status: Status | None = None
        if quiet:
            return
        tty = force_terminal if force_terminal is not None else _isatty(self._stream)
        if tty:
            # Imported here: piped and quiet runs never pay for rich.
            from rich.console import Console

            self._console = Console(
                file=self._stream,
                force_terminal=True,
                no_color=bool(os.environ.get("NO_COLOR")) if no_color is None else no_color,
                markup=False,
                emoji=False,
                highlight=False,
            )

    @property
    def live(self) -> bool:
        """Whether this shows a live status line (a terminal) rather than plain lines."""
        return self._console is not None

    def level_started(self, mode: str, level: float) -> None:
        self._mode = mode
        text = f"{level_name(mode, level)}: measuring"
        if self._console is not None:
            self._stop_status()
            self._status = self._console.status(self._live_text(text), spinner="dots")
            self._status.start()
        else:
            self._plain(text)

    def window_done(
        self,
        level: float,
        window_index: int,
        max_trials: int,
        throughput: float,
        latency_us: float,
        stable_so_far: bool,
    ) -> None:
        label = level_name(self._mode, level)
        text = _window_text(label, window_index, max_trials, throughput, latency_us, stable_so_far, self._unit)
        if self._status is not None:
            if self._verbose:
                self._status.console.print(_rich_text(text))
            self._status.update(self._live_text(text))
        else:
            self._plain(text)

    def level_done(self, result: LevelResult) -> None:
        text = _verdict_text(result)
        if self._console is not None:
            self._stop_status()
            style = "green" if result.stable and result.valid else ("red" if not result.valid else "yellow")
            self._console.print(_rich_text(text, style))
        else:
            self._plain(text)
        for check in result.checks if self._verbose else ():
            self._line(_check_text(check), "" if check.passed else "yellow")

    def note(self, text: str) -> None:
        if self._console is not None:
            self._console.print(_rich_text(text, "yellow"))
        else:
            self._plain(text)

    def close(self) -> None:
        self._stop_status()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _live_text(self, text: str) -> Any:
        # The live line must stay one line (a wrapped one leaves debris when redrawn), and rich's
        # spinner re-wraps whatever it is given, so cut the text to the width after the spinner.
        assert self._console is not None
        room = max(self._console.width - 3, 10)
        return _rich_text(text if len(text) <= room else text[: room - 1] + "…")

    def _line(self, text: str, style: str = "") -> None:
        if self._console is not None:
            self._console.print(_rich_text(text, style))
        else:
            self._plain(text)

    def _plain(self, text: str) -> None:
        if self._quiet:
            return
        self._stream.write(text + "\n")
        self._stream.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real file
        return False


def _rich_text(text: str, style: str = "") -> Any:
    from rich.text import Text

    return Text(text, style=style)
