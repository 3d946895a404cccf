"""The model the Open Inference Protocol tests measure on Seldon MLServer: OUTPUT0 = INPUT0 + 1,
FP32 [-1, 16], a custom runtime with nothing Triton-specific. MLServer imports this file from the
model's folder, under its own Python (PERFKIT_PEERS/mlserver), not perfkit's."""

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.handlers import custom_handler
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class AddOne(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT0", x + 1)])


class AddOneWithTritonConfig(AddOne):
    """AddOne that also answers Triton's model configuration extension (GET /v2/models/NAME/config),
    which perf_analyzer cannot run without: only for comparing perfkit with perf_analyzer on the
    same server. What perf_analyzer reads of it: max_batch_size (0: the shapes are the metadata's as
    they are), and the inputs' and outputs' names, types and dims.

    Its outputs carry no `parameters`: MLServer's codec adds {"content_type": "np"}, and
    perf_analyzer 2.48's JSON client, finding an output's parameters, reads their binary_data_size
    without checking that it is there, and fails every request ("attempt to access non-existing
    object member 'binary_data_size'")."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]) + 1
        output = ResponseOutput(name="OUTPUT0", shape=list(x.shape), datatype="FP32", data=x.ravel().tolist())
        return InferenceResponse(model_name=self.name, outputs=[output])

    @custom_handler(rest_path="/v2/models/addone/config", rest_method="GET")
    async def triton_config(self) -> dict[str, object]:
        tensor = {"data_type": "TYPE_FP32", "dims": [-1, 16]}
        return {
            "name": self.name,
            "max_batch_size": 0,
            "input": [{"name": "INPUT0", **tensor}],
            "output": [{"name": "OUTPUT0", **tensor}],
        }
