"""The data plane's streamed answers, as async generators: `DataPlane.infer_stream`'s responses and
`DataPlane.stream_model`'s outputs.

They live apart from `dataplane` because mypyc, which compiles the data plane (docs/compiled.md),
does not compile async generators; these stay interpreted, and the data plane hands them what to
iterate and how to answer, so this module needs nothing of it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable

from reference_server.core.shared_memory import RequestBinding
from reference_server.core.trace_tensors import BACKEND_OUTPUT
from reference_server.core.tracing import RequestTrace
from reference_server.errors import ServerError
from reference_server.scheduling.execute import Tensors
from v2kit import codec as v2

#: What a decoupled model's stream carries in place of a response: an error it sent (the stream
#: goes on), or None for a final flag sent alone.
StreamResponse = v2.InferResponse | ServerError | None

#: A scheduler's iteration of one request: (outputs, final), outputs an error the model sent or
#: None for a final flag alone.
SchedulerStream = AsyncIterator[tuple[Tensors | ServerError | None, bool]]


async def responses(
    start: Callable[[], SchedulerStream],
    respond: Callable[[Tensors], v2.InferResponse],
    binding: RequestBinding | None,
    trace: RequestTrace | None,
    grpc: bool,
) -> AsyncGenerator[tuple[StreamResponse, bool], None]:
    """The responses of the scheduler's iteration that `start` begins (at the first step, not
    before), each made by `respond` and written into `binding`'s regions; `binding` is released
    and `trace` ended when the iteration ends, however it ends."""
    stream = start()
    try:
        async for results, final in stream:
            if results is None:
                if trace is not None:
                    trace.responded(grpc, False)
                yield results, final
                continue
            if isinstance(results, ServerError):
                answer: StreamResponse = results
            else:
                response = respond(results)
                answer = response if binding is None else binding.write(response)
            if trace is None:
                yield answer, final
                continue
            if not isinstance(results, ServerError):
                trace.record_tensors(BACKEND_OUTPUT, results)
            # Traced: each response's send is from its hand-off until the front end asks for the next.
            trace.responded(grpc, True)
            yield answer, final
            trace.sent(grpc)
    finally:
        if trace is not None:
            trace.ended(grpc)
        # Closed early (the client went away): the scheduler's iteration ends too, now.
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
        if binding is not None:
            binding.release()


async def outputs_or_raise(start: Callable[[], SchedulerStream]) -> AsyncIterator[tuple[Tensors | None, bool]]:
    """The outputs of the scheduler's iteration that `start` begins (at the first step); an error
    response ends it, raised."""
    async for outputs, final in start():
        if isinstance(outputs, ServerError):
            raise outputs
        yield outputs, final
