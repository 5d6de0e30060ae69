"""CPU matrix products for the few rows a decode pass carries, chosen per weight shape from measurement.

`F.linear(x, W)` with 2-16 rows takes a CPU BLAS path that streams W once per row, and with one row a
matrix-vector path that leaves bandwidth unused; `W @ xᵀ` streams W once for all rows. Which product wins
depends on the shape, the row count, the thread count and the library, so each candidate is timed on
the model's own weights and the fastest is used where it beats stock by a margin. Every nn.Linear of an
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

from runner.engine.models import cache_dir

STOCK, SKINNY = "stock", "skinny"  # values of --kernels: torch's own F.linear, or the measured choice
MAX_ROWS = 16  # beyond a verify pass's rows (prefill), stock
MARGIN = 0.05  # a candidate replaces stock only when its median is this much faster, so noise alone never does
REPEATS = 3  # timed sweeps over the weights per candidate, shape and row count; the median is kept

Shape = tuple[int, int]  # (out_features, in_features)
Table = dict[Shape, tuple[str, ...]]  # the candidate per row count 1..MAX_ROWS
Timings = dict[Shape, dict[int, dict[str, list[float]]]]  # shape -> rows -> candidate -> seconds per product


def _transposed(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    # (N, K) @ (K, M): one pass over W for all M rows; contiguous like F.linear's, so any model's views work.
    out = torch.mm(w, x.T) if b is None else torch.addmm(b[:, None], w, x.T)
    return out.T.contiguous()


def _two_columns(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    # One row as a 2-column product: a matrix-matrix kernel where stock takes a matrix-vector one.
    return _transposed(x.repeat(2, 1), w, b)[:1]


def _onednn(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [None], "")


CANDIDATES: dict[str, Callable[[Tensor, Tensor, Tensor | None], Tensor]] = {
    STOCK: F.linear, "transposed": _transposed, "two_columns": _two_columns,
    **({"onednn": _onednn} if torch.backends.mkldnn.is_available() else {}),
}


# Row counts a candidate is tried at (default: all): oneDNN spends milliseconds per call on one row.
_ROWS = {"two_columns": range(1, 2), "onednn": range(2, MAX_ROWS + 1)}


def candidates(rows: int) -> list[str]:
    return [name for name in CANDIDATES if rows in _ROWS.get(name, range(1, MAX_ROWS + 1))]


def choose(medians: dict[str, float]) -> str:
    """The fastest candidate if it beats stock by MARGIN, else stock."""
    best = min(medians, key=lambda name: (medians[name], name != STOCK))
    return best if medians[best] < (1 - MARGIN) * medians[STOCK] else STOCK


def table_from(timings: Timings) -> Table:
    """The choices the timings call for: a pure function, so a cached measurement always gives the same table."""
    return {shape: tuple(choose({name: statistics.median(times) for name, times in by_rows[rows].items()})
                         for rows in range(1, MAX_ROWS + 1)) for shape, by_rows in timings.items()}


def measure(linears: list[nn.Linear], repeats: int = REPEATS) -> Timings:
    """Seconds per product of every candidate, shape and row count, each timed over ALL the weights of its shape
    in turn, the shapes taking turns: in a pass the weights come from memory, not from cache, and so they do here."""
    groups: dict[Shape, list[nn.Linear]] = {}
    for linear in linears:
        groups.setdefault(tuple(linear.weight.shape), []).append(linear)
    generator = torch.Generator().manual_seed(0)
    timings: Timings = {shape: {rows: {} for rows in range(1, MAX_ROWS + 1)} for shape in groups}
    unsupported: set[tuple[str, Shape, int]] = set()  # e.g. oneDNN has no float16 inner product on most CPUs
    with torch.inference_mode():
        for repeat in range(repeats + 1):  # the first sweep warms the allocator and the libraries up
            for rows in range(1, MAX_ROWS + 1):
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
    """The switch on one model's linears: stock, except inside `use()`, where each takes its shape's choice."""

    def __init__(self, model: nn.Module) -> None:
        self.linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.tables: dict[int, Table] = {}  # per thread count
        self.active: Table | None = None
        for linear in self.linears:
            linear.forward = self._forward(linear)  # an instance attribute: the class stays torch's

    def _forward(self, linear: nn.Linear) -> Callable[[Tensor], Tensor]:
        shape = tuple(linear.weight.shape)

        def forward(x: Tensor) -> Tensor:
            rows = x.numel() // shape[1]
            if self.active is None or not 1 <= rows <= MAX_ROWS:
                return F.linear(x, linear.weight, linear.bias)
            out = CANDIDATES[self.active[shape][rows - 1]](x.reshape(rows, shape[1]), linear.weight, linear.bias)
            return out.view(*x.shape[:-1], shape[0])

        return forward

    def _key(self, threads: int) -> dict:
        dtypes = sorted({str(m.weight.dtype) for m in self.linears})
        shapes = sorted({tuple(m.weight.shape) for m in self.linears})
        return {"cpu": cpu_name(), "threads": threads, "torch": torch.__version__, "dtypes": dtypes,
                "shapes": shapes, "candidates": list(CANDIDATES), "max_rows": MAX_ROWS}

    def table(self, remeasure: bool = False) -> Table:
        """The choices at the current thread count: from the disk cache, else (or when asked to remeasure)
        measured, which takes seconds to a minute, and cached."""
        threads = torch.get_num_threads()
        if remeasure or threads not in self.tables:
            key = self._key(threads)
            path = cache_dir() / "kernels" / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]}.json"
            try:
                if remeasure:
                    raise FileNotFoundError(path)
                timings = _timings_from_json(json.loads(path.read_text())["timings"])
            except (OSError, ValueError, KeyError):
                timings = measure(self.linears)
                path.parent.mkdir(parents=True, exist_ok=True)
                temp = path.with_suffix(f".{os.getpid()}.tmp")
                temp.write_text(json.dumps({"key": key, "timings": _timings_to_json(timings)}))
                temp.replace(path)  # atomic: a concurrent process finds a whole file or none
            self.tables[threads] = table_from(timings)
        return self.tables[threads]

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        before, self.active = self.active, self.table()
        try:
            yield
        finally:
            self.active = before


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
