"""CPU matrix products for the 1-64 rows a decode pass carries (a chain, a tree, a batch) and the wider pass over a
prompt, chosen per weight shape and row count from measurement.

`F.linear(x, W)` with 2-16 rows takes a CPU BLAS path that streams W once per row, and with one row a
matrix-vector path that leaves bandwidth unused; `W @ xᵀ` streams W once for all rows, and oneDNN's matmul on a
weight reordered once into its blocked layout ("packed") computes wider passes closer to the machine's peak;
our own product ("blocked", native.py) reads a copy in blocks of eight output features on 2 MiB pages as one
stream per thread, the fastest one-row product measured here.
Which product wins depends on the shape, the row count, the thread count and the library, so each candidate is
timed on the model's own weights at a ladder of row counts and the fastest is used where it beats stock by a
margin; a row count between two rungs takes the choice of the rung above it, a pass wider than every decode pass
that of the widest rung. Every nn.Linear of an
attached model goes through `Kernels`, which runs stock outside `use()`: transformers' own `generate`
on the same model object keeps the stock path. CUDA models are never attached (cuBLAS handles them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from runner.engine.weights import attention, compact_llama, native
from runner.engine.weights.sources import cache_dir, exclusive

STOCK, SKINNY = "stock", "skinny"  # values of --kernels: torch's own F.linear, or the measured choice
PACKED, BLOCKED = "packed", "blocked"  # oneDNN's product on its reordered weight; ours (native.py)
MAX_ROWS = 64  # the widest tree (63 nodes and the root) or a batch's B x (k+1)
# The row counts measured; each covers those above the last. The last, WIDE_ROWS, covers every pass wider than
# MAX_ROWS (a prompt's prefill): oneDNN's packed product computed 100-400 rows 1.1-1.7x as fast as stock here.
WIDE_ROWS = 128
RUNGS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, MAX_ROWS, WIDE_ROWS)
MARGIN = 0.05  # a candidate replaces stock only when its median is this much faster, so noise alone never does
REPEATS = 5  # timed sweeps over the weights per candidate, shape and row count; the median is kept
CHECKS = 3  # interleaved timings of a cached choice and stock when a table is read back (`confirmed`)

Shape = tuple[int, int]  # (out_features, in_features)
Table = dict[Shape, tuple[str, ...]]  # the candidate per row count 1..MAX_ROWS, then one for every wider pass
Timings = dict[Shape, dict[int, dict[str, list[float]]]]  # shape -> rung -> candidate -> seconds per product


def parse_kernels(text: str) -> str:
    """A `--kernels` value; ValueError otherwise."""
    if text not in (STOCK, SKINNY):
        raise ValueError(f'unknown kernels "{text}"; use {SKINNY} or {STOCK}')
    return text


FEW_COLUMNS = 8  # up to this many, a product's columns are turned into rows one at a time (`_as_rows`)


def _columns(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    # (N, K) @ (K, M): one pass over W for all M rows.
    return torch.mm(w, x.T) if b is None else torch.addmm(b[:, None], w, x.T)


def _as_rows(columns: Tensor) -> Tensor:
    """(N, M) product columns as contiguous (M, N) rows, like F.linear's output, so any model's views work. A tall
    output of few columns is copied a column at a time: a strided transpose of it is several times slower (the
    LM head's 49152 x 2 on 2 threads: 55 µs against 290 µs)."""
    return torch.stack(columns.unbind(1)) if columns.shape[1] <= FEW_COLUMNS else columns.T.contiguous()


def _transposed(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return _as_rows(_columns(x, w, b))


def _two_columns(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    # One row as a 2-column product: a matrix-matrix kernel where stock takes a matrix-vector one. The row is
    # doubled by `cat`, which dispatches in a fraction of `repeat`'s time; only the first column is kept.
    return _as_rows(_columns(torch.cat((x, x)), w, b)[:, :1])


_COPIES: dict[tuple[str, int], tuple[weakref.ref, Tensor]] = {}  # (kind, id(weight)) -> (the weight, its copy)


def copy_of(kind: str, w: Tensor, make: Callable[[Tensor], Tensor]) -> Tensor:
    """`w`'s copy of this kind (`make(w)`), made on first use and kept while `w` lives. A model's weights are taken
    as fixed once copied: decoding never changes them."""
    key = (kind, id(w))
    entry = _COPIES.get(key)
    if entry is None or entry[0]() is not w:  # an id can be reused once its tensor is gone
        def forget(ref: weakref.ref, key: tuple[str, int] = key) -> None:
            if _COPIES.get(key, (None,))[0] is ref:
                del _COPIES[key]

        with torch.no_grad():
            entry = (weakref.ref(w, forget), make(w))
        _COPIES[key] = entry
    return entry[1]


def drop_copy(kind: str, w: Tensor) -> None:
    """Drop `w`'s copy of this kind (its memory) if it has one."""
    entry = _COPIES.get((kind, id(w)))
    if entry is not None and entry[0]() is w:
        del _COPIES[(kind, id(w))]


def packed_weight(w: Tensor) -> Tensor:
    """oneDNN's reordered copy of `w` (laid out for passes of up to MAX_ROWS rows; it serves any)."""
    return copy_of(PACKED, w, lambda w: torch.ops.mkldnn._reorder_linear_weight(w, MAX_ROWS))


def _on_packed(w: Tensor, b: Tensor | None) -> Callable[[Tensor], Tensor]:
    packed = packed_weight(w)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [None], "")


def _on_blocked(w: Tensor, b: Tensor | None) -> Callable[[Tensor], Tensor]:
    # Our own one-stream product (native.py)
    blocks, product, features = copy_of(BLOCKED, w, native.blocked), native.module().product, w.shape[0]
    return lambda x: product(x, blocks, b, features)


def _packed(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return _on_packed(w, b)(x)


def _blocked(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    # float32 only: any other dtype is refused as oneDNN refuses float16
    if not (x.dtype == w.dtype == torch.float32 and (b is None or b.dtype == torch.float32)):
        raise RuntimeError("the blocked product is float32 only")
    return _on_blocked(w, b)(x)


CANDIDATES: dict[str, Callable[[Tensor, Tensor, Tensor | None], Tensor]] = {
    STOCK: F.linear, "transposed": _transposed, "two_columns": _two_columns,
    **({PACKED: _packed} if torch.backends.mkldnn.is_available() else {}),
    **({BLOCKED: _blocked} if native.supported() is None else {}),
}
# The candidates that read a copy of the weight in their own layout: each one's product on a weight and bias, the copy
# found once (`bind`).
ON_COPY: dict[str, Callable[[Tensor, Tensor | None], Callable[[Tensor], Tensor]]] = {PACKED: _on_packed,
                                                                                      BLOCKED: _on_blocked}
COPIED = tuple(ON_COPY)


def bind(name: str, w: Tensor, b: Tensor | None) -> Callable[[Tensor], Tensor]:
    """`CANDIDATES[name]` on this weight and bias, as a pass calls it: a copy it reads found once, not per call (a
    one-token pass makes ~120 products; finding each one's copy and checking its dtypes per call cost ~1 ms of it). A
    table chooses a candidate only where it ran on the weight's dtype, so the bound product checks nothing."""
    if name in ON_COPY:
        return ON_COPY[name](w, b)
    product = CANDIDATES[name]
    return lambda x: product(x, w, b)


# Row counts a candidate is tried at (default: all). The blocked product sums up to 8 rows in one sweep over the
# weight (native.cpp), and a wider pass a few blocks at a time for all its rows while they are in cache; on
# SmolLM2's products, 2 threads, it computed 9-64 rows faster than oneDNN's and 128-2,000 rows about as fast, so it is
# tried at every rung.
_ROWS = {"two_columns": range(1, 2)}


def candidates(rows: int) -> list[str]:
    return [name for name in CANDIDATES if name not in _ROWS or rows in _ROWS[name]]


def rung(rows: int) -> int:
    """The measured row count whose choice serves `rows`: the smallest rung at or above it."""
    return next((r for r in RUNGS if r >= rows), WIDE_ROWS)


def slot(rows: int) -> int:
    """The index of `rows`'s choice in a table's tuple: one per row count up to MAX_ROWS, then one for all wider."""
    return min(rows, MAX_ROWS + 1) - 1


SLOTS = range(1, MAX_ROWS + 2)  # a row count per slot: 1..MAX_ROWS, and MAX_ROWS + 1 for every wider pass


def choose(medians: dict[str, float]) -> str:
    """The fastest candidate if it beats stock by MARGIN, else stock."""
    best = min(medians, key=lambda name: (medians[name], name != STOCK))
    return best if medians[best] < (1 - MARGIN) * medians[STOCK] else STOCK


def relative(times: dict[str, list[float]]) -> dict[str, float]:
    """Each candidate's median, over the sweeps, of its time over stock's in the same sweep: a load that comes or
    goes between sweeps slows both sides of a pair, so it does not decide."""
    return {name: statistics.median(t / s for t, s in zip(series, times[STOCK], strict=True))
            for name, series in times.items()}


def table_from(timings: Timings) -> Table:
    """The choices the timings call for, per slot (each from its rung): a pure function, so a
    cached measurement always gives the same table."""
    table = {}
    for shape, by_rung in timings.items():
        chosen = {r: choose(relative(by_rung[r])) for r in RUNGS}
        table[shape] = tuple(chosen[rung(rows)] for rows in SLOTS)
    return table


def measure(linears: list[nn.Linear], repeats: int = REPEATS) -> Timings:
    """Seconds per product of every candidate, shape and rung, each timed over ALL the weights of its shape in
    turn, the shapes taking turns: in a pass the weights come from memory, not from cache, and so they do here.
    A candidate's weight copies are made in the first (untimed) sweep."""
    groups: dict[Shape, list[nn.Linear]] = {}
    for linear in linears:
        groups.setdefault(tuple(linear.weight.shape), []).append(linear)
    generator = torch.Generator().manual_seed(0)
    timings: Timings = {shape: {rows: {} for rows in RUNGS} for shape in groups}
    unsupported: set[tuple[str, Shape, int]] = set()  # e.g. oneDNN has no float16 inner product on most CPUs
    with torch.inference_mode():
        for repeat in range(repeats + 1):  # the first sweep warms the allocator and the libraries up
            for rows in RUNGS:
                for name in candidates(rows):
                    for shape, group in groups.items():
                        if (name, shape, rows) in unsupported:
                            continue
                        weight = group[0].weight
                        x = torch.randn(rows, shape[1], generator=generator).to(weight.dtype)
                        start = time.perf_counter()
                        try:
                            for linear in group:
                                CANDIDATES[name](x, linear.weight, linear.bias)
                        except RuntimeError:
                            if name == STOCK:
                                raise
                            unsupported.add((name, shape, rows))
                            continue
                        if repeat:
                            timings[shape][rows].setdefault(name, []).append((time.perf_counter() - start) / len(group))
    return timings


def _timed(name: str, group: list[nn.Linear], x: Tensor) -> float:
    start = time.perf_counter()
    for linear in group:
        CANDIDATES[name](x, linear.weight, linear.bias)
    return time.perf_counter() - start


def confirmed(table: Table, linears: list[nn.Linear], checks: int = CHECKS) -> Table:
    """`table` with each choice other than stock timed again here against stock, at its rung, on all the weights of
    its shape: the two alternate `checks` times and each keeps its fastest time (load only ever adds time, so the
    minimum of interleaved runs is what the product costs here). A choice not faster than stock so falls back to
    stock for the rows its rung serves: a cached table can never leave a pass slower than stock's."""
    groups: dict[Shape, list[nn.Linear]] = {}
    for linear in linears:
        groups.setdefault(tuple(linear.weight.shape), []).append(linear)
    out = dict(table)
    with torch.inference_mode():
        for shape, choices in table.items():
            for top in RUNGS:
                name = choices[slot(top)]
                if name == STOCK or shape not in groups:
                    continue
                x = torch.randn(top, shape[1]).to(groups[shape][0].weight.dtype)
                _timed(name, groups[shape], x)  # a weight's copy is made, and the libraries warm, untimed
                best = {STOCK: float("inf"), name: float("inf")}
                for _ in range(checks):
                    for candidate in best:
                        best[candidate] = min(best[candidate], _timed(candidate, groups[shape], x))
                if best[name] >= best[STOCK]:
                    served = [r for r in SLOTS if rung(r) == top]
                    out[shape] = tuple(STOCK if r in served else c for r, c in enumerate(out[shape], start=1))
    return out


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def all_cores() -> int:
    """The default thread count: OMP_NUM_THREADS when set, else every core this process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else len(os.sched_getaffinity(0))


class Kernels:
    """The switch on one model's linears and grouped attention: stock, except inside `use()`, where each linear
    takes its shape's choice and a masked pass's attention reads grouped key/value heads in place (attention.py)."""

    def __init__(self, model: nn.Module) -> None:
        # A Llama-style model also takes the compact forward while switched on (compact_llama.py): its fused
        # products are measured and chosen for; the q, k, v, gate and up products they replace are not (a call the
        # compact forward leaves to transformers runs them stock where their shape has no choice of its own).
        self.compact = compact_llama.install(model, self.on)
        every = [m for m in model.modules() if isinstance(m, nn.Linear)]
        replaced = {id(m) for m in self.compact.replaced()} if self.compact else set()
        fused = self.compact.linears() if self.compact else []
        self.linears = [m for m in every if id(m) not in replaced] + fused  # the measured ones
        self.tables: dict[int, Table] = {}  # per thread count
        self.active: Table | None = None
        self.bound: list[dict] = []  # each linear's bound products (`_forward`), dropped with the copies they read
        for linear in every + fused:
            linear.forward = self._forward(linear)  # an instance attribute: the class stays torch's
        attention.follow(model, lambda: self.active is not None)

    def on(self) -> bool:
        """Whether our kernels (and the compact forward) run now: inside `use()`."""
        return self.active is not None

    def _forward(self, linear: nn.Linear) -> Callable[[Tensor], Tensor]:
        shape = tuple(linear.weight.shape)
        features, width = shape
        bound: dict[str, tuple[Tensor, Callable[[Tensor], Tensor]]] = {}  # candidate -> (the weight, `bind`'s product)
        self.bound.append(bound)

        def forward(x: Tensor) -> Tensor:
            rows = x.numel() // width
            choices = None if self.active is None else self.active.get(shape)
            if choices is None or rows < 1:
                return F.linear(x, linear.weight, linear.bias)
            name, weight = choices[slot(rows)], linear.weight
            entry = bound.get(name)
            if entry is None or entry[0] is not weight:  # a weight replaced since is bound afresh
                entry = bound[name] = (weight, bind(name, weight, linear.bias))
            return entry[1](x.reshape(rows, width)).view(*x.shape[:-1], features)

        return forward

    def _key(self, threads: int) -> dict:
        dtypes = sorted({str(m.weight.dtype) for m in self.linears})
        shapes = sorted({tuple(m.weight.shape) for m in self.linears})
        return {"cpu": cpu_name(), "threads": threads, "torch": torch.__version__, "dtypes": dtypes,
                "shapes": shapes, "candidates": list(CANDIDATES), "rungs": list(RUNGS),
                "tried": {name: list(rows) for name, rows in _ROWS.items()}, "native": native.version()}

    def table(self, remeasure: bool = False) -> Table:
        """The choices at the current thread count: from the disk cache, else (or when asked to remeasure)
        measured, which takes seconds to a minute, and cached. A table read back that no process has confirmed yet
        is confirmed here once (`confirmed`: it may have been measured under another load, or on another host of
        the same CPU name) and cached so, and every later process uses that same table: the runs of one sweep,
        in this process or on its workers, compute with the same products and so the same floats."""
        threads = torch.get_num_threads()
        if remeasure or threads not in self.tables:
            key = self._key(threads)
            path = cache_dir() / "kernels" / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]}.json"
            table = None if remeasure else _cached_table(path)
            if table is None:
                # One process measures or confirms, the others wait and read its table: measured side by side,
                # each would time the other's load and choose from that.
                with exclusive(path.with_suffix(".lock")):
                    table = None if remeasure else _cached_table(path)
                    if table is None:
                        timings = None if remeasure else _cached(path)
                        if timings is None:
                            timings = measure(self.linears)
                            table = table_from(timings)
                        else:
                            table = confirmed(table_from(timings), self.linears)
                        temp = path.with_suffix(f".{os.getpid()}.tmp")
                        temp.write_text(json.dumps({"key": key, "timings": _timings_to_json(timings),
                                                    "table": _table_to_json(table)}))
                        temp.replace(path)  # atomic: a reader finds a whole file or none
            self.tables[threads] = table
            self._drop_unused_copies()
        return self.tables[threads]

    def _drop_unused_copies(self) -> None:
        """Keep a weight's copy of a kind only where its shape's table (at some thread count) takes that kind."""
        for bound in self.bound:
            bound.clear()
        for kind in COPIED:
            used = {shape for table in self.tables.values() for shape, names in table.items() if kind in names}
            for linear in self.linears:
                if tuple(linear.weight.shape) not in used:
                    drop_copy(kind, linear.weight)

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        before, self.active = self.active, self.table()
        try:
            yield
        finally:
            self.active = before


def _cached(path: Path) -> Timings | None:
    try:
        return _timings_from_json(json.loads(path.read_text())["timings"])
    except (OSError, ValueError, KeyError):
        return None


def _cached_table(path: Path) -> Table | None:
    """The confirmed table a cache file holds, or None (no file, or timings no process has confirmed yet)."""
    try:
        data = json.loads(path.read_text())["table"]
    except (OSError, ValueError, KeyError):
        return None
    return {tuple(int(d) for d in shape.split("x")): tuple(names) for shape, names in data.items()}


def _table_to_json(table: Table) -> dict:
    return {f"{n}x{k}": list(names) for (n, k), names in table.items()}


def _timings_to_json(timings: Timings) -> dict:
    return {f"{n}x{k}": {str(rows): names for rows, names in by_rows.items()} for (n, k), by_rows in timings.items()}


def _timings_from_json(data: dict) -> Timings:
    return {tuple(int(d) for d in shape.split("x")): {int(rows): names for rows, names in by_rows.items()}
            for shape, by_rows in data.items()}


_ATTACHED: weakref.WeakKeyDictionary[nn.Module, Kernels] = weakref.WeakKeyDictionary()


def attach(model: nn.Module) -> Kernels:
    """The model's switch, made on first use; a model is patched once however many pairs load it."""
    if model not in _ATTACHED:
        _ATTACHED[model] = Kernels(model)
    return _ATTACHED[model]


@contextlib.contextmanager
def using(switches: list[Kernels]) -> Iterator[None]:
    """Our kernels on these models for the duration."""
    with contextlib.ExitStack() as stack:
        for switch in switches:
            stack.enter_context(switch.use())
        yield
