"""A sweep's cells on Ray actors, one per device; the driver stays the only writer of the database.

Each actor (`CellWorker`) loads its engine (the target and its drafts) once, like a local sweep, and runs the cells
it is handed with the local sweep's `CellRunner`. `RaySource` is the sweep's source of results: the driver records them
in the sweep's one loop (`loop.py`): one transaction per run, the same lock handling, the same `--resume` (stale
baselines re-run), the same stop on a device error. A cell whose actor dies is handed to another actor, and a new
actor is started in the dead one's place.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError
from rich.console import Console

from runner.cells import Cell
from runner.records import Divergence
from runner.sweep.local import Identity, Result, load_engine
from runner.sweep.loop import run_sweep
from runner.sweep.plan import SweepConfig
from runner.sweep.recorder import Recorder

IN_FLIGHT = 2  # cells queued on an actor at once, so it never waits for the driver between two cells
MAX_ATTEMPTS = 3  # a cell that was running when its actor died this often is left to --resume: it may be the cause
PLACEMENT_NOTE_S = 60.0  # after this long with no actor loaded, say what Ray is waiting for
ROOT = Path(__file__).resolve().parents[2]  # actors on this machine import specdash from here


@ray.remote(max_restarts=0)  # the driver itself replaces a dead actor and hands its cells to the others
class CellWorker:
    """One device's share of a sweep: the engine loaded once, then cells in, results out."""

    def __init__(self, config: SweepConfig, sweep_id: str, threads: int | None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.problem: ValueError | None = None
        try:
            self.runner = load_engine(config, sweep_id)
        except ValueError as error:  # bad input (a model, a prompt too long): `ready` hands it to the driver
            self.problem = error

    def ready(self) -> str:
        """The actor's name in progress and reports: host/pid."""
        if self.problem:
            raise self.problem
        return f"{socket.gethostname()}/{os.getpid()}"

    def identity(self) -> Identity:
        return self.runner.identity()

    def run(self, cell: Cell) -> Result:
        return self.runner.run(cell)

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...], ours: tuple[int, ...]) -> Divergence | None:
        return self.runner.engine.classify(prompt, baseline, ours)


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

    done: Counter = field(default_factory=Counter)  # cells run, per actor name
    reruns: int = 0  # cells handed out again after their actor died
    deaths: int = 0  # actors lost
    given_up: list[str] = field(default_factory=list)  # cells left to --resume after MAX_ATTEMPTS deaths
    connect_s: float = 0.0  # joining (or starting) Ray
    first_ready_s: float = 0.0  # from asking for the actors to the first one loaded and warmed up


class RaySource:
    """A sweep's cells on Ray actors: hands out cells, at most IN_FLIGHT per actor, and takes back results or the
    news of an actor's death. Connects to Ray and starts the actors when made; `close` stops them."""

    def __init__(self, config: SweepConfig, sweep_id: str, address: str, workers: int | None,
                 console: Console) -> None:
        began, self.console, self.tally = time.monotonic(), console, Tally()
        self.connected = connect(address)
        self.tally.connect_s = time.monotonic() - began
        self.args, self.asked = (config, sweep_id), time.monotonic()
        self.actors: list[ray.actor.ActorHandle] = []  # every actor started, to stop them all at the end
        self.starting: dict[ray.ObjectRef, ray.actor.ActorHandle] = {}
        self.names: dict[ray.actor.ActorHandle, str] = {}  # every actor that loaded, dead ones too
        self.ready: set[ray.actor.ActorHandle] = set()  # the live ones, which take cells
        self.flight: dict[ray.ObjectRef, tuple[ray.actor.ActorHandle, int]] = {}  # in the order handed out
        self.cells: list[Cell] = []
        self.queue: deque[int] = deque()
        self.attempts: Counter = Counter()
        try:
            count, self.options, self.threads = placement(config, workers)
            self.load_deaths_left = MAX_ATTEMPTS * count  # actors that die while loading are replaced this often
            for _ in range(count):
                self.start_actor()
        except BaseException:
            self.close()
            raise

    def start_actor(self) -> None:
        actor = CellWorker.options(**self.options).remote(*self.args, self.threads)
        self.actors.append(actor)
        self.starting[actor.ready.remote()] = actor

    def identity(self) -> Identity:
        """Asked of the first actor to load (bad input on the actors surfaces here)."""
        while not self.ready:
            if not self.starting:
                raise RuntimeError("no Ray actor is left to run the sweep's cells")
            done, _ = ray.wait(list(self.starting), num_returns=1, timeout=PLACEMENT_NOTE_S)
            if done:
                self.on_ready(done[0])
            else:
                self.note_waiting()
        return self.ask("identity")

    def results(self, cells: list[Cell]) -> Iterator[Result]:
        """Each cell once, as it finishes; one whose actor died too often comes back with no record."""
        self.cells, self.queue = cells, deque(range(len(cells)))
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
                result = ray.get(ref)
            except RayActorError:
                yield from self.on_death(actor, index, running)
                continue
            name = self.names[actor]
            self.tally.done[name] += 1
            yield replace(result, worker=name, record=replace(result.record, concurrent_workers=self.on_host(name)))

    def note_waiting(self) -> None:
        if not self.ready:  # an actor Ray cannot place waits silently; a cluster too small would hang unexplained
            self.console.print(f"ray: no actor loaded after {PLACEMENT_NOTE_S:g} s; each asks for {self.options}, "
                               f"the cluster has {ray.available_resources()} free", highlight=False, markup=False)

    def on_host(self, name: str) -> int:
        """The live actors on the host of actor `name`, itself included."""
        host = name.rpartition("/")[0]
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

    def on_death(self, actor: ray.actor.ActorHandle, index: int, running: bool) -> Iterator[Result]:
        if actor in self.ready:  # the first of its cells to come back: replace the actor once
            self.ready.remove(actor)
            self.tally.deaths += 1
            self.start_actor()
        self.attempts[index] += running  # a cell still waiting in the dead actor's queue is not to blame
        cell = self.cells[index]
        if self.attempts[index] >= MAX_ATTEMPTS:
            self.tally.given_up.append(cell.label)
            yield Result(cell, None, self.names[actor])
        else:
            self.queue.appendleft(index)
            self.tally.reruns += 1

    def ask(self, method: str, *args: object) -> object:
        """A live actor's answer (the driver has no model), from the next one if that one dies meanwhile."""
        for actor in list(self.ready):
            try:
                return ray.get(getattr(actor, method).remote(*args))
            except RayActorError:
                continue
        raise RuntimeError("no Ray actor is left to run the sweep's cells")

    def classify(self, prompt: tuple[int, ...], baseline: tuple[int, ...], ours: tuple[int, ...]) -> Divergence | None:
        """A greedy mismatch judged on a live actor's target, as the local sweep judges it."""
        return self.ask("classify", prompt, baseline, ours)

    def close(self) -> None:
        for actor in self.actors:  # dead ones too: killing those is a no-op
            ray.kill(actor)
        if self.connected:
            ray.shutdown()
        if self.tally.done or self.tally.deaths:
            report(self.tally, self.console)


def run_sweep_on_ray(config: SweepConfig, console: Console, address: str = "auto",
                     workers: int | None = None) -> tuple[str, Recorder, Tally]:
    """The local sweep's plan, loop and records, with the cells run by Ray actors. Returns the sweep id, the
    recorder and what the actors did."""
    sources: list[RaySource] = []

    def open_source(config: SweepConfig, sweep_id: str) -> RaySource:
        sources.append(RaySource(config, sweep_id, address, workers, console))
        return sources[-1]

    sweep_id, recorder = run_sweep(config, console, open_source)
    return sweep_id, recorder, sources[0].tally if sources else Tally()


def report(tally: Tally, console: Console) -> None:
    done = ", ".join(f"{count} on {name}" for name, count in sorted(tally.done.items()))
    line = f"ray: {sum(tally.done.values())} cells recorded: {done}"
    if tally.deaths:
        line += f"; {tally.deaths} actor(s) died, {tally.reruns} cell(s) handed out again"
    console.print(line, highlight=False, markup=False)
    if tally.given_up:
        console.print(f"ray: {len(tally.given_up)} cell(s) killed their actor {MAX_ATTEMPTS} times and were left "
                      f"for --resume: " + "; ".join(tally.given_up), highlight=False, markup=False)
