"""Calls per second of the compiled modules' hot functions, on the inputs a request brings: how
much compiling them gains, function by function (docs/compiled.md).

    python bench/compiled_micro.py [--rounds 7]                        # as installed (compiled)
    PERFKIT_PURE_PYTHON=1 python bench/compiled_micro.py               # the same sources, interpreted
    cd COPY && PYTHONPATH=COPY python bench/compiled_micro.py          # another build of a copy (Cython)

Each case runs 20,000 calls per round and is timed in CPU time (`time.process_time`), so other load
on the machine counts less than in wall time; the table gives the median, min and max over the
rounds, in thousands of calls per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

from perfkit.load.samples import SampleBuffer
from v2kit import codec as v2
from v2kit import compiled
from v2kit.h2 import frames

_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def cases() -> dict[str, Callable[[], object]]:
    """Each hot function on what a request brings: perf_analyzer's identity request (FP32 [1, 16],
    binary), the same with JSON data, its answer, a gRPC call's frames and header block."""
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    request = v2.InferRequest("identity", inputs=[v2.InferTensor("INPUT0", "FP32", [1, 16], data)])
    body, length = v2.encode_infer_request(request)
    json_body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": list(range(16))}]}
    ).encode()
    response = v2.InferResponse("identity", "1", outputs=[v2.InferTensor("OUTPUT0", "FP32", [1, 16], data)])
    decoded = v2.decode_infer_request(body, length, "identity")
    call = frames.encode_call(_METHOD, b"x" * 120, authority="localhost:8001", tls=False)
    one = call.headers_head + b"\0\0\0\1" + call.block_data_head + b"\0\0\0\1" + call.body
    reader, decoder, samples = frames.FrameReader(), frames.HeaderDecoder(), SampleBuffer()
    decoder.decode(call.block)
    return {
        "codec.decode_infer_request (binary, header cached)": lambda: v2.decode_infer_request(body, length, "identity"),
        "codec.decode_infer_request (JSON data)": lambda: v2.decode_infer_request(json_body, None, "identity"),
        "codec.encode_infer_response (binary)": lambda: v2.encode_infer_response(response, decoded),
        "codec.encode_infer_request (binary)": lambda: v2.encode_infer_request(request),
        "frames.FrameReader.feed (one call's read)": lambda: list(reader.feed(one)),
        "frames.HeaderDecoder.decode (cached block)": lambda: decoder.decode(call.block),
        "frames.keeps_table": lambda: frames.keeps_table(call.block),
        "frames.encode_call": lambda: frames.encode_call(_METHOD, b"x" * 120, authority="localhost:8001", tls=False),
        "samples.SampleBuffer.record": lambda: samples.record(1, 2, 3, "", 100, 200, 4, 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"{compiled.describe(['v2kit', 'perfkit'])}; {args.rounds} rounds of 20,000 calls, k calls/s of CPU time\n")
    print("| function | median | min-max |")
    print("|---|---|---|")
    for name, case in cases().items():
        rates = []
        for _ in range(args.rounds):
            start = time.process_time()
            for _ in range(20_000):
                case()
            rates.append(20_000 / (time.process_time() - start) / 1000)
        print(f"| {name} | {statistics.median(rates):.0f} | {min(rates):.0f}-{max(rates):.0f} |")


if __name__ == "__main__":
    main()
