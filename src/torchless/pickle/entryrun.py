"""The pickle machine's fast path for torch's state-dict entries (the general path is the
machine's opcode loop, :class:`~torchless.pickle.machine.Unpickler`).

A state-dict entry as torch writes it (:data:`_ENTRY`) runs in one step: matched whole
by a regular expression, or found with the entries of a window together by the windowed
tokeniser (:mod:`torchless.pickle.entryscan`) and, with the caller's
``persistent_load_many``, built in one batch with its memo stores deferred
(:class:`EntryRunner`). Each entry has exactly the effects the loop's opcodes would have,
in the same order; the first one that does not check out is left to the loop.
``SETTINGS.tensor_calls`` (``scan_entries``, ``batch_entries``) select these paths.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any, Protocol

from ..core.errors import TorchlessError
from ..core.settings import SETTINGS
from .globals import Rebuilder

__all__ = ["PersistentLoadMany", "EntryRunner", "MEMO_INDEX_LIMIT"]

_unpack_i = struct.Struct("<i").unpack_from
_unpack_I = struct.Struct("<I").unpack_from
_unpack_H = struct.Struct("<H").unpack_from


class PersistentLoadMany(Protocol):
    """The persistent loads of a run of state-dict entries, at once.

    Row ``j`` stands for the persistent id ``(head, storage_class, keys[j], location,
    numels[j])`` where ``(head, storage_class, location) = parts[combo[j]]`` (the values
    the pickle's memo holds; a run repeats a few of them; None: parts no row uses). The result is what
    ``persistent_load`` returns for the ids of rows ``0 .. len(result) - 1``, in order,
    with the same effects: an implementation may stop before any row it does not handle
    on its common path (it never raises), and the machine then runs that row's entry
    through ``persistent_load`` itself.
    """

    def __call__(
        self, parts: list[tuple[Any, Any, Any] | None], combo: list[int], keys: list[str], numels: list[int], /
    ) -> list[Any]: ...


#: memo keys the strict flavour accepts (CPython allocates an array of twice the key)
MEMO_INDEX_LIMIT = 1 << 28
_MEMO_INDEX_LIMIT = MEMO_INDEX_LIMIT


#: A state-dict entry as torch writes it, after the key's BINUNICODE: ``PUT
#: rebuild-function MARK MARK 'storage' storage-class key PUT location numel TUPLE PUT
#: BINPERSID offset size [PUT] stride [PUT] requires_grad OrderedDict EMPTY_TUPLE REDUCE
#: PUT TUPLE PUT REDUCE PUT`` (PUT: BINPUT or LONG_BINPUT); the strings and functions
#: torch repeats are memo reads (BINGET or LONG_BINGET), the storage key is a decimal
#: string, sizes and strides are tuples of ints. Groups (from 0): 0 key store, 1 function,
#: 2 'storage', 3 storage class, 4-5 key length and key, 6 its store, 7 location, 8 numel,
#: 9 pid store, 10 offset, 11-12 size and store, 13-14 stride and store, 15
#: requires_grad, 16 OrderedDict, 17-19 stores of the three results.
_GET = rb"(h.|j....)"
_PUT = rb"(q.|r....)"
_INT = rb"(K.|M..|J....)"
_TUP = rb"(\)|\((?:K.|M..|J....){0,64}t|(?:K.|M..|J....){1,3}[\x85-\x87])" + _PUT + rb"?"
_ENTRY = re.compile(
    _PUT
    + _GET
    + rb"\(\("
    + _GET
    + _GET
    + rb"X(.)\x00\x00\x00([0-9]{1,19})"
    + _PUT
    + _GET
    + _INT
    + rb"t"
    + _PUT
    + rb"Q"
    + _INT
    + _TUP
    + _TUP
    + rb"([\x88\x89])"
    + _GET
    + rb"\)R"
    + _PUT
    + rb"t"
    + _PUT
    + rb"R"
    + _PUT,
    re.S,
)
_TUPLE_OPS = {0x85: 1, 0x86: 2, 0x87: 3}
_SCAN_BYTES = 1 << 12
_SCAN_WINDOW = 1 << 23
#: the indices of 6, 7 or 8 LONG_BINPUTs in a row (an entry's memo stores)
_LONG_PUTS = {k: struct.Struct("<" + "xI" * k).unpack for k in (6, 7, 8)}
_tuples: dict[bytes, tuple[int, ...]] = {}


def _ref(g: bytes) -> int:
    """The memo index of a matched BINPUT/BINGET (2 bytes) or LONG_BINPUT/LONG_BINGET (5)."""
    return g[1] if len(g) == 2 else _unpack_I(g, 1)[0]


def _int(g: bytes) -> int:
    """A matched BININT1, BININT2 or BININT."""
    n = len(g)
    return g[1] if n == 2 else _unpack_H(g, 1)[0] if n == 3 else _unpack_i(g, 1)[0]


def _int_tuple(g: bytes) -> tuple[int, ...] | None:
    """A matched tuple of ints (EMPTY_TUPLE, TUPLE1-3 or MARK ... TUPLE); None when the
    count of items does not fit the TUPLEn opcode."""
    t = _tuples.get(g)
    if t is not None:
        return t
    if g == b")":
        return ()
    body = g[1:-1] if g[0] == 0x28 else g[:-1]
    items = []
    p = 0
    while p < len(body):
        w = {0x4B: 2, 0x4D: 3, 0x4A: 5}[body[p]]
        items.append(_int(body[p : p + w]))
        p += w
    if g[0] != 0x28 and _TUPLE_OPS[g[-1]] != len(items):
        return None
    t = tuple(items)
    if len(_tuples) < 4096:
        _tuples[g] = t
    return t


def _deferred_stores(
    d: dict[int, Any],
    puts: Any,
    names: list[str],
    keys: list[str],
    parts: list[Any],
    combo: list[int],
    numels: list[int],
    sizes: list[tuple[int, ...]],
    strides: list[tuple[int, ...]],
    offsets: list[int],
    rgs: list[bool],
    tensors: list[Any],
) -> None:
    """The memo stores of a batched entry run (``puts``: per entry the keys of name, key,
    pid, size, stride, OrderedDict, args and tensor, -1 for a tuple not stored), in
    opcode order, with the values the entry loop stores: the same objects where they
    exist (name, key, size, stride, tensor), equal ones made now for the rest (the pid
    tuple, an empty OrderedDict, the args tuple holding that OrderedDict)."""
    from ..core.values import StateDict

    for j, row in enumerate(puts.tolist()):
        head, stype, loc = parts[combo[j]]
        key, t, size, stride = keys[j], tensors[j], sizes[j], strides[j]
        od = StateDict()
        vals = (
            names[j],
            key,
            (head, stype, key, loc, numels[j]),
            size,
            stride,
            od,
            (t.storage, offsets[j], size, stride, rgs[j], od),
            t,
        )
        for k, v in zip(row, vals, strict=True):
            if k >= 0:
                d[k] = v


class EntryRunner:
    """The entry fast path of one run of the machine's loop: its state is the loop's
    (``memo``, the deferred stores ``lazy``, ``info``...), shared, not copied; ``stack``
    and the memo limit left (``cap``) are passed on each call, and the stores a batched
    run deferred are counted in :attr:`deferred` (the loop takes them off its ``cap``)."""

    def __init__(
        self,
        up: Any,
        data: Any,
        n: int,
        memo: dict[int, Any],
        metastack: list[list[Any]],
        lazy: list[Callable[[dict[int, Any]], None]],
        lazy_top: list[int],
        call: Callable[[Any, Any, int, str], Any],
    ) -> None:
        self.up = up  # the Unpickler: persistent_load(_many), _persistent
        self.data, self.n, self.memo, self.metastack = data, n, memo, metastack
        self.lazy, self.lazy_top, self.call = lazy, lazy_top, call
        self.info = up.info
        self.max_obj = up.limits.max_object_bytes
        self.max_marks = up.limits.max_marks
        #: memo stores deferred by batched runs since the loop last took them
        self.deferred = 0
        #: runs that found no entry (the loop stops trying after 1024)
        self.misses = [0]
        # (len(memo), 1 + its largest key) when last computed: keys are only ever added,
        # so an unchanged length means an unchanged key set
        self.memo_top = [-1, 0]
        self.scan_cache: Any = None  # (lo, hi, Scanned, chain breaks) of the last window

    def scanned_run(self, p: int, top: int, room: int, stack: list[Any]) -> int:
        """The entries from ``p`` found together by :func:`~torchless.pickle.entryscan.scan`
        (a window of the data), with the checks and effects of :func:`entries`; the
        position after the last one run (``p`` when none)."""
        data, n, memo, info, max_obj, call = self.data, self.n, self.memo, self.info, self.max_obj, self.call
        memo_top = self.memo_top
        import numpy as np

        from ..core.tensor import Storage, Tensor
        from ..core.values import StateDict
        from .entryscan import scan
        from .torch_globals import _ordered_dict, _rebuild_tensor_v2

        got = self.scan_cache
        if got is None or not got[0] <= p < got[1]:
            hi = min(n, p + _SCAN_WINDOW)
            sc = scan(data, p, hi)
            if sc is None:
                # no entry in the window, so none at any later position in it either:
                # remembered, or every miss would scan the window again (a legacy
                # stream's pickle is followed by its storages: 8 MiB of them, a
                # thousand times, took 40 s for 3,000 tensors)
                self.scan_cache = (p, hi, None, None)
                return p
            starts, ends = sc.start, sc.end
            count = len(starts)
            nxt = np.searchsorted(starts, ends)
            # where a candidate is not followed by the one starting where it ends
            breaks = np.flatnonzero(~((nxt == np.arange(1, count + 1)) & (starts[np.minimum(nxt, count - 1)] == ends)))
            got = self.scan_cache = (p, hi, sc, breaks)
        sc, breaks = got[2], got[3]
        if sc is None:
            return p
        starts, ends = sc.start, sc.end
        i0 = int(np.searchsorted(starts, p))
        if i0 >= len(starts) or int(starts[i0]) != p:
            return p
        b = int(np.searchsorted(breaks, i0))
        cnt = (int(breaks[b]) + 1 if b < len(breaks) else len(starts)) - i0
        sl = slice(i0, i0 + cnt)
        gets, puts = sc.gets[sl], sc.puts[sl]
        stored = puts >= 0
        bad = (gets >= top).any(axis=1)
        bad |= (stored & ((puts < top) | (puts >= _MEMO_INDEX_LIMIT))).any(axis=1)
        bad |= np.cumsum(stored.sum(axis=1)) > room
        bad |= sc.kend[sl] - starts[sl] - 5 > max_obj
        # the rows of memo reads, numbered (few distinct ones: the same five reads per dtype)
        flat = np.sort(gets, axis=None)  # np.unique without its first-call import of numpy.ma
        distinct = flat[np.concatenate(([True], flat[1:] != flat[:-1]))]
        if len(distinct) > 1000:
            return p
        lab = np.searchsorted(distinct, gets)
        code = (((lab[:, 0] * 1000 + lab[:, 1]) * 1000 + lab[:, 2]) * 1000 + lab[:, 3]) * 1000 + lab[:, 4]
        if (code == code[0]).all():
            inv = np.zeros(cnt, dtype=np.int64)
            firsts = [0]
        else:
            _u, firsts_a, inv = np.unique(code, return_index=True, return_inverse=True)
            firsts = firsts_a.tolist()
        combos: list[list[Any] | None] = []
        for j, r in enumerate(firsts):
            row = gets[r].tolist()
            if all(i in memo for i in row):
                combos.append([memo[i] for i in row])
            else:
                combos.append(None)
                bad |= inv.ravel() == j
        if bad.any():
            cnt = int(bad.argmax())
        if not cnt:
            return p
        plf = self.up.persistent_load
        if plf is None:  # no persistent ids allowed: the general loop refuses the entry
            return p
        plm = self.up.persistent_load_many
        if (
            SETTINGS.batch_entries
            and plm is not None
            and all(
                c is None
                or (
                    type(c[0]) is Rebuilder
                    and c[0]._call is _rebuild_tensor_v2
                    and type(c[4]) is Rebuilder
                    and c[4]._call is _ordered_dict
                )
                for c in combos
            )
        ):
            q = self.batched_run(p, i0, cnt, sc, combos, inv, plm, stack)
            if q > p:
                return q
        make = Tensor._make
        out: list[Any] = []
        put: list[Any] = []
        done = 0
        sl = slice(i0, i0 + cnt)
        rows = zip(
            starts[sl].tolist(),
            sc.kend[sl].tolist(),
            sc.skey0[sl].tolist(),
            sc.skey1[sl].tolist(),
            sc.numel[sl].tolist(),
            sc.offset[sl].tolist(),
            sc.size[sl],
            sc.stride[sl],
            sc.rg[sl].tolist(),
            inv.ravel()[:cnt].tolist(),
            stored[:cnt, 3].tolist(),
            stored[:cnt, 4].tolist(),
            sc.at_q[sl].tolist(),
            sc.at_od[sl].tolist(),
            sc.at_t[sl].tolist(),
            strict=True,
        )
        for s0, ke, k0, k1, numel, offset, size, stride, rgv, ci, has_size, has_stride, at_q, at_od, at_t in rows:
            try:
                name = str(data[s0 + 5 : ke], "utf-8", "surrogatepass")
            except UnicodeError:
                break
            fn, storage_s, stype, loc, odfn = combos[ci]
            key = str(data[k0:k1], "ascii")
            pid = (storage_s, stype, key, loc, numel)
            try:
                storage = plf(pid)
            except TorchlessError as e:  # as _persistent does
                if e.offset is None:
                    e.offset = at_q
                raise
            if type(odfn) is Rebuilder and odfn._call is _ordered_dict:
                od = StateDict()
            else:
                od = call(odfn, (), at_od, "REDUCE")
            args = (storage, offset, size, stride, rgv, od)
            if type(fn) is Rebuilder and fn._call is _rebuild_tensor_v2 and type(storage) is Storage:
                t = make(storage, storage.dtype, size, stride, offset, rgv, None)
            else:
                t = call(fn, args, at_t, "REDUCE")
            out += (name, t)
            put += (name, key, pid)  # in the order of the stores
            if has_size:
                put.append(size)
            if has_stride:
                put.append(stride)
            put += (od, args, t)
            done += 1
        if not done:
            return p
        idx = puts[:done][stored[:done]].tolist()
        memo.update(zip(idx, put, strict=True))
        memo_top[0] = len(memo)
        memo_top[1] = max(top, max(idx) + 1)
        stack.extend(out)
        info.fast_entries += done
        info.scanned_entries += done
        return int(ends[i0 + done - 1])

    def batched_run(
        self, p: int, i0: int, cnt: int, sc: Any, combos: list[Any], inv: Any, plm: PersistentLoadMany, stack: list[Any]
    ) -> int:
        """The checked entries ``i0 .. i0 + cnt`` of a scanned window, for the default
        tensor and OrderedDict rebuilders, in one batch: their storages from one call of
        ``persistent_load_many``, their tensors built together, their memo stores
        deferred (``lazy``: nothing reads them in the pickles torch writes). Entries are
        taken while their sizes, strides and offsets are what ``Tensor._make`` takes
        as they are; the position after the last one (``p`` when none)."""
        data, info, lazy, lazy_top, memo_top = self.data, self.info, self.lazy, self.lazy_top, self.memo_top
        from ..core.tensor import Storage, Tensor
        from .entryscan import window_text

        plain = sc.plain[i0 : i0 + cnt]
        if not plain.all():
            cnt = int(plain.argmin())
            if not cnt:
                return p
        sl = slice(i0, i0 + cnt)
        # names and keys as slices of the window's Latin-1 text: what the UTF-8 and
        # ASCII decoding of their bytes gives when they are ASCII (keys always are:
        # the tokeniser took only digits), checked for the names all at once
        text, lo = window_text(sc), sc.lo
        names = [text[a:b] for a, b in zip((sc.start[sl] + (5 - lo)).tolist(), (sc.kend[sl] - lo).tolist(), strict=True)]
        if not "".join(names).isascii():
            try:
                names = [
                    str(data[a + 5 : b], "utf-8", "surrogatepass")
                    for a, b in zip(sc.start[sl].tolist(), sc.kend[sl].tolist(), strict=True)
                ]
            except UnicodeError:
                return p  # the entry loop stops at the name that does not decode
        keys = [text[a:b] for a, b in zip((sc.skey0[sl] - lo).tolist(), (sc.skey1[sl] - lo).tolist(), strict=True)]
        ci = inv.ravel()[:cnt].tolist()
        numels = sc.numel[sl].tolist()
        parts = [(c[1], c[2], c[3]) if c is not None else None for c in combos]
        storages = plm(parts, ci, keys, numels)
        done = len(storages)
        if not done or set(map(type, storages)) != {Storage}:  # (no call per storage)
            return p
        if done < cnt:
            del names[done:], keys[done:], ci[done:], numels[done:]
        e = i0 + done
        sizes, strides = sc.size[i0:e], sc.stride[i0:e]
        offsets = sc.offset[i0:e].tolist()
        rgs = sc.rg[i0:e].tolist()
        tensors = Tensor._make_many(storages, sizes, strides, offsets, rgs)
        out: list[Any] = [None] * (2 * done)
        out[0::2] = names
        out[1::2] = tensors
        stack.extend(out)
        puts = sc.puts[i0:e]
        stores = int((puts >= 0).sum())
        new_top = int(puts.max()) + 1
        lazy.append(lambda d: _deferred_stores(d, puts, names, keys, parts, ci, numels, sizes, strides, offsets, rgs, tensors))
        self.deferred += stores
        lazy_top[0] = max(lazy_top[0], new_top)
        memo_top[1] = max(memo_top[1], new_top)
        info.fast_entries += done
        info.scanned_entries += done
        return int(sc.end[e - 1])

    def entries(self, p: int, stack: list[Any], cap: int) -> int:
        """Run a run of torch state-dict entries at ``p`` in one pass; -1 if there is
        none (see :data:`_ENTRY`).

        Each entry is ``key PUT rebuild-function (( pid... ) ... REDUCE PUT`` exactly as
        torch writes it. The run only goes on while every memo read of its entries is
        of a key stored before the run began and every store is of a key above all of
        those (as torch writes them: new keys, counting up), so no entry reads what the
        run stores and the memo stores can all be made after the effects. Each entry
        is checked whole before its effects, which are exactly what the loop would do
        for its opcodes, in the same order: the persistent load at its BINPERSID
        offset, the OrderedDict REDUCE, the tensor REDUCE, on the values the memo
        holds. The first entry that does not check out ends the run before any of its
        effects, and the loop runs it opcode by opcode (raising its own errors).
        """
        data, n, memo, info, max_obj, call = self.data, self.n, self.memo, self.info, self.max_obj, self.call
        memo_top, lazy_top = self.memo_top, self.lazy_top
        if len(self.metastack) + 3 > self.max_marks or self.up.persistent_load is None:
            return -1
        if memo_top[0] != len(memo):
            memo_top[0] = len(memo)
            memo_top[1] = max(max(memo) + 1 if memo else 0, lazy_top[0])
        top = memo_top[1]
        room = cap - len(memo)  # stores of new keys the limit still allows
        one = False  # parse only one entry below (then the next call tries the scan again)
        if SETTINGS.scan_entries and n - p >= _SCAN_BYTES:
            q = self.scanned_run(p, top, room, stack)
            if q > p:
                return q
            one = True
        match = _ENTRY.match
        tuples = _tuples
        from ..core.tensor import Storage, Tensor
        from ..core.values import StateDict
        from .torch_globals import _ordered_dict, _rebuild_tensor_v2

        pl = self.up._persistent
        make = Tensor._make
        # the five memo reads of an entry -> what they hold (fixed for the whole run)
        fetched: dict[tuple[bytes, ...], list[Any]] = {}
        storage_s = None
        out: list[Any] = []
        idx: list[int] = []
        put: list[Any] = []
        start = p
        while p + 5 <= n and data[p] == 0x58:
            k = _unpack_I(data, p + 1)[0]
            e = p + 5 + k
            if k > max_obj or e > n:
                break
            m = match(data, e, n)
            if m is None:
                break
            g0, g1, g2, g3, kl, kb, g6, g7, g8, g9, g10, g11, g12, g13, g14, rg, g16, g17, g18, g19 = m.groups()
            if len(kb) != kl[0]:
                break
            size = tuples.get(g11) or _int_tuple(g11)
            stride = tuples.get(g13) or _int_tuple(g13)
            if size is None or stride is None:
                break
            got = fetched.get((g1, g2, g3, g7, g16))
            if got is None:
                got = []
                for r in (g1, g2, g3, g7, g16):
                    i = r[1] if len(r) == 2 else _unpack_I(r, 1)[0]
                    if i >= top or i not in memo:
                        break
                    got.append(memo[i])
                else:
                    fetched[(g1, g2, g3, g7, g16)] = got
                if len(got) != 5:
                    break
            fn, storage_s, stype, loc, odfn = got
            # the stores in the order of their opcodes
            stores: tuple[bytes, ...] = (g0, g6, g9, g17, g18, g19)
            if g12 is not None or g14 is not None:
                stores = (g0, g6, g9, *[x for x in (g12, g14) if x is not None], g17, g18, g19)
            joined = b"".join(stores)
            if len(joined) == 5 * len(stores):  # all LONG_BINPUT (past the first 256 stores)
                ids = _LONG_PUTS[len(stores)](joined)
            else:
                ids = tuple([r[1] if len(r) == 2 else _unpack_I(r, 1)[0] for r in stores])
            if min(ids) < top or max(ids) >= _MEMO_INDEX_LIMIT or len(idx) + len(ids) > room:
                break
            try:
                name = str(data[p + 5 : e], "utf-8", "surrogatepass")
            except UnicodeError:
                break
            idx += ids
            # the effects, in the loop's order
            key = kb.decode("ascii")
            pid = (storage_s, stype, key, loc, _int(g8))
            storage = pl(pid, m.start(11) - 1)
            if type(odfn) is Rebuilder and odfn._call is _ordered_dict:
                od = StateDict()
            else:
                od = call(odfn, (), m.end(17) + 1, "REDUCE")
            offset = _int(g10)
            rgv = rg == b"\x88"
            args = (storage, offset, size, stride, rgv, od)
            if type(fn) is Rebuilder and fn._call is _rebuild_tensor_v2 and type(storage) is Storage:
                t = make(storage, storage.dtype, size, stride, offset, rgv, None)
            else:
                t = call(fn, args, m.start(20) - 1, "REDUCE")
            out += (name, t)
            put += (name, key, pid)  # in the order of ``stores``
            if g12 is not None:
                put.append(size)
            if g14 is not None:
                put.append(stride)
            put += (od, args, t)
            p = m.end()
            if one:
                break
        if out:
            memo.update(zip(idx, put, strict=True))
            memo_top[0] = len(memo)
            memo_top[1] = max(top, max(idx) + 1)
            stack.extend(out)
            info.fast_entries += len(out) >> 1
        if p == start:
            self.misses[0] += 1
            return -1
        return p
