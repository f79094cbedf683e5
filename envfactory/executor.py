"""Where a batch's units run: threads in this process (`local`) or workers on a Ray cluster (`ray`).

Every batch command (`envfactory synth`, `envfactory eval`) hands its units to an `Executor` and gets
their results back as they finish; the driver — the calling process — stays the only writer of the
output files, appending and fsync-ing each result (so resuming after a killed driver works the same
with either executor). A runner is a picklable callable (`runner(job) -> result`) whose heavy parts
(the environment pool, the tool graph, model clients, a checkpointer) are built lazily in the process
that first uses them: locally that is this process, shared by the threads; on Ray each worker (a
long-lived actor) unpickles its own copy once and keeps it for all its units.

Ray workers are actors restarted when their process dies (`retries` times), and a unit in flight on a
dead worker is retried on its restarted self: a killed worker costs a retry of its units and nothing
else. A unit whose retries are spent comes back as `WorkerLost`, which the caller records as a failure
with that reason. Seeds come from the units themselves (`Unit.seed`), never from where they ran, so a
Ray run and a local run of the same plan give the same records.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, cast

from pydantic import BaseModel, Field

from envfactory.errors import ConfigError

J = TypeVar("J")
R = TypeVar("R")
T = TypeVar("T")
Runner = Callable[[J], R]


class Shipped:
    """A runner that travels to other processes (Ray workers) as its constructor's arguments only: `shipped`
    names them, and unpickling calls the constructor with them. Whatever else it holds — a pool, a reward, a
    checkpointer — each process builds itself through `once`, on first use (what the constructor was given
    is used as it is)."""

    shipped: ClassVar[tuple[str, ...]] = ()

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.shipped}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, **state)

    def once(self, name: str, build: Callable[[], T]) -> T:
        """This process's `name` (an attribute), built by `build` the first time it is None or missing; threads
        wait for one build (re-entrant: a build may ask for another part)."""
        lock: threading.RLock = self.__dict__.setdefault("_once_lock", threading.RLock())
        with lock:
            value = self.__dict__.get(name)
            if value is None:
                value = build()
                setattr(self, name, value)
            return cast(T, value)


class ExecutorError(ConfigError):
    """The executor cannot start (Ray missing, a cluster address that cannot be reached)."""


class WorkerLost(Generic[J]):
    """A unit whose worker died more often than the retries allow (or whose result could not come back)."""

    def __init__(self, job: J, reason: str) -> None:
        self.job = job
        self.reason = reason

    def __repr__(self) -> str:
        return f"WorkerLost({self.reason!r})"


class ExecutorSettings(BaseModel):
    """`--executor local|ray`, `--ray-address`, and how many workers."""

    kind: Literal["local", "ray"] = "local"
    concurrency: int = Field(default=2, ge=1, description="local: threads")
    in_flight: int = Field(default=4, ge=1, description="ray: tasks queued per worker (hides the round trip)")
    batch: int = Field(
        default=16,
        ge=1,
        description="ray: most units in one task (a task costs milliseconds of scheduling; smaller batches when "
        "there are too few units to keep every worker's queue full)",
    )
    address: str | None = Field(
        default=None, description="ray: none starts a local instance; 'auto' (this node's cluster) or 'ray://host:port'"
    )
    workers: int | None = Field(default=None, ge=1, description="ray: worker actors (default: the cluster's CPUs)")
    retries: int = Field(default=3, ge=0, description="ray: restarts of a dead worker, retries of its units")
    num_cpus: int | None = Field(default=None, ge=1, description="ray, local instance only: the CPUs it may use")
    unit_timeout: float | None = Field(
        default=None,
        gt=0,
        description="ray: seconds a unit may run before its worker is killed and the unit comes back lost, not "
        "retried (a task then carries one unit; none: no limit)",
    )


class Executor(Protocol):
    """Runs `runner` on every job, yielding (job, result or the exception it raised or WorkerLost) as they finish."""

    name: str

    def map(self, runner: Runner[J, R], jobs: Sequence[J]) -> Iterator[tuple[J, R | BaseException | WorkerLost[J]]]: ...


class LocalExecutor:
    """Threads in this process sharing one runner (the runners are thread-safe)."""

    name = "local"

    def __init__(self, concurrency: int = 2) -> None:
        self.concurrency = concurrency

    def map(self, runner: Runner[J, R], jobs: Sequence[J]) -> Iterator[tuple[J, R | BaseException | WorkerLost[J]]]:
        def safe(job: J) -> R | BaseException:
            try:
                return runner(job)
            except Exception as e:  # a batch records a failure and goes on
                return e

        ex = ThreadPoolExecutor(max_workers=self.concurrency)
        try:
            futures = {ex.submit(safe, job): job for job in jobs}
            for f in as_completed(futures):
                yield futures[f], f.result()
        finally:  # stopped early (Ctrl-C, a run that gives up): the queued units never start, the running finish
            ex.shutdown(wait=True, cancel_futures=True)  # (the pool's own exit ran every queued unit: a minute)


class ProcessExecutor:
    """Processes on this machine, for CPU-bound units (threads share one interpreter lock): each worker
    process unpickles the runner once (`Shipped`) and keeps it for all its units.

    One unit per worker is in flight at a time. A worker that dies (killed, out of memory) takes the whole
    process pool down with it: the units in flight then are suspects, run again one at a time in a fresh
    pool, so the one that kills its worker is found and charged (`retries` more tries alone, then it comes
    back as `WorkerLost`) while the others finish — one bad unit costs itself, not the batch. A unit still
    running `unit_timeout` seconds after it started is stopped the same way (its worker killed) and comes back
    as `WorkerLost` at once, not retried: a hostile spec whose regular expression backtracked for ever held a
    worker, and the batch, for ever."""

    name = "processes"

    def __init__(self, processes: int = 2, retries: int = 2, unit_timeout: float | None = None) -> None:
        self.processes = max(1, processes)
        self.retries = max(0, retries)
        self.unit_timeout = unit_timeout if unit_timeout is None or unit_timeout > 0 else None

    def map(self, runner: Runner[J, R], jobs: Sequence[J]) -> Iterator[tuple[J, R | BaseException | WorkerLost[J]]]:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        context = multiprocessing.get_context("forkserver")  # no fork of a process holding threads
        todo = list(reversed(range(len(jobs))))
        suspects: list[int] = []  # in flight when a pool died with several units in it: run alone next
        deaths = [0] * len(jobs)
        overdue: set[int] = set()  # stopped for running past `unit_timeout`
        limit = self.unit_timeout
        while todo or suspects:
            broken: BaseException | None = None
            with ProcessPoolExecutor(self.processes, mp_context=context, initializer=_hold, initargs=(runner,)) as ex:
                pending: dict[Future[Any], int] = {}
                started: dict[Future[Any], float] = {}  # (one unit a worker at a time: submitted is started)
                try:
                    while (todo or suspects or pending) and broken is None:
                        if suspects:
                            if not pending:
                                i = suspects.pop()
                                pending[ex.submit(_run_held, jobs[i])] = i
                        else:
                            while todo and len(pending) < self.processes:
                                i = todo.pop()
                                pending[ex.submit(_run_held, jobs[i])] = i
                        now = time.monotonic()
                        for f in pending:
                            started.setdefault(f, now)
                        left = None if limit is None else max(0.0, min(started[f] for f in pending) + limit - now)
                        done, _ = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
                        if not done and limit is not None:  # a unit ran past its time: its worker is killed
                            late = [i for f, i in pending.items() if time.monotonic() - started[f] >= limit]
                            if late and _kill_workers(ex):  # the pool breaks: every unit in flight comes back below
                                overdue.update(late)
                            elif late:  # no worker to kill (the pool's private map is gone): no limit, no busy wait
                                limit = None
                            continue
                        for f in done:
                            try:
                                result = f.result()
                            except BrokenProcessPool as e:
                                broken = e
                                continue  # stays pending: settled below, with the others in flight
                            except Exception as e:  # a batch records a failure and goes on
                                result = e
                            started.pop(f, None)
                            yield jobs[pending.pop(f)], result
                except BaseException:  # Ctrl-C, or the consumer stopped: the workers are killed, not waited for
                    _kill_workers(ex)  # (the pool's exit waited for the units in flight: a regular expression
                    raise  # backtracking in one, deaf to signals, hung `corpus compile` on Ctrl-C)
                if broken is not None:
                    died = []
                    for f, i in pending.items():
                        if f.done() and not f.cancelled() and f.exception() is None:
                            yield jobs[i], f.result()  # it finished before the pool went
                        elif i in overdue:
                            yield jobs[i], WorkerLost(jobs[i], f"it ran longer than {limit:g} s and was stopped")
                        else:
                            died.append(i)
                    if any(i in overdue for i in pending.values()):
                        todo.extend(died)  # killed for another unit's time: innocent, run again as before
                    elif len(died) == 1:  # alone in flight: it is the one
                        i = died[0]
                        deaths[i] += 1
                        if deaths[i] > self.retries:
                            why = f"its worker process died {deaths[i]} times (last: {broken})"
                            yield jobs[i], WorkerLost(jobs[i], why)
                        else:
                            suspects.append(i)
                    else:
                        suspects.extend(died)
                    ex.shutdown(wait=True, cancel_futures=True)


def _kill_workers(ex: Any) -> bool:
    """Kill a process pool's workers (its private map of them, the same since 3.8): the pool breaks at once. False
    when there was none to kill."""
    processes = list(dict(getattr(ex, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.kill()
    return bool(processes)


_HELD: list[Any] = []  # a process worker's runner


def _hold(runner: Any) -> None:
    _HELD[:] = [runner]


def _run_held(job: Any) -> Any:
    return _HELD[0](job)


def _portable(e: Exception) -> Exception:
    """`e` where it survives the pickling that takes it to the driver, else a `RuntimeError` with its type and message:
    a unit's exception that could not be pickled (one holding a lock) or rebuilt (a required keyword-only argument,
    as a client library's errors have) failed every unit of its task."""
    dumps: Callable[[Any], bytes] = pickle.dumps
    with contextlib.suppress(ImportError):  # as Ray ships it: cloudpickle (a class defined in a function travels)
        from ray import cloudpickle

        dumps = cloudpickle.dumps
    try:
        pickle.loads(dumps(e))
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")
    return e


class _Worker:
    """The actor body: one runner per worker process, built on arrival and kept."""

    def __init__(self, runner: Callable[[Any], Any]) -> None:
        self.runner = runner

    def pid(self) -> int:
        return os.getpid()

    def run(self, job: Any) -> Any:
        try:
            return self.runner(job)
        except Exception as e:  # returned, not raised: a unit's own failure is not a worker failure to retry
            return _portable(e)
        except SystemExit as e:  # the unit's, not the worker's: it would die, be retried, and die again
            return RuntimeError(f"the unit exited the interpreter (SystemExit: {e.code})")

    def run_many(self, jobs: list[Any]) -> list[Any]:
        """Several units in one task: Ray's per-task cost (milliseconds) paid once for all of them."""
        return [self.run(job) for job in jobs]


_IN_ORDER_S = 60.0  # how long the driver waits for a dead worker's first task to answer before it takes a later one


class RayExecutor:
    """Long-lived Ray actors, `in_flight` tasks queued on each, a task holding up to `batch` units (sized so that
    every queue stays full to the end); results come back to the driver as each task finishes."""

    name = "ray"

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.actors: list[Any] = []

    def start(self) -> None:
        try:
            import ray
        except ImportError:
            raise ExecutorError("--executor ray needs Ray: pip install 'envfactory[ray]'") from None
        address = self.settings.address
        if address and address != "auto":
            _reachable(address)
        if ray.is_initialized():
            return
        try:
            ray.init(
                address=address,
                num_cpus=self.settings.num_cpus if address is None else None,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = address or "a new local instance"
            raise ExecutorError(f"cannot start Ray on {where}: {str(e).splitlines()[0]}") from None

    def workers(self) -> int:
        import ray

        if self.settings.workers:
            return self.settings.workers
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def worker_pids(self) -> list[int]:
        import ray

        return [int(p) for p in ray.get([a.pid.remote() for a in self.actors])]

    def map(self, runner: Runner[J, R], jobs: Sequence[J]) -> Iterator[tuple[J, R | BaseException | WorkerLost[J]]]:
        import ray
        from ray.exceptions import RayActorError, RayError, RayTaskError

        self.start()
        retries = self.settings.retries
        limit = self.settings.unit_timeout
        remote = ray.remote(num_cpus=1, max_restarts=retries, max_task_retries=retries)(_Worker)
        n = min(self.workers(), max(1, len(jobs)))
        todo = list(reversed(jobs))
        pending: dict[Any, tuple[int, list[J]]] = {}
        # per worker: its tasks in the order it runs them (one at a time, as submitted); whether it is up (its `pid`
        # call, sent first, answered); since when it runs the first of them: a unit's clock starts when it does, not
        # while its worker starts (a process, the runner unpickled) or waits for a CPU
        queues: list[deque[Any]] = [deque() for _ in range(n)]
        up = [False] * n
        began = [0.0] * n
        ready: dict[Any, int] = {}
        queued = n * self.settings.in_flight  # tasks waiting or running at once
        most = 1 if limit is not None else self.settings.batch  # a time limit is a unit's: one a task
        # suspects: the units of the task a worker was running when it died. A worker that dies may take the answer of
        # the task before it with it (its reply not yet sent), so a death does not say which unit killed it: each runs
        # alone on a worker with nothing else queued, and one that kills its worker there is the one
        alone: list[J] = []
        solo: set[int] = set()  # workers running a suspect: nothing more is queued on them until it answers
        retired: set[int] = set()  # workers given up before they were placed (more workers than the cluster's CPUs)

        def submit(index: int) -> None:
            if index in solo or index in retired:
                return
            if alone:
                if queues[index]:
                    return
                batch = [alone.pop()]
                solo.add(index)
            elif todo:
                size = max(1, min(most, len(todo) // queued))  # every queue kept full to the end
                batch = [todo.pop() for _ in range(min(size, len(todo)))]
            else:
                return
            ref = self.actors[index].run_many.remote(batch)
            pending[ref] = (index, batch)
            if not queues[index]:
                began[index] = time.monotonic()
            queues[index].append(ref)

        def hire(index: int) -> None:
            actor: Any = remote.remote(runner)  # each worker unpickles its own copy
            if index < len(self.actors):
                self.actors[index] = actor
            else:
                self.actors.append(actor)
            up[index] = False
            ready[actor.pid.remote()] = index
            for _ in range(self.settings.in_flight):
                submit(index)

        def replace(index: int, why: str, *, certain: bool) -> Iterator[tuple[J, WorkerLost[J]]]:
            """Worker `index` is stopped (past its time) or dead (beyond its restarts): the tasks queued behind the one
            it was running go back to be run and a fresh worker takes its place (a dead one would fail every task sent
            to it; a restarted one would run the unit that never returns again). The units of the task it was running
            come back lost where that is `certain` (it ran past its time) or they ran alone; else they run alone."""
            with contextlib.suppress(RayError, ValueError):
                ray.kill(self.actors[index], no_restart=True)
            queue = queues[index]
            late = pending.pop(queue.popleft())[1] if queue else []
            for ref in queue:  # queued behind it: innocent
                todo.extend(reversed(pending.pop(ref)[1]))
            queue.clear()
            for ref in [r for r, i in ready.items() if i == index]:
                del ready[ref]
            if not certain and index not in solo:  # which unit killed it is not known: each runs alone
                alone.extend(reversed(late))
                late = []
            solo.discard(index)
            hire(index)
            for job in late:
                yield job, WorkerLost(job, why)

        def rebalance() -> None:
            """With nothing left to hand out and a worker idle, a worker that was never placed (more workers than the
            cluster has CPUs: it waits for one for ever) is given up: its tasks go to the idle ones."""
            idle = [i for i in range(n) if up[i] and not queues[i] and i not in retired]
            if todo or alone or not idle:
                return
            for index in range(n):
                if up[index] or not queues[index] or index in retired:
                    continue
                with contextlib.suppress(RayError, ValueError):
                    ray.kill(self.actors[index], no_restart=True)
                for ref in queues[index]:
                    todo.extend(reversed(pending.pop(ref)[1]))
                queues[index].clear()
                for ref in [r for r, i in ready.items() if i == index]:
                    del ready[ref]
                retired.add(index)
            for index in idle:
                for _ in range(self.settings.in_flight):
                    submit(index)

        def timed() -> list[int]:
            return [i for i, q in enumerate(queues) if q and up[i]]

        try:
            for index in range(n):
                hire(index)
            while pending or alone or todo:
                if not pending:  # (never left so: every put-back task is handed out at once; for safety)
                    for index in range(n):
                        submit(index)
                left = None
                if limit is not None and timed():
                    left = max(0.0, min(began[i] for i in timed()) + limit - time.monotonic())
                done, _ = ray.wait([*pending, *ready], num_returns=1, timeout=left)
                if not done:  # a unit ran past its time
                    assert limit is not None
                    for index in timed():
                        if time.monotonic() - began[index] >= limit:
                            yield from replace(index, f"it ran longer than {limit:g} s and was stopped", certain=True)
                    continue
                ref = done[0]
                if ref in ready:  # a worker is up: its first task starts now
                    index = ready.pop(ref)
                    up[index] = True
                    began[index] = time.monotonic()
                    continue
                index = pending[ref][0]
                queue = queues[index]
                if queue[0] != ref:  # a worker answers its tasks in order: a later one first means it died (each of
                    # its tasks fails) while running the first; wait for that one, so the right one is charged
                    ray.wait([queue[0]], num_returns=1, timeout=_IN_ORDER_S)
                    if ray.wait([queue[0]], num_returns=1, timeout=0)[0]:
                        ref = queue[0]
                batch = pending[ref][1]
                results: list[Any]
                try:
                    results = ray.get(ref)
                except RayTaskError as e:  # raised inside the runner's process, not returned
                    results = [e.as_instanceof_cause()] * len(batch)
                except RayActorError as e:  # the worker died more often than `retries`: the task it ran is charged
                    if queue[0] == ref:
                        yield from replace(index, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}", certain=False)
                        continue
                    why = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"  # (its first never answered)
                    results = [WorkerLost(job, why) for job in batch]
                except RayError as e:
                    why = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    results = [WorkerLost(job, why) for job in batch]
                del pending[ref]
                if queue[0] == ref:  # the next one starts now
                    queue.popleft()
                    began[index] = time.monotonic()
                else:
                    queue.remove(ref)
                solo.discard(index)
                submit(index)
                rebalance()
                yield from zip(batch, results, strict=True)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []


def _reachable(address: str) -> None:
    """Fail in seconds, with one line, when nothing listens at a cluster address (Ray itself retries for ~a minute)."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ExecutorError(f"--ray-address {address!r}: expected 'auto', 'host:port' or 'ray://host:port'")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as e:
        raise ExecutorError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None
    if not address.startswith("ray://"):
        why = _not_a_gcs(host, int(port))
        if why is not None:
            raise ExecutorError(f"--ray-address {address}: {why}")


_GCS_PROBE = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # the first call `ray.init` makes of a head's GCS


def _not_a_gcs(host: str, port: int, timeout_s: float = 5.0) -> str | None:
    """Why what listens at host:port is not a Ray head's GCS (None: it is, or grpc is not there to ask). `ray.init`
    given another server's port (the dashboard's, the client server's without ray://) waited for ever, past SIGTERM."""
    try:
        import grpc
    except ImportError:
        return None
    target = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    # opened as Ray opens its own: no HTTP proxy (unless RAY_grpc_enable_http_proxy), TLS where RAY_USE_TLS says,
    # its token where token auth is on
    options = [] if os.environ.get("RAY_grpc_enable_http_proxy") == "1" else [("grpc.enable_http_proxy", 0)]  # noqa: SIM112 - Ray's own name
    try:
        from ray._private.grpc_utils import init_grpc_channel

        channel = init_grpc_channel(target, options)
    except ImportError:  # (a Ray that moved it: a plain channel, which a TLS head refuses)
        channel = grpc.insecure_channel(target, options)
    try:
        channel.unary_unary(_GCS_PROBE)(b"", timeout=timeout_s)
    except grpc.RpcError as e:
        code = e.code() if callable(getattr(e, "code", None)) else None
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return None  # a GCS that wants a token: ray.init has it
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return (
                "a gRPC server that is not a Ray head's GCS answers there (the Ray client's port? give ray://HOST:PORT)"
            )
        return (
            "no Ray head's GCS answers there (the dashboard, or another server?): give the head's GCS address "
            "(port 6379 by default) or ray://HOST:10001 for its client server"
        )
    finally:
        channel.close()
    return None


def make_executor(settings: ExecutorSettings) -> Executor:
    if settings.kind == "ray":
        executor = RayExecutor(settings)
        executor.start()
        return executor
    return LocalExecutor(settings.concurrency)


def check_executor_flags(kind: str, address: str | None, workers: int | None) -> None:
    """The command-line flags' mistakes (`ExecutorError`), for a command to find before it starts any work."""
    if kind not in ("local", "ray"):
        raise ExecutorError(f"--executor is local or ray, not '{kind}'")
    if kind == "local" and (address or workers):
        given = [name for name, value in (("--ray-address", address), ("--workers", workers)) if value]
        raise ExecutorError(f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} --executor ray")


def executor_from(kind: str, address: str | None, workers: int | None, concurrency: int) -> Executor:
    """The command-line flags (`--executor`, `--ray-address`, `--workers`, `--concurrency`) as an executor."""
    check_executor_flags(kind, address, workers)
    return make_executor(
        ExecutorSettings(
            kind="ray" if kind == "ray" else "local", concurrency=concurrency, address=address, workers=workers
        )
    )
