"""Sweeps on Ray, measured on one machine: throughput, measurement truth under concurrency, and 1,000 cells.

    python bench/ray_bench.py                          # both parts, the defaults below
    python bench/ray_bench.py --part throughput --repeats 2
    python bench/ray_bench.py --part thousand --out bench/results/ray-cpu.md

(1) throughput: one plan (the default target, ngram at k = 2 and 4, the first --prompts-per-category prompts of
    each built-in category, greedy) swept by one process on one torch thread and by a local Ray cluster with
    --workers actors of one thread each, alternating, --repeats times. Runs per minute are counted over the
    cells (the first cell's start to the last cell's end, from the recorded runs); the start-up (Ray itself, then
    the actors loading and warming up the models; the process loading them) is reported apart. The speedups and
    α each sweep recorded are compared cell by cell: the geometric mean of ray / alone (goal: within 5%).
(2) thousand: 100 prompts (the built-in 30 and variants) × (baseline + ngram at k = 1..9), 4 new tokens each:
    1,000 cells through Ray, with one actor killed mid-sweep (SIGKILL of the process running a cell).
    Checked: exactly 1,000 runs recorded, one per cell. Reported: the driver's write throughput.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/ray_bench.py` puts bench/, not the repository, on the path

import duckdb  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402

from runner.engine.drafters.registry import parse_draft  # noqa: E402
from runner.engine.round.decoding_rule import Decoding  # noqa: E402
from runner.engine.weights import models  # noqa: E402
from runner.prompts import Prompt, load_prompts, select_prompts  # noqa: E402
from runner.sweep.loop import run_sweep  # noqa: E402
from runner.sweep.plan import SweepConfig  # noqa: E402
from runner.sweep.ray_cells import run_sweep_on_ray  # noqa: E402

GREEDY = Decoding("greedy", 0.0, 1.0)
console = Console(stderr=True)


def cells_span(db: Path, sweep_id: str) -> tuple[int, float]:
    """(runs, seconds from the first run's start to the last run's end) of a recorded sweep."""
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("""SELECT count(*), epoch(max(started_at + to_microseconds((wall_s * 1e6)::BIGINT)))
            - epoch(min(started_at)) FROM runs WHERE sweep_id = ?""", [sweep_id]).fetchone()


def per_cell(db: Path, sweep_id: str) -> dict[tuple, tuple[float, float]]:
    """(prompt, draft, k) -> (measured speedup, α) of each speculative run of the sweep."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("""SELECT prompt_id, draft, k, measured_speedup, alpha FROM run_stats
            WHERE sweep_id = ? AND draft <> 'none'""", [sweep_id]).fetchall()
    return {(p, d, k): (s, a) for p, d, k, s, a in rows}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def throughput(args: argparse.Namespace, work: Path) -> list[str]:
    prompts = tuple(select_prompts(load_prompts(), None, args.prompts_per_category))
    plan = SweepConfig(target=args.target, drafts=(parse_draft("ngram"),), ks=(2, 4), decodings=(GREEDY,),
                       prompts=prompts, max_new_tokens=args.max_new_tokens, seed=0, db=work / "throughput.duckdb",
                       device="cpu", dtype=None)
    torch.set_num_threads(1)  # the process alone: one thread, as each actor has
    lines, alone, ray = [], [], []
    for repeat in range(args.repeats):
        began = time.monotonic()
        sweep_id, _ = run_sweep(plan, console)
        runs, span = cells_span(plan.db, sweep_id)
        alone.append((sweep_id, runs, span, time.monotonic() - began - span))
        began = time.monotonic()
        sweep_id, _, tally = run_sweep_on_ray(plan, console, "local", args.workers)
        runs, span = cells_span(plan.db, sweep_id)
        ray.append((sweep_id, runs, span, tally.connect_s, tally.first_ready_s, time.monotonic() - began))
        lines.append(f"| {repeat + 1} | {60 * alone[-1][1] / alone[-1][2]:.1f} | {60 * runs / span:.1f} | "
                     f"{(runs / span) / (alone[-1][1] / alone[-1][2]):.2f}x | {alone[-1][3]:.1f} s | "
                     f"{tally.connect_s:.1f} s + {tally.first_ready_s:.1f} s |")
    ratios, alphas_equal, cells = [], 0, 0
    for (one, *_), (many, *_) in zip(alone, ray, strict=True):
        a, b = per_cell(plan.db, one), per_cell(plan.db, many)
        for key in a.keys() & b.keys():
            cells += 1
            ratios.append(b[key][0] / a[key][0])
            alphas_equal += a[key][1] == b[key][1] or (a[key][1] is None and b[key][1] is None)
    header = [f"### Throughput: {len(prompts) * 3} cells ({len(prompts)} prompts × baseline + ngram k=2,4, "
              f"{args.max_new_tokens} new tokens, {args.target}), 1 process × 1 thread vs {args.workers} Ray actors "
              "× 1 thread", "",
              "| repeat | runs/min alone | runs/min Ray | Ray / alone | start-up alone (load) | start-up Ray "
              "(ray.init + actors loaded) |", "|---|---|---|---|---|---|"]
    return header + lines + [
        "", f"Measurement truth: geometric mean of per-cell speedup ratios (Ray / alone) over {cells} cells: "
            f"**{geomean(ratios):.3f}** (min {min(ratios):.3f}, max {max(ratios):.3f}; goal within 5%); "
            f"α identical in {alphas_equal} of {cells} cells."]


def variants(count: int) -> tuple[Prompt, ...]:
    builtin = load_prompts()
    out = list(builtin)
    for n in range(count - len(builtin)):
        p = builtin[n % len(builtin)]
        out.append(Prompt(f"{p.id}-v{n // len(builtin) + 2}", p.category, f"{p.text}\n\nKeep it short."
                          + " Please." * (n // len(builtin))))
    return tuple(out)


def kill_one_running_actor(after_s: float, killed: list[int]) -> None:
    """SIGKILL the first actor process seen running a cell once `after_s` have passed since one was first seen."""
    first_seen = None
    while not killed:
        running = [p for p in psutil.Process().children(recursive=True)
                   if p.cmdline()[:1] == ["ray::CellWorker.run"]]
        if running and first_seen is None:
            first_seen = time.monotonic()
        if running and time.monotonic() - first_seen >= after_s:
            os.kill(running[0].pid, signal.SIGKILL)
            killed.append(running[0].pid)
        time.sleep(0.05)


def thousand(args: argparse.Namespace, work: Path) -> list[str]:
    plan = SweepConfig(target=args.target, drafts=(parse_draft("ngram"),), ks=tuple(range(1, 10)), decodings=(GREEDY,),
                       prompts=variants(100), max_new_tokens=4, seed=0, db=work / "thousand.duckdb", device="cpu",
                       dtype=None)
    killed: list[int] = []
    killer = threading.Thread(target=kill_one_running_actor, args=(args.kill_after_s, killed), daemon=True)
    killer.start()
    began = time.monotonic()
    sweep_id, recorder, tally = run_sweep_on_ray(plan, console, "local", args.workers)
    total = time.monotonic() - began
    with duckdb.connect(str(plan.db), read_only=True) as con:
        runs, cells, ok = con.execute("""SELECT count(*), count(DISTINCT (prompt_id, draft, k)),
            count(*) FILTER (status = 'ok') FROM runs WHERE sweep_id = ?""", [sweep_id]).fetchone()
    written, span = cells_span(plan.db, sweep_id)
    return [
        f"### 1,000 cells through Ray ({args.workers} actors, {args.target}, ngram k=1..9, 4 new tokens)", "",
        f"- recorded: {runs} runs, {cells} distinct cells, {ok} ok (plan: 1000); actors killed: {len(killed)}, "
        f"actors lost: {tally.deaths}, cells handed out again: {tally.reruns}, given up: {len(tally.given_up)}",
        f"- per actor: {dict(tally.done)}",
        f"- driver writes: {written} runs in {recorder.write_s:.1f} s of writing = **{written / recorder.write_s:.0f} "
        f"runs/s** ({1000 * recorder.write_s / written:.1f} ms per run, one transaction each)",
        f"- cells: {60 * written / span:.0f} runs/min over the cells; {total:.0f} s in all, of which ray.init "
        f"{tally.connect_s:.1f} s and the first actor ready {tally.first_ready_s:.1f} s later",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["throughput", "thousand", "both"], default="both")
    parser.add_argument("--target", default=models.DEFAULT_MODEL)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prompts-per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--kill-after-s", type=float, default=20.0, help="part 2: kill an actor this long in")
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="specdash-ray-bench-") as scratch:
        lines = []
        if args.part in ("throughput", "both"):
            lines += throughput(args, Path(scratch)) + [""]
        if args.part in ("thousand", "both"):
            lines += thousand(args, Path(scratch)) + [""]
    lines.append(f"Load average (1/5/15 min) before: {' / '.join(f'{v:.2f}' for v in load_before)}; after: "
                 f"{' / '.join(f'{v:.2f}' for v in os.getloadavg())}; {os.cpu_count()} cores. "
                 f"`{' '.join(['python', *sys.argv])}`")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
