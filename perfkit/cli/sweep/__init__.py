"""`perfkit sweep`: its flags (`flags.py`), perf_analyzer's flags it takes so that a perf_analyzer
command line runs unchanged (`perf_analyzer.py`), from them a validated SweepSpec (`spec.py`), and
the command itself (`command.py`), whose console ending `perfkit run` shares.

The names other commands and tests use are exported here.
"""

from __future__ import annotations

from perfkit.cli.sweep.command import COMMAND, interrupt_lines, measure
from perfkit.cli.sweep.flags import add_arguments
from perfkit.cli.sweep.spec import parse_model_list, spec_from_args

__all__ = ["COMMAND", "add_arguments", "interrupt_lines", "measure", "parse_model_list", "spec_from_args"]
