"""A sweep's cells on Ray actors, one per device; the driver stays the only writer of the database.

Each actor (`CellWorker`) loads the target and its drafts once, like a local sweep, and runs the cells it is
handed into `RunRecord`s. The driver writes them through the local sweep's `Recorder`: one transaction per
run, the same lock handling, the same `--resume`. A cell whose actor dies is handed to another actor, and a
new actor is started in the dead one's place.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from runner.records import Divergence, RunRecord
from runner.store.runs import flush_pending
from runner.sweep.progress import DONE, INTERRUPTED, RECORDING
from runner.sweep.run import Cell, Classify, Recorder, SweepConfig, cells_to_run, label, load_pair, standing

IN_FLIGHT = 2  # cells queued on an actor at once, so it never waits for the driver between two cells
MAX_ATTEMPTS = 3  # a cell that was running when its actor died this often is left to --resume: it may be the cause
PLACEMENT_NOTE_S = 60.0  # after this long with no actor loaded, say what Ray is waiting for
ROOT = Path(__file__).resolve().parents[2]  # actors on this machine import specdash from here


@ray.remote(max_restarts=0)  # the driver itself replaces a dead actor and hands its cells to the others
class CellWorker:
    """One device's share of a sweep: the pair loaded once, then cells in, records out."""

    def __init__(self, config: SweepConfig, sweep_id: str, threads: int | None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.problem: ValueError | None = None
        try:
            self.runner = load_pair(config, sweep_id)
        except ValueError as error:  # bad input (a model, a prompt too long): `ready` hands it to the driver
            self.problem = error

    def ready(self) -> str:
        """The actor's name in progress and reports: host/pid."""
        if self.problem:
            raise self.problem
        return f"{socket.gethostname()}/{os.getpid()}"

    def run(self, cell: Cell) -> RunRecord:
        return self.runner.run(cell)

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...], ours: tuple[int, ...]) -> Divergence | None:
        return self.runner.classify(prompt, baseline, ours)


def connect(address: str) -> bool:
    """Join a Ray cluster: 'auto' (the one this machine is in), 'local' (a new one here) or host:port.
    True when this call connected, so the sweep disconnects at its end."""
    if ray.is_initialized():  # the caller (a notebook, a test) is connected already
        return False
    local = {"include_dashboard": False} if address == "local" else {}
    ray.init(address=address, job_config=ray.job_config.JobConfig(code_search_path=[str(ROOT)]),
             log_to_driver=False, logging_level="WARNING", **local)
    return True


def placement(config: SweepConfig, workers: int | None) -> tuple[int, dict, int | None]:
    """How many actors, the Ray resources of each and its torch threads: one GPU each where the cluster has
    GPUs; else an equal share of the cluster's cores (by default one actor per node, with all its cores)."""
    resources = ray.cluster_resources()
    if config.device != "cpu" and resources.get("GPU", 0) >= 1:
        return workers or int(resources["GPU"]), {"num_gpus": 1, "num_cpus": 1}, None
    if config.device and config.device.startswith("cuda"):
        raise ValueError(f"--device {config.device}: the Ray cluster has no GPU")
    nodes = [node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"]]
    count = workers or len(nodes)
    share = max(1, min(int(resources.get("CPU", 1)) // count, int(max(nodes))))
    return count, {"num_cpus": share}, share


@dataclass
class Tally:
    """What the actors did: the report line, and the benchmark's figures."""

    done: Counter = field(default_factory=Counter)  # cells recorded, per actor name
    reruns: int = 0  # cells handed out again after their actor died
    deaths: int = 0  # actors lost
    given_up: list[str] = field(default_factory=list)  # cells left to --resume after MAX_ATTEMPTS deaths
    connect_s: float = 0.0  # joining (or starting) Ray
    first_ready_s: float = 0.0  # from asking for the actors to the first one loaded and warmed up
    write_s: float = 0.0  # the driver's time writing runs (the database's side of its throughput)


class Dispatcher:
    """Hands out cells, at most IN_FLIGHT per actor, and takes back records or the news of an actor's death."""

    def __init__(self, config: SweepConfig, sweep_id: str, workers: int | None, cells: list[Cell],
                 console: Console) -> None:
        count, self.options, self.threads = placement(config, workers)
        self.console = console
        self.args, self.cells, self.tally, self.asked = (config, sweep_id), cells, Tally(), time.monotonic()
        self.queue, self.attempts = deque(range(len(cells))), Counter()
        self.actors: list[ray.actor.ActorHandle] = []  # every actor started, to stop them all at the end
        self.starting: dict[ray.ObjectRef, ray.actor.ActorHandle] = {}
        self.names: dict[ray.actor.ActorHandle, str] = {}  # every actor that loaded, dead ones too
        self.ready: set[ray.actor.ActorHandle] = set()  # the live ones, which take cells
        self.flight: dict[ray.ObjectRef, tuple[ray.actor.ActorHandle, int]] = {}  # in the order handed out
        self.load_deaths_left = MAX_ATTEMPTS * count  # actors that die while loading are replaced this often
        for _ in range(count):
            self.start_actor()

    def start_actor(self) -> None:
        actor = CellWorker.options(**self.options).remote(*self.args, self.threads)
        self.actors.append(actor)
        self.starting[actor.ready.remote()] = actor

    def results(self) -> Iterator[tuple[Cell, RunRecord | None, str]]:
        """Each cell once, as it finishes: (cell, its record or None when given up, the actor's name)."""
        while self.queue or self.flight:
            self.hand_out()
            if not self.flight and not self.starting:
                raise RuntimeError("no Ray actor is left to run the sweep's cells")
            done, _ = ray.wait([*self.flight, *self.starting], num_returns=1, timeout=PLACEMENT_NOTE_S)
            if not done:
                self.note_waiting()
                continue
            ref = done[0]
            if ref in self.starting:
                self.on_ready(ref)
                continue
            actor, index = self.flight[ref]
            # An actor runs its cells in the order handed out: the earliest one left was running.
            running = next(r for r, (a, _) in self.flight.items() if a == actor) == ref
            del self.flight[ref]
            try:
                record = ray.get(ref)
            except RayActorError:
                yield from self.on_death(actor, index, running)
                continue
            yield self.cells[index], replace(record, concurrent_workers=self.on_host(record)), self.names[actor]

    def note_waiting(self) -> None:
        if not self.ready:  # an actor Ray cannot place waits silently; a cluster too small would hang unexplained
            self.console.print(f"ray: no actor loaded after {PLACEMENT_NOTE_S:g} s; each asks for {self.options}, "
                               f"the cluster has {ray.available_resources()} free", highlight=False, markup=False)

    def on_host(self, record: RunRecord) -> int:
        """The live actors on the record's host, its own included."""
        host = record.provenance["host"]
        return max(1, sum(self.names[a].rpartition("/")[0] == host for a in self.ready))

    def hand_out(self) -> None:
        busy = Counter(actor for actor, _ in self.flight.values())
        for actor in self.ready:
            while self.queue and busy[actor] < IN_FLIGHT:
                index = self.queue.popleft()
                self.flight[actor.run.remote(self.cells[index])] = (actor, index)
                busy[actor] += 1

    def on_ready(self, ref: ray.ObjectRef) -> None:
        actor = self.starting.pop(ref)
        try:
            self.names[actor] = ray.get(ref)
        except RayTaskError as error:  # the actor's report of bad input: the same for every actor
            raise error.cause from None
        except RayActorError as error:  # died while loading (out of memory, its node gone)
            self.tally.deaths += 1
            self.load_deaths_left -= 1
            if self.load_deaths_left < 0:
                raise RuntimeError(f"Ray actors keep dying while loading the models: {error}") from None
            self.start_actor()
            return
        self.ready.add(actor)
        if not self.tally.first_ready_s:
            self.tally.first_ready_s = time.monotonic() - self.asked

    def on_death(self, actor: ray.actor.ActorHandle, index: int, running: bool) -> Iterator[tuple[Cell, None, str]]:
        if actor in self.ready:  # the first of its cells to come back: replace the actor once
            self.ready.remove(actor)
            self.tally.deaths += 1
            self.start_actor()
        self.attempts[index] += running  # a cell still waiting in the dead actor's queue is not to blame
        cell = self.cells[index]
        if self.attempts[index] >= MAX_ATTEMPTS:
            self.tally.given_up.append(label(cell))
            yield cell, None, self.names[actor]
        else:
            self.queue.appendleft(index)
            self.tally.reruns += 1

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...], ours: tuple[int, ...]) -> Divergence | None:
        """A greedy mismatch judged on a live actor's target, as the local sweep judges it (the driver has no model)."""
        for actor in list(self.ready):
            try:
                return ray.get(actor.classify.remote(prompt, baseline, ours))
            except RayActorError:
                continue
        raise RuntimeError("no Ray actor is left to judge a lossless mismatch")

    def stop(self) -> None:
        for actor in self.actors:  # dead ones too: killing those is a no-op
            ray.kill(actor)


def group(cell: Cell) -> tuple:
    """The cell's `baseline_key`."""
    d = cell.decoding
    return cell.prompt.id, d.mode, d.temperature, d.top_p


def baseline_key(record: RunRecord) -> tuple:
    """The runs that share one baseline: same prompt and decoding (the seed is the sweep's)."""
    return record.prompt_id, record.mode, record.temperature, record.top_p


class Writer:
    """Writes records as they arrive; a speculative run waits for its baseline, which its lossless check needs."""

    def __init__(self, recorder: Recorder, cells: list[Cell], classify: Classify) -> None:
        self.recorder, self.classify = recorder, classify
        self.baselines_due = Counter(group(c) for c in cells if c.k is None)
        self.held: dict[tuple, list[RunRecord]] = defaultdict(list)

    def add(self, record: RunRecord) -> None:
        key = baseline_key(record)
        if record.k is not None and self.baselines_due[key]:
            self.held[key].append(record)
            return
        self.recorder.write(record, self.classify)
        if record.k is None:
            self.baseline_done(key)

    def baseline_done(self, key: tuple) -> None:
        self.baselines_due[key] -= 1
        for record in self.held.pop(key, []):
            self.recorder.write(record, self.classify)


def run_sweep_on_ray(config: SweepConfig, console: Console, address: str = "auto",
                     workers: int | None = None) -> tuple[str, Recorder, Tally]:
    """The local sweep's plan and records, with the cells run by Ray actors. Returns the sweep id, the
    recorder and what the actors did."""
    sweep_id, cells = cells_to_run(config)
    recorder, stand = Recorder(config, sweep_id), standing(config, sweep_id, len(cells))
    if not cells:
        return sweep_id, recorder, Tally()
    began = time.monotonic()
    connected = connect(address)
    dispatcher = None
    try:
        connect_s = time.monotonic() - began
        dispatcher = Dispatcher(config, sweep_id, workers, cells, console)
        dispatcher.tally.connect_s = connect_s
        record_all(dispatcher, Writer(recorder, cells, dispatcher.classify), console, sweep_id, stand)
    except BaseException:  # Ctrl-C: what was recorded stays, and `--resume last` finishes the rest
        if dispatcher is not None and dispatcher.tally.done:
            stand(sum(dispatcher.tally.done.values()), INTERRUPTED)
        raise
    finally:
        if dispatcher is not None:
            dispatcher.stop()
        if connected:
            ray.shutdown()
    flush_pending(config.db)
    stand(sum(dispatcher.tally.done.values()), DONE if not dispatcher.tally.given_up else INTERRUPTED)
    report(dispatcher.tally, console)
    return sweep_id, recorder, dispatcher.tally


def record_all(dispatcher: Dispatcher, writer: Writer, console: Console, sweep_id: str,
               stand: Callable[[int, str], None]) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        total = progress.add_task(f"sweep {sweep_id}", total=len(dispatcher.cells))
        per_actor: dict[str, int] = {}
        for cell, record, name in dispatcher.results():
            if record is None:
                if cell.k is None:
                    writer.baseline_done(group(cell))
            else:
                began = time.monotonic()
                writer.add(record)
                dispatcher.tally.write_s += time.monotonic() - began
                dispatcher.tally.done[name] += 1
                if name not in per_actor:
                    per_actor[name] = progress.add_task(f"  {name}", total=len(dispatcher.cells))
                progress.advance(per_actor[name])
            progress.advance(total)
            stand(sum(dispatcher.tally.done.values()), RECORDING)


def report(tally: Tally, console: Console) -> None:
    done = ", ".join(f"{count} on {name}" for name, count in sorted(tally.done.items()))
    line = f"ray: {sum(tally.done.values())} cells recorded: {done}"
    if tally.deaths:
        line += f"; {tally.deaths} actor(s) died, {tally.reruns} cell(s) handed out again"
    console.print(line, highlight=False, markup=False)
    if tally.given_up:
        console.print(f"ray: {len(tally.given_up)} cell(s) killed their actor {MAX_ATTEMPTS} times and were left "
                      f"for --resume: " + "; ".join(tally.given_up), highlight=False, markup=False)
