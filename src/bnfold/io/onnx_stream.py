"""The streamed ONNX fold's files: external data is checked and left on disk at load, read one tensor
at a time while the fold runs, and copied into the output's data file in order at save.

:func:`place_external` checks every external reference as :func:`bnfold.io.onnx.load_onnx` does
(folder, links, regular file, offsets, lengths, overlaps, the byte budget) and then points each one
at a token its :class:`ExternalSource` owns, so no reference left in the model names a file.
Inside ``source.reading()`` the fold reads a tensor's bytes once, with one ``preadv`` into a buffer
it owns, when it needs its values.  A folded weight made from such a read (``fold_math.Product``) is not
written at the fold: the source notes where its weight was read and how the product is made
(:meth:`ExternalSource.again`), and makes it again where it is read or saved, from the weight read again
with the same checks.  Other new parameters go from their memory to an unnamed scratch file
(:func:`bnfold.io.atomic.scratch_file`), so memory holds the graph and the tensor in hand.
:func:`serialize_streamed` writes the same files as ``save_onnx`` with the plain load's layout: the same
tensors in the same order, copied by the kernel (``copy_file_range``), a product made again written once.
``StreamedLayout.hold`` instead reads every tensor back into the model (``bnfold.fold`` on a path returns
such a model).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import ModelFileError
from ..fold_math import FoldError
from ..onnx.tensors import reading_external
from .atomic import scratch_file, start_writeback
from .limits import MAX_BYTES_HINT
from .onnx_external import (
    DEFAULT_THRESHOLD,
    ExternalLayout,
    _check_overlaps,
    _locate,
    _set_entries,
    all_tensors,
    changed,
    file_ids,
    initializers,
    is_external,
    open_regular,
    read_exactly,
)

_TOKEN = "\0bnfold-stream:"  # a location no file can have: nothing but the source reads it
_CHUNK = 64 << 20  # bytes copied at a time
# bytes written at a time: a 1 GB model's products written 16 MiB a pwrite took 0.9-2.6 s, 1 MiB 0.4-1.0 s (ext4)
_WRITE = 1 << 20
SPILL_BYTES = 64 << 10  # new parameters this big go to the scratch file
MADE_DEPTH = 4  # products of products made again at most this deep (each a pass over the tensor where it is read)


@dataclass(eq=False)
class _Lent:
    """A read buffer (``ref``: a weak reference to it), its pages, and the tensor whose bytes it holds (``origin``:
    its name and reference, without its dims)."""

    ref: weakref.ref
    pages: mmap.mmap
    origin: TensorProto | None


@dataclass(frozen=True)
class Made:
    """A new parameter made again where it is read: the bytes of ``origin`` (a tensor this source holds, read
    with its checks), changed in place by ``make``, which yields them in order, each piece made as it is asked
    for; ``depth``: 1, or one more than ``origin``'s."""

    origin: TensorProto
    make: Callable[[np.ndarray], Iterator[np.ndarray]]
    depth: int
    keeps: int  # bytes ``make`` holds until the save (the product's scales)


@dataclass(eq=False)
class ExternalSource:
    """Where the tensors of a streamed load keep their bytes: the checked data files (``identity``: each one's
    :func:`file_identity` at the load), ``scratch`` the unnamed file that holds the fold's new parameters, and
    ``made`` the products made again where they are read."""

    path: str  # the model file, for messages
    identity: dict[str, tuple[int, ...]] = field(default_factory=dict)  # each file's identity at the load
    scratch: BinaryIO | None = None
    scratch_folder: str = ""  # where the scratch file is, for messages
    last: ScratchSpill | None = None  # the spill that wrote the scratch file's last bytes
    made: list[Made] = field(default_factory=list)
    made_largest: int = 0  # the largest product made again: what all of ``made`` may hold until the save
    made_keeps: int = 0  # what they hold (their ``keeps``)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    depth: int = 0
    lent: list[_Lent] = field(default_factory=list)  # read buffers, their pages and what they hold

    @property
    def files(self) -> list[str]:
        """The checked data files, in the order the load met them."""
        return list(self.identity)

    def where(self, t: TensorProto) -> tuple[str, int, int]:
        """``(real path, offset, length)`` of a tensor this source placed (the path "" for a new parameter: in the
        scratch file, or made again); a FoldError for any other."""
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        k = loc[len(_TOKEN) :] if loc.startswith(_TOKEN) else ""
        real = k[len("file:") :] if k.startswith("file:") else ""
        if not (real in self.identity if real else k == "scratch" or self._made(t) is not None):
            raise FoldError(f"tensor {t.name!r} refers to external data this streamed load did not check")
        return real, int(info["offset"]), int(info["length"])

    def _made(self, t: TensorProto) -> Made | None:
        """How the new parameter ``t`` is made again, or None where it is no such parameter of this source."""
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        k = loc[len(_TOKEN) + len("made:") :] if loc.startswith(_TOKEN + "made:") else ""
        return self.made[int(k)] if k.isdigit() and int(k) < len(self.made) else None

    def read(self, t: TensorProto) -> np.ndarray:
        """The tensor's bytes, read with one ``preadv`` into a new writable buffer (the fold's own copy); a
        product made again is made in the buffer its weight is read into."""
        return self._read(t)

    def _read(self, t: TensorProto) -> np.ndarray:
        made = self._made(t)
        if made is not None:
            buf, pieces = self._making(made)
            for _ in pieces:
                pass
            self._holds(buf, t)
            return buf
        real, offset, length = self.where(t)
        buf = self._buffer(length, t)
        with self._opened(real) as fd:
            done = 0
            while done < length:  # one call, unless the kernel returns less (over 2 GiB, or a file that shrank)
                n = _read_into(fd, memoryview(buf)[done:], offset + done)
                if not n:
                    raise self._changed(real)
                done += n
        return buf

    def store(self, t: TensorProto, data: np.ndarray) -> TensorProto:
        """``t`` (a new parameter's name, type and dims) holding the bytes ``data``: in ``raw_data`` when
        small, else written to the scratch file and referred to there."""
        return self.store_blocks(t, [data], data.nbytes)

    def store_blocks(self, t: TensorProto, blocks: Iterable[np.ndarray], nbytes: int) -> TensorProto:
        """:meth:`store` of the ``nbytes`` bytes that ``blocks`` hold in order, written as each block comes (a
        deferred product is never whole in memory); the scratch file is cut back if they do not all come."""
        if nbytes < SPILL_BYTES:
            t.raw_data = b"".join(b.tobytes() for b in blocks)
            return t
        spill = ScratchSpill(self)
        try:
            for block in blocks:
                spill.write(block)
            if spill.length != nbytes:
                raise AssertionError(f"internal: {t.name} has {spill.length} bytes, expected {nbytes}")
        except BaseException:
            spill.done(False)
            raise
        stored = self.refer(t, spill.done(True), nbytes)
        assert stored is not None
        return stored

    def again(
        self,
        t: TensorProto,
        address: int,
        nbytes: int,
        make: Callable[[np.ndarray], Iterator[np.ndarray]],
        keeps: int,
    ) -> TensorProto | None:
        """``t`` referring to ``nbytes`` bytes made again where they are read (never written at the fold): those of
        the tensor this source read into the live buffer at ``address``, changed in place by ``make`` (which holds
        ``keeps`` bytes until the save: the product's scales).  None where no such buffer holds a tensor's bytes,
        for a parameter :meth:`store` keeps in memory, for a product of products :data:`MADE_DEPTH` deep, and where
        what every product made again holds would pass the largest of them (many layers' scales: the memory stays
        within one tensor's; the caller spills those bytes instead)."""
        origin = self.origin(address, nbytes) if nbytes >= SPILL_BYTES else None
        if origin is None:
            return None
        made = self._made(origin)
        depth = 1 if made is None else made.depth + 1
        largest = max(self.made_largest, nbytes)
        if depth > MADE_DEPTH or self.made_keeps + keeps > largest:
            return None
        self.made_largest, self.made_keeps = largest, self.made_keeps + keeps
        self.made.append(Made(origin, make, depth, keeps))
        t.data_location = TensorProto.EXTERNAL
        entries = (("location", f"{_TOKEN}made:{len(self.made) - 1}"), ("offset", "0"), ("length", str(nbytes)))
        _set_entries(t, entries)
        return t

    def _making(self, made: Made) -> tuple[np.ndarray, Iterator[np.ndarray]]:
        """The buffer ``made``'s weight is read into (with its checks) and the pieces of its product, each made over
        it as it is asked for."""
        buf = self._read(made.origin)
        self._holds(buf, None)  # it holds no tensor's bytes while they change
        return buf, made.make(buf)

    def origin(self, address: int, nbytes: int) -> TensorProto | None:
        """The tensor (a reference to it, no bytes) whose ``nbytes`` bytes the live read buffer at ``address`` holds
        as they were read, or None."""
        for lent in self.lent:
            buf = lent.ref()
            if buf is not None and lent.origin is not None and buf.ctypes.data == address and buf.nbytes == nbytes:
                return lent.origin
        return None

    def spill(self, nbytes: int) -> ScratchSpill | None:
        """Somewhere for a new parameter of ``nbytes`` bytes to go as it is made (the scratch file), taken up by
        :meth:`refer`; None for one :meth:`store` keeps in memory."""
        return ScratchSpill(self) if nbytes >= SPILL_BYTES else None

    def refer(self, t: TensorProto, spilled: object, nbytes: int) -> TensorProto | None:
        """``t`` referring to the ``nbytes`` bytes a :class:`ScratchSpill` of this source wrote (``spilled``, the
        token its ``done(True)`` gave); None for any other token or length."""
        if not isinstance(spilled, Spilled) or spilled.source is not self or spilled.length != nbytes:
            return None
        spilled.taken = True
        t.data_location = TensorProto.EXTERNAL
        entries = (("location", _TOKEN + "scratch"), ("offset", str(spilled.offset)), ("length", str(nbytes)))
        _set_entries(t, entries)
        return t

    def _scratch_fd(self) -> int:
        if self.scratch is None:
            try:
                self.scratch, self.scratch_folder = self.stack.enter_context(
                    scratch_file(os.path.dirname(os.path.abspath(self.path)))
                )
            except OSError as e:
                raise self.cannot_spill(e) from None
        return self.scratch.fileno()

    def cannot_spill(self, e: OSError) -> ModelFileError:
        """The one-line error for a scratch file that cannot be made or written (a full disk: EFBIG, ENOSPC)."""
        where = self.scratch_folder or "the temporary folder"
        return ModelFileError(
            f"{self.path}: cannot write the streamed fold's scratch file in {where} ({e.strerror or e}); "
            "free space there"
        )

    def copy(self, t: TensorProto, out: BinaryIO) -> int:
        """Copy the tensor's bytes to the end of ``out`` in the kernel (``copy_file_range``; chunks through
        memory where the kernel cannot), or, for a product made again, make it and write it; returns their
        length."""
        real, offset, length = self.where(t)
        out.flush()
        start, dst = out.tell(), out.fileno()
        made = self._made(t)
        if made is not None:  # each piece written as it is made
            at = start
            for piece in self._making(made)[1]:
                _write_at(dst, memoryview(piece), at)
                at += piece.nbytes
            if at != start + length:
                raise AssertionError(f"internal: {t.name} made {at - start} bytes, expected {length}")
            out.seek(at)
            return length
        with self._opened(real) as fd:
            done = 0
            while done < length:
                try:
                    n = _copy_range(fd, offset + done, dst, start + done, min(_CHUNK, length - done))
                except OSError as e:
                    if e.errno not in _NO_KERNEL_COPY:
                        raise
                    n = _copy_range(fd, offset + done, dst, start + done, min(_CHUNK, length - done), kernel=False)
                if not n:
                    raise self._changed(real)
                done += n
        out.seek(start + length)
        return length

    def _buffer(self, length: int, t: TensorProto) -> np.ndarray:
        """``length`` writable bytes in pages of their own (an anonymous map, not the allocator's heap, which
        keeps up to twice its largest freed block) for the bytes of ``t``: those of a buffer read before that
        nothing references any more (no pages to fault in and zero again) when they are enough, else fresh ones;
        pages of the others nothing references go back to the system first."""
        kept, free = [], None
        for lent in self.lent:
            if lent.ref() is None and free is None and len(lent.pages) >= length:
                free = lent.pages
            elif lent.ref() is None:
                lent.pages.close()
            else:
                kept.append(lent)
        pages = free if free is not None else _pages(max(length, 1))
        buf = np.frombuffer(pages, np.uint8, count=length)
        self.lent = [*kept, _Lent(weakref.ref(buf), pages, None)]
        self._holds(buf, t)
        return buf

    def _holds(self, buf: np.ndarray, t: TensorProto | None) -> None:
        """Note that the read buffer ``buf`` now holds the bytes of ``t`` (:meth:`origin`; None: of no tensor)."""
        for lent in self.lent:
            if lent.ref() is buf:
                lent.origin = None if t is None else TensorProto(name=t.name, data_location=TensorProto.EXTERNAL)
                if t is not None:
                    _set_entries(lent.origin, _entries(t))

    def give_back(self) -> None:
        """Close the pages of every buffer nothing references (those still referenced go with their arrays)."""
        for lent in self.lent:
            if lent.ref() is None:
                lent.pages.close()
        self.lent = []

    @contextlib.contextmanager
    def _opened(self, real: str) -> Iterator[int]:
        """A descriptor of the checked data file ``real`` (opened again, a regular file), or of the scratch file.
        The data file must be the one the load checked (:func:`file_identity`) when it is opened and when the
        block ends: one replaced, resized or written since (or while the block read it) is refused as changed."""
        if not real:
            assert self.scratch is not None
            yield self.scratch.fileno()
            return
        fd = open_regular(real, self.path)
        try:
            self._check(fd, real)
            yield fd
            self._check(fd, real)
        finally:
            os.close(fd)

    def _check(self, fd: int, real: str) -> None:
        if file_identity(fd) != self.identity.get(real):
            raise changed(self.path, real, " (not the file, size or times the load checked); load it again")

    def _changed(self, real: str) -> ModelFileError:
        return changed(self.path, real or "the scratch file")

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Within the block, the fold reads this source's tensors (and spills its new parameters); the
        scratch file is closed (and gone) when the outermost block ends: fold and save inside one."""
        self.depth += 1
        try:
            with reading_external(self):
                yield
        finally:
            self.depth -= 1
            if not self.depth:
                try:
                    self.stack.close()
                finally:  # the buffers go back and the scratch file is forgotten even when closing raises
                    self.scratch = self.last = None
                    self.give_back()


@dataclass(eq=False)
class Spilled:
    """Bytes a :class:`ScratchSpill` wrote: ``length`` bytes at ``offset`` of ``source``'s scratch file;
    ``taken``: a tensor refers to them (:meth:`ExternalSource.refer`), never discarded."""

    source: ExternalSource
    offset: int
    length: int
    taken: bool = False

    def discard(self) -> None:
        """Cut these bytes back off the scratch file where they are its last and no tensor refers to them (a
        failed try's product, after the ones stored before it; a product written again in another order); bytes
        with others after them stay until the file goes."""
        scratch = self.source.scratch
        if self.taken:
            return
        if scratch is not None and os.fstat(scratch.fileno()).st_size == self.offset + self.length:
            os.ftruncate(scratch.fileno(), self.offset)


@dataclass(eq=False)
class ScratchSpill:
    """Bytes appended to a source's scratch file as they come (``fold_math.Spill``, given numpy arrays):
    ``done(True)`` names them (:class:`Spilled`), ``done(False)`` cuts the file back to where they began."""

    source: ExternalSource
    start: int = -1
    end: int = -1

    @property
    def length(self) -> int:
        return self.end - self.start

    def write(self, block: np.ndarray) -> None:
        fd = self.source._scratch_fd()
        if self.start < 0 or self.source.last is not self:  # bytes of another spill after ours: not one range
            if self.start >= 0:
                raise AssertionError("internal: two scratch spills written in turn")
            self.start = self.end = os.fstat(fd).st_size
        self.source.last = self
        view = memoryview(block.reshape(-1).view(np.uint8))
        try:  # straight from the block's memory (no buffered file between)
            _write_at(fd, view, self.end)
        except OSError as e:  # the bytes written stay past self.end: done(False) or the file's end cuts them
            raise self.source.cannot_spill(e) from None
        self.end += len(view)

    def done(self, ok: bool) -> Spilled | None:
        """``done(False)`` cuts the file back to where these bytes began (with those a failed write left after
        them) where no other spill wrote after them; else they stay until the file goes."""
        scratch = self.source.scratch
        if not ok and self.start >= 0 and scratch is not None and self.source.last is self:
            os.ftruncate(scratch.fileno(), self.start)
            self.source.last = None
        if not ok:
            self.start = self.end = -1
        return Spilled(self.source, self.start, self.length) if ok and self.start >= 0 else None


def _pages(length: int) -> mmap.mmap:
    """``length`` bytes of fresh anonymous memory, filled in one go where the system can (``MAP_POPULATE``)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(-1, length, flags=flags)


def _read_into(fd: int, view: memoryview, offset: int) -> int:
    """Bytes of ``fd`` at ``offset`` into ``view`` (``preadv``; ``pread`` and a copy where there is none)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [view], offset)
    chunk = os.pread(fd, min(len(view), _CHUNK), offset)
    view[: len(chunk)] = chunk
    return len(chunk)


_NO_KERNEL_COPY = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


def _copy_range(src: int, offset: int, dst: int, at: int, n: int, kernel: bool = True) -> int:
    """Up to ``n`` bytes of ``src`` at ``offset`` to ``dst`` at ``at``; the bytes copied (0 at the end of ``src``)."""
    if kernel and hasattr(os, "copy_file_range"):
        return os.copy_file_range(src, dst, n, offset, at)
    chunk = os.pread(src, n, offset)
    _write_at(dst, memoryview(chunk), at)
    return len(chunk)


def _write_at(fd: int, view: memoryview, at: int) -> None:
    """All of ``view`` to ``fd`` at ``at``, :data:`_WRITE` bytes a ``pwrite`` (again where one writes less)."""
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done : done + _WRITE], at + done)


@dataclass(frozen=True)
class StreamedLayout(ExternalLayout):
    """The plain load's layout of the same file, with the source that still holds the tensors."""

    source: ExternalSource | None = field(default=None, compare=False)

    def reading(self) -> contextlib.AbstractContextManager:
        assert self.source is not None
        return self.source.reading()

    def hold(self, model: onnx.ModelProto) -> None:
        """Read every tensor of ``model`` this source still keeps (on disk, in the scratch file) into memory,
        inside :meth:`reading`: then ``model`` refers to no file, as after the plain load and fold."""
        assert self.source is not None
        for t in all_tensors(model):
            if is_external(t):
                _read_back(t, self.source)


def _read_back(t: TensorProto, source: ExternalSource) -> None:
    """``t``'s bytes back in memory, as the plain route holds them: a tensor the load read from a data file says
    ``data_location`` DEFAULT (``read_external``), a parameter the fold made (the scratch file) says none."""
    made = not source.where(t)[0]
    _inline(t, source.read(t).tobytes())
    if made:
        t.ClearField("data_location")


def _inline(t: TensorProto, raw: bytes) -> None:
    """``t`` holding ``raw`` in its ``raw_data``, as the plain load leaves an external tensor it read."""
    del t.external_data[:]
    t.data_location = TensorProto.DEFAULT
    t.raw_data = raw


def file_identity(fd: int) -> tuple[int, ...]:
    """What tells an open data file from another or from itself rewritten: device, inode, size, and the
    modification and change times (ns). A rewrite in place that keeps the size and the times (within the file
    system's timestamp tick, or times set back) keeps it: only reading every byte again would tell."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def place_external(model: onnx.ModelProto, path: str, budget: int | None) -> StreamedLayout | None:
    """Check every external reference of ``model`` (parsed from ``path``) and point it at a token of
    a new :class:`ExternalSource`; None when nothing is external. Each data file is opened once here: its
    small tensors are read from it, and its :func:`file_identity` is what later reads and copies check."""
    base = os.path.dirname(os.path.abspath(path))
    files: dict[str, tuple[str, int, tuple[int, int]]] = {}
    found = [(t, _locate(t, base, path, files)) for t in all_tensors(model) if is_external(t)]
    located = file_ids(files)
    if not found:
        return None
    ranges: dict[str, list[tuple[int, int, str]]] = {}
    for t, (real, offset, length) in found:
        ranges.setdefault(real, []).append((offset, length, t.name))
    _check_overlaps(ranges, path)
    total = sum(length for _, (_, _, length) in found)
    if budget is not None and total > budget:
        raise ModelFileError(f"{path}: the external data adds up to {total} bytes, over {budget}; {MAX_BYTES_HINT}")
    by_file: dict[str, list[tuple[TensorProto, int, int]]] = {}
    for t, (real, offset, length) in found:
        by_file.setdefault(real, []).append((t, offset, length))
    source = ExternalSource(path)
    for real, tensors in by_file.items():
        fd = open_regular(real, path, located[real])
        try:
            identity = file_identity(fd)
            if any(offset + length > identity[2] for _, offset, length in tensors):
                raise changed(path, real)  # cut short since it was located
            for t, offset, length in tensors:
                if length < SPILL_BYTES:  # small tensors (norm parameters, shapes): read as the plain load does
                    _inline(t, read_exactly(fd, real, offset, length, path))
                    continue
                source.identity[real] = identity
                t.ClearField("raw_data")
                t.data_location = TensorProto.EXTERNAL
                entries = (("location", f"{_TOKEN}file:{real}"), ("offset", str(offset)))
                _set_entries(t, (*entries, ("length", str(length))))
        finally:
            os.close(fd)
    names = frozenset(t.name for t, _ in found)
    smallest = min([DEFAULT_THRESHOLD] + [length for _, (_, _, length) in found])
    return StreamedLayout(names, smallest, source)


def _size(t: TensorProto, source: ExternalSource) -> int | None:
    """The bytes a tensor stores (raw or streamed); None when it keeps its values in typed fields."""
    if is_external(t):
        return source.where(t)[2]
    return len(t.raw_data) if t.HasField("raw_data") else None


def _chosen(model: onnx.ModelProto, layout: StreamedLayout) -> list[TensorProto]:
    """``onnx_external.chosen_tensors`` for a model whose tensors may still be streamed."""
    source = layout.source
    assert source is not None
    chosen = {}
    for t in initializers(model.graph):
        n = _size(t, source)
        if n is not None and n >= layout.threshold:
            chosen[id(t)] = t
    for t in all_tensors(model):
        if t.name in layout.names and _size(t, source) is not None:
            chosen[id(t)] = t
    return list(chosen.values())


def serialize_streamed(model: onnx.ModelProto, data: BinaryIO, location: str, layout: StreamedLayout) -> bytes:
    """Write the chosen tensors to ``data`` in order (streamed ones copied in chunks) and return the
    model bytes that refer to them; the caller's model is left as it was."""
    source = layout.source
    assert source is not None
    source.give_back()  # the fold's last read buffer is not held through the save
    moved: list[tuple[TensorProto, list[tuple[str, str]], bytes | None]] = []  # (tensor, its entries, its bytes)
    try:
        chosen = _chosen(model, layout)
        ids = {id(t) for t in chosen}
        for t in all_tensors(model):  # a streamed tensor the layout keeps inline is read back
            if is_external(t) and id(t) not in ids:
                moved.append((t, _entries(t), None))
                _read_back(t, source)
        for t in chosen:
            offset = data.tell()
            if is_external(t):
                moved.append((t, _entries(t), None))
                length = source.copy(t, data)
                start_writeback(data.fileno(), offset, length)  # on its way to disk while the next ones are made
            else:
                raw = t.raw_data
                moved.append((t, [], raw))
                length = data.write(raw)
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            _set_entries(t, (("location", location), ("offset", str(offset)), ("length", str(length))))
        return model.SerializeToString()
    finally:
        for t, entries, raw in reversed(moved):
            if raw is None:
                t.ClearField("raw_data")
                t.data_location = TensorProto.EXTERNAL
                _set_entries(t, entries)
            else:
                _inline(t, raw)


def _entries(t: TensorProto) -> list[tuple[str, str]]:
    return [(e.key, e.value) for e in t.external_data]
