"""The engine's native code (native.cpp): its own product, and the compact forward's steps between products.

The product reads a float32 weight copied once into blocks of eight output features, in memory backed by 2 MiB
pages, as one stream per thread. On the 2-core host measured, a one-row product over SmolLM2's weights read them at
~21 GB/s this way against oneDNN's ~18 (its best one-row product), and at ~27 GB/s with the copies on 2 MiB pages:
streaming 540 MB through 4 KiB pages takes a TLB miss per page. The steps call the same ATen operators as their
Python twins (compact_llama.Steps) without the interpreter between them.

The extension is built on first use by torch's extension builder (a C++ compiler and ninja; ~30 s once, then loaded
from torch's extension cache) and only on CPUs with AVX2 and FMA; where it cannot be, `module` raises RuntimeError
saying why: the kernel table never chooses the product and the compact forward takes the Python steps.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from runner.engine.weights.sources import exclusive

NAME = "specdash_native"
SOURCE = Path(__file__).with_name("native.cpp")
LANES = 8  # output features per block (native.cpp)
HUGE_PAGE = 2 << 20
SLAB = 64 << 20  # bytes cut into blocked copies; a larger copy gets a slab of its own
MADV_HUGEPAGE = 14  # Linux's madvise advice number

_built: ModuleType | None = None
_why_not: str | None = None


def flags() -> list[str]:
    """The compiler's flags: AVX2 and FMA, and AVX-512's 32 vector registers where the CPU has them (a product's
    sweep of a few rows keeps more of its sums in registers: five rows ~0.8x the time on the 2-core EPYC measured)."""
    wide = ["-mavx512f", "-mavx512vl"] if torch.backends.cpu.get_cpu_capability() == "AVX512" else []
    return ["-O3", "-mavx2", "-mfma", *wide, "-fopenmp"]


def version() -> str:
    """The native source's and flags' digest: a kernel table measured on another build is measured again."""
    return hashlib.sha256(SOURCE.read_bytes() + " ".join(flags()).encode()).hexdigest()[:12]


def supported() -> str | None:
    """Why the product cannot be built here, or None when it can (cheap: nothing is compiled)."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return f"the CPU has no AVX2 (torch sees {torch.backends.cpu.get_cpu_capability()})"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler on PATH"
    return None


def module() -> ModuleType:
    """The built extension (built on first use, once per host and source); RuntimeError saying why it cannot be."""
    global _built, _why_not
    if _built is None and _why_not is None:
        _why_not = supported()
        if _why_not is None:
            _built, _why_not = _build()
            if _why_not is not None:
                print(f"specdash: the native code is not available ({_why_not}); torch's products and Python serve",
                      file=sys.stderr)
    if _built is None:
        raise RuntimeError(f"native code unavailable: {_why_not}")
    return _built


def _build() -> tuple[ModuleType | None, str | None]:
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None:  # the environment's own ninja, beside this interpreter, when not on PATH
        os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    try:
        build = Path(cpp_extension._get_build_directory(NAME, verbose=False))
        # One process builds at a time under an flock, which dies with its process; torch's own lock file does not,
        # so one left by a build killed midway would stall every later build: under ours, it is stale.
        with exclusive(build / "specdash.lock"):
            (build / "lock").unlink(missing_ok=True)
            return cpp_extension.load(NAME, [str(SOURCE)], extra_cflags=flags(),
                                      extra_ldflags=["-fopenmp"],
                                      build_directory=str(build)), None
    except (RuntimeError, OSError, ImportError) as error:
        lines = str(error).strip().splitlines() or ["build failed"]
        return None, next((line.strip() for line in lines if "error:" in line), lines[-1])


_slab: Tensor | None = None
_slab_used = 0  # floats of the current slab handed out
_cutting = threading.Lock()  # two threads' copies never share a cut


def huge_empty(count: int) -> Tensor:
    """`count` uninitialised float32 values in memory the kernel is asked to back with 2 MiB pages (on Linux;
    elsewhere, ordinary memory). Cut from shared slabs, which live while any tensor cut from them does."""
    global _slab, _slab_used
    count = -(-count // 16) * 16  # 64-byte aligned cuts
    with _cutting:
        if _slab is None or _slab_used + count > _slab.numel():
            size = max(SLAB, -(-count * 4 // HUGE_PAGE) * HUGE_PAGE)
            raw = torch.empty((size + HUGE_PAGE) // 4)  # untouched: pages come on first write, so advice holds
            start = (-raw.data_ptr() % HUGE_PAGE) // 4
            _slab, _slab_used = raw[start : start + size // 4], 0
            _advise_huge(_slab)
        out = _slab[_slab_used : _slab_used + count]
        _slab_used += count
    return out


def _advise_huge(region: Tensor) -> None:
    """Best effort: a kernel without transparent huge pages leaves the region on ordinary pages."""
    if sys.platform != "linux":
        return
    ctypes.CDLL(None).madvise(ctypes.c_void_p(region.data_ptr()), ctypes.c_size_t(region.numel() * 4), MADV_HUGEPAGE)


def blocked(weight: Tensor) -> Tensor:
    """(features, k) float32 as (blocks, k, LANES): block b, input feature c, lane j holds weight[8b + j, c]; the
    features padded with zeros to a multiple of LANES. Ordinary tensors even when asked for in inference mode: the
    slabs are shared by copies made in and out of it."""
    features, k = weight.shape
    blocks = -(-features // LANES)
    with torch.inference_mode(False), torch.no_grad():
        out = huge_empty(blocks * k * LANES)[: blocks * k * LANES].view(blocks, k, LANES)
        padded = torch.zeros(blocks * LANES, k) if features % LANES else None
        if padded is not None:
            padded[:features] = weight
        out.copy_((weight if padded is None else padded).view(blocks, LANES, k).transpose(1, 2))
    return out


def product(x: Tensor, weight_blocks: Tensor, bias: Tensor | None, features: int) -> Tensor:
    """x (rows, k) float32 times the blocked weight of `features` features (+ the bias): (rows, features)."""
    return module().product(x, weight_blocks, bias, features)


if __name__ == "__main__":  # build ahead of use (make test does): one line, and exit 0 either way
    try:
        print(f"native code: {module().__file__}")
    except RuntimeError as error:
        print(f"native code: {error}")
