"""Load from several machines: Ray actors (`worker.py`) that each run a load generator, split and merged by
`distributed.py`, on the one Ray runtime of `runtime.py`."""
