"""The gRPC side of the load generator's client: `channel.py` (unary inference on a lean HTTP/2
client, the theory of operation) over `connection.py` (one HTTP/2 connection and its calls),
`streaming.py` (`--streaming`: ModelStreamInfer streams on the same connections), and `client.py`
(the gRPC adapter of `perfkit.wire.client.InferClient`: inference on those, the rest on grpc.aio).
"""
