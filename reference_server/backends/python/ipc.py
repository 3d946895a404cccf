"""What the server and a python-backend stub process say to each other, and where the tensors lie.

Two things join the server to one stub (one `instance_group` instance):

- **Arenas.** Two anonymous shared-memory files (`memfd_create`), mapped by both processes: the
  server writes into one (request inputs, BLS answers), the stub into the other (outputs, BLS
  requests). The writer owns its arena's allocator; the reader sees a tensor where it lies, as a
  numpy view (numeric) or decodes it from Triton's length-prefixed form (BYTES). A tensor too big for
  the free space gets a memfd of its own, sent with the message (SCM_RIGHTS), so no size is refused.
  Being anonymous, nothing is left in /dev/shm when either side dies.
- **A control channel.** One SOCK_SEQPACKET socket pair: each message is one pickled dict of
  metadata (operation, ids, tensor names, datatypes, shapes, offsets), never tensor bytes. Its EOF
  is how a stub learns that the server is gone (it exits) and how the server learns that a stub died.
  A stub that finds its next execute already waiting sends its answers together (`executed_many`):
  a message and a wake-up of the server less per batch under load. It looks for one only after a
  batch the server marked as sent ahead (while another was unanswered); any other is answered at
  once, so at low load no request pays for a read that finds nothing before its answer. The
  server does the same the other way (`Outbox`): executes it hands a busy stub in one pass of its
  event loop go in one `execute_many` message.

Who frees what: the stub only reads the server's inputs while it runs them, so the server frees
them when the batch (or, for a decoupled model, the request's final response) is back. Everything
else a reader copies out of the arena and then gives back: the stub with a `{"op": "free", ...}`
message, the server with its next `execute` message (a message less per request), or a `free`
message once an eighth of the arena waits. Should the writer find no room meanwhile, the tensor
goes into a memfd of its own: slower, never refused.
"""

from __future__ import annotations

import array
import asyncio
import mmap
import os
import pickle
import socket
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from v2kit.tensors import DATATYPES, CodecError, deserialize_bytes_tensor, numpy_to_datatype, serialize_bytes_tensor

__all__ = [
    "Arena",
    "Channel",
    "ChannelClosed",
    "Outbox",
    "TensorDesc",
    "join_sequence",
    "read_tensor",
    "split_sequence",
    "write_tensor",
]

#: Largest control message; metadata only, so this is generous (error tracebacks, parameters).
MAX_MESSAGE_BYTES = 4 << 20
_ALIGN = 64
_FDS_SPACE = socket.CMSG_LEN(16 * array.array("i").itemsize)  # up to 16 descriptors per message

#: (name, datatype, shape, where): where is ("a", offset, nbytes) in the writer's arena or
#: ("f", index into the message's fds, nbytes) for a tensor in a memfd of its own.
TensorDesc = tuple[str, str, tuple[int, ...], tuple[str, int, int]]

# The hot path's dtype → datatype lookups, without numpy_to_datatype's checks (native byte order only).
_DATATYPE_OF: dict[Any, str] = {dtype: name for name, dtype in DATATYPES.items() if name != "BYTES" and dtype.isnative}


class ChannelClosed(Exception):
    """The other end of the control channel is gone."""


class Channel:
    """One end of the control channel: whole pickled messages, sent from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        # Messages are received into this one buffer, not a fresh MAX_MESSAGE_BYTES bytes object each:
        # glibc serves an allocation that size with mmap, and the shrink and free after it cost an
        # mremap, a munmap and page faults per message (about a tenth of a stub's CPU per request).
        # Anonymous and lazily backed, so it holds only as many pages as the largest message used.
        self._buffer = mmap.mmap(-1, MAX_MESSAGE_BYTES)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, MAX_MESSAGE_BYTES)
            except OSError:
                pass  # the system's cap applies; messages are small

    @staticmethod
    def pair() -> tuple[Channel, socket.socket]:
        """The server's end, and the socket to hand to the child (inheritable)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        theirs.set_inheritable(True)
        return Channel(ours), theirs

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > MAX_MESSAGE_BYTES:
            raise ValueError(f"control message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
        try:
            with self._send_lock:
                if fds:
                    socket.send_fds(self.sock, [data], fds)
                else:
                    self.sock.sendall(data)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc

    def recv(self, *, wait: bool = True) -> tuple[dict[str, Any], list[int]]:
        """The next message and the file descriptors that came with it; ChannelClosed at EOF.
        With `wait` False, BlockingIOError when none is there yet. One reader at a time (the
        receive buffer is shared)."""
        # socket.recv_fds, but passing the flags on (3.11's drops them: MSG_DONTWAIT would block).
        try:
            size, ancillary, _, _ = self.sock.recvmsg_into(
                [self._buffer], _FDS_SPACE, 0 if wait else socket.MSG_DONTWAIT
            )
        except BlockingIOError:
            raise
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        fds: list[int] = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
                fds += received
        if not size:
            for fd in fds:
                os.close(fd)
            raise ChannelClosed("end of file")
        message: dict[str, Any] = pickle.loads(memoryview(self._buffer)[:size])
        return message, fds

    def shut(self) -> None:
        """End the conversation (the other end reads EOF) but keep the descriptor open."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.shut()
        self.sock.close()
        try:
            self._buffer.close()
        except BufferError:
            pass  # a reader thread is still inside recv: the mapping goes with the channel


class Outbox:
    """Executes that may wait for the end of the event loop's pass, sent as one message.

    An execute handed to a busy stub (sent ahead: its previous answer is still due) cannot start
    before the stub is done anyway, so it is held until the loop's pass ends, and every execute
    held in that pass goes in one `execute_many` message: one pickle, one send, one receive and at
    most one wake-up of the stub for all of them, where each cost its own. Anything else sent
    through the outbox goes at once, after what it holds (so that the stub sees messages in the
    order they were sent)."""

    def __init__(
        self, channel: Channel, loop: asyncio.AbstractEventLoop, lost: Callable[[list[dict[str, Any]]], None]
    ) -> None:
        self.channel = channel
        self._loop = loop
        self._lost = lost  # told which held messages could not go (the stub is gone)
        self._held: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any], fds: list[int] | None = None, *, hold: bool = False) -> None:
        """Send `message`, or with `hold` (and no fds) keep it for the end of the loop's pass."""
        if hold and not fds:
            if not self._held:
                self._loop.call_soon(self.flush)
            self._held.append(message)
            return
        if self._held:
            self.flush()
        self.channel.send(message, fds)

    def flush(self) -> None:
        held, self._held = self._held, []
        if not held:
            return
        try:
            self.channel.send(held[0] if len(held) == 1 else {"op": "execute_many", "executes": held})
        except ChannelClosed:
            self._lost(held)


class Arena:
    """A shared-memory file mapped here; the writer allocates in it with a first-fit free list."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)
        self.view = memoryview(self.map)
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, size)]  # (offset, length), by offset

    @staticmethod
    def create(name: str, size: int) -> Arena:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, size)  # sparse: pages cost memory only once written
        return Arena(fd, size)

    def allocate(self, nbytes: int) -> int | None:
        """The offset of `nbytes` of free space, or None when no free block is large enough."""
        need = max(_ALIGN, (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN)
        with self._lock:
            for index, (offset, length) in enumerate(self._free):
                if length >= need:
                    if length == need:
                        del self._free[index]
                    else:
                        self._free[index] = (offset + need, length - need)
                    return offset
        return None

    def release(self, offset: int, nbytes: int) -> None:
        need = max(_ALIGN, (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN)
        with self._lock:
            free = self._free
            low, high = 0, len(free)
            while low < high:
                middle = (low + high) // 2
                if free[middle][0] < offset:
                    low = middle + 1
                else:
                    high = middle
            free.insert(low, (offset, need))
            # Merge with the neighbours so that large blocks come back.
            if low + 1 < len(free) and free[low][0] + free[low][1] == free[low + 1][0]:
                free[low] = (free[low][0], free[low][1] + free[low + 1][1])
                del free[low + 1]
            if low > 0 and free[low - 1][0] + free[low - 1][1] == free[low][0]:
                free[low - 1] = (free[low - 1][0], free[low - 1][1] + free[low][1])
                del free[low]

    def free_bytes(self) -> int:
        with self._lock:
            return sum(length for _, length in self._free)

    def close(self) -> None:
        try:
            self.view.release()
            self.map.close()
        except BufferError:
            pass  # someone still holds a view; the mapping goes when it lets go
        os.close(self.fd)


def write_tensor(arena: Arena, name: str, array: Any, fds: list[int]) -> TensorDesc:
    """Put `array` into the arena (or a memfd of its own, appended to `fds`) and describe it."""
    if type(array) is not np.ndarray:
        array = np.asarray(array)
    dtype = array.dtype
    datatype = _DATATYPE_OF.get(dtype) or numpy_to_datatype(dtype)
    shape = array.shape
    if datatype == "BYTES":
        try:
            data: Any = serialize_bytes_tensor(array)
        except CodecError:
            data = serialize_bytes_tensor(_as_text(array))
        nbytes = len(data)
    else:
        data = (
            array if array.flags.c_contiguous and dtype.isnative else np.ascontiguousarray(array, DATATYPES[datatype])
        )
        nbytes = data.nbytes
    offset = arena.allocate(nbytes)
    if offset is not None:
        target = arena.view[offset : offset + nbytes]
        where = ("a", offset, nbytes)
    else:
        fd = os.memfd_create(f"pb-{name}"[:200], os.MFD_CLOEXEC)
        os.ftruncate(fd, max(nbytes, 1))
        own = mmap.mmap(fd, max(nbytes, 1))
        target = memoryview(own)[:nbytes]
        where = ("f", len(fds), nbytes)
        fds.append(fd)
    if datatype == "BYTES":
        target[:] = data
    elif nbytes:
        # memoryview assignment copies with memcpy, without building numpy views on both sides.
        target[:] = memoryview(data).cast("B")
    if where[0] == "f":
        target.release()
        own.close()
    return name, datatype, shape, where


def _as_text(array: npt.NDArray[Any]) -> list[bytes]:
    """A BYTES tensor's elements as Triton's stub serializes them: bytes as they are, anything else
    (a Python int in a STRING output, say) as `str(element)` in UTF-8."""
    return [x if isinstance(x, bytes) else str(x).encode() for x in array.ravel()]


def read_tensor(arena: Arena, desc: TensorDesc, fds: list[int], *, copy: bool) -> npt.NDArray[Any]:
    """The tensor `desc` describes. Numeric ones are views of shared memory unless `copy`; BYTES
    are always decoded into an object array of `bytes`. A memfd of its own is mapped and closed here."""
    _, datatype, shape, (kind, place, nbytes) = desc
    if kind == "a":
        source: Any = arena.view[place : place + nbytes]
    else:
        fd = fds[place]
        size = max(nbytes, 1)
        source = memoryview(mmap.mmap(fd, size))[:nbytes]
    if datatype == "BYTES":
        array: npt.NDArray[Any] = deserialize_bytes_tensor(bytes(source)).reshape(shape)
    else:
        array = np.frombuffer(source, dtype=DATATYPES[datatype]).reshape(shape)
        if copy:
            array = array.copy()
    return array


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# A sequence model's scheduler (scheduling/sequence/batcher.py) leaves the sequence parameters on the request;
# the model gets them as Triton gives them, `correlation_id()` and `flags()`, not as parameters.
_SEQUENCE_START, _SEQUENCE_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END


def split_sequence(parameters: dict[str, Any]) -> tuple[dict[str, Any], tuple[int | str, int]]:
    """(the parameters a model sees, (correlation id, flags)) of a request's parameters."""
    if "sequence_id" not in parameters:
        return parameters, (0, 0)
    rest = dict(parameters)
    correlation_id = rest.pop("sequence_id")
    if isinstance(correlation_id, bool) or not isinstance(correlation_id, (int, str)):
        correlation_id = 0  # not an id (a sequence model's scheduler refuses it; others ignore it)
    flags = (_SEQUENCE_START if rest.pop("sequence_start", False) is True else 0) | (
        _SEQUENCE_END if rest.pop("sequence_end", False) is True else 0
    )
    return rest, (correlation_id, flags)


def join_sequence(parameters: dict[str, Any], correlation_id: int | str, flags: int) -> dict[str, Any]:
    """A BLS request's parameters with its correlation id and flags as the sequence parameters."""
    if correlation_id in (0, ""):
        return parameters
    return {
        **parameters,
        "sequence_id": correlation_id,
        "sequence_start": bool(flags & _SEQUENCE_START),
        "sequence_end": bool(flags & _SEQUENCE_END),
    }
