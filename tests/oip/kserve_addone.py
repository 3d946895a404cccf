"""The model the Open Inference Protocol tests measure on KServe's python ModelServer 0.21:
OUTPUT0 = INPUT0 + 1, FP32 [-1, 16], with nothing Triton-specific. Run under KServe's own Python
(PERFKIT_PEERS/bin/kserve-python), not perfkit's:

    kserve-python kserve_addone.py --http_port PORT --grpc_port PORT

The ports are KServe's own flags (its ModelServer reads them from the command line when imported).
KServe binds every interface and has no flag to narrow it; this file binds loopback instead.
"""

import uuid

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class AddOne(Model):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.ready = True

    async def get_input_types(self) -> list[dict[str, object]]:
        return [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}]

    async def get_output_types(self) -> list[dict[str, object]]:
        return [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}]

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        x: np.ndarray = payload.inputs[0].as_numpy()
        out = InferOutput(name="OUTPUT0", shape=list(x.shape), datatype="FP32")
        out.set_data_from_numpy(x + 1, binary_data=False)
        # The response id must be a string: a request without an id gets a fresh one.
        response_id = payload.id or str(uuid.uuid4())
        return InferResponse(model_name=self.name, infer_outputs=[out], response_id=response_id)


def loopback_only() -> None:
    """Make KServe's HTTP (uvicorn) and gRPC servers bind 127.0.0.1 where it asks for every interface."""
    import grpc.aio
    import uvicorn

    config_init = uvicorn.Config.__init__

    def init(self, *args, **kwargs):
        kwargs["host"] = "127.0.0.1"
        config_init(self, *args, **kwargs)

    uvicorn.Config.__init__ = init
    server_factory = grpc.aio.server

    def server(*args, **kwargs):
        made = server_factory(*args, **kwargs)
        add_port = made.add_insecure_port
        made.add_insecure_port = lambda address: add_port(address.replace("[::]", "127.0.0.1"))
        return made

    grpc.aio.server = server


if __name__ == "__main__":
    loopback_only()
    ModelServer().start([AddOne("addone")])
