"""The generative demo models: `sim_llm`, a simulated engine with known timing, and `tiny_decoder`,
a small ONNX transformer run token by token, both python-backend decoupled models taking the vLLM
backend's inputs; and `tiny_embedder`, an ONNX embedding model that answers once. All are built
locally by `python -m v2kit.demo DIR --genai` (`repository.py`).

`llm_io.py` and `sim_engine.py` are copied beside the models' `model.py` files, which import them
by name: they import only the standard library and numpy, so they run in any python-backend stub.
"""
