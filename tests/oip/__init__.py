"""Open Inference Protocol servers other than Triton (Seldon MLServer, KServe's python ModelServer),
each serving the `addone` model of this folder, for the tests that measure them with perfkit."""
