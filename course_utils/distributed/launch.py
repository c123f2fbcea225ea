"""Start processes from a notebook, joined into a process group: notebooks 05 (DistributedDataParallel),
09 (a job that hangs) and 11 (model parallelism on gloo processes).

Processes started with the *spawn* (or *forkserver*) method do not inherit the notebook's memory: they
unpickle the function they should run by its module and name, so that function must be importable.
A function defined in a notebook cell is not; the lesson's workers live in `course_utils.distributed.ddp_demos`.

- `launch(fn, world_size, *args)` starts ``world_size`` processes on this machine, joins them into a
  gloo (or NCCL) process group over 127.0.0.1 on a free port, runs ``fn(rank, world_size, *args)`` in
  each and returns the per-rank results, or raises `WorkerError` with the failing rank's traceback.
  ``group_timeout`` is the process group's own timeout (how long a collective waits for the others) and
  ``env`` sets environment variables in the workers before the group starts (``TORCH_DISTRIBUTED_DEBUG``);
  ``quiet`` sends their standard error (C++ log lines, with times) to /dev/null. The ranks leave together:
  none ends (closing its connections) while another still waits in a collective, so a timeout demo shows
  each rank's own timeout, not its peer's exit.
- `start_worker_pool()` starts the forkserver early, so the first launch does not wait for imports.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.reduction import ForkingPickler
from queue import Empty
from typing import Any

import torch
import torch.distributed as dist

from ..formatting import short_repr

__all__ = ["WorkerError", "free_port", "launch", "start_worker_pool"]


class WorkerError(RuntimeError):
    """A worker process failed, or did not finish in time."""


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def _context(start_method: str | None) -> Any:
    """forkserver where it exists (fast: torch is imported once, in the server), else spawn."""
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # DistributedDataParallel imports torch._dynamo (seconds): do it once, in the server.
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "course_utils.distributed.ddp_demos"])
    return ctx


def start_worker_pool(start_method: str | None = None) -> None:
    """Start the forkserver now (it imports torch once, in the background); no-op with spawn."""
    ctx = _context(start_method)
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _log_path(folder: str, fn: Callable[..., Any], rank: int, pid: int | None = None) -> str:
    """Where a quiet worker's standard error goes under ``make test`` (``COURSE_SUBPROCESS_LOGS``)."""
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"launch-{getattr(fn, '__name__', 'fn')}-{pid or os.getpid()}-rank{rank}.log")


def _entry(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple[Any, ...],
           queue: Any, timeout: float, backend: str, env: dict[str, str], quiet: bool, logs: str | None) -> None:
    """What each launched process runs: join the group, call ``fn``, send back its result."""
    if quiet:  # this process only: its errors still come back through the queue. Under `make test`
        # (``logs``: the launcher's COURSE_SUBPROCESS_LOGS; a worker's own environment is the forkserver's,
        # from when it started) the lines go to a file, for the report of a rank that dies.
        sink = _log_path(logs, fn, rank) if logs else os.devnull
        fd = os.open(sink, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    # A crash in native code (a segmentation fault in a library's thread) ends the process with no Python
    # error to send back: this prints every thread's Python stack to standard error first.
    faulthandler.enable()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        # torch.distributed reads TORCH_DISTRIBUTED_DEBUG when it is imported, and the forkserver imported
        # it before ``env`` was set: read it again, before the group starts.
        dist.set_debug_level_from_env()
        extra: dict[str, Any] = {}
        if backend == "nccl":  # one GPU per process: rank r uses cuda:r
            torch.cuda.set_device(rank)
            extra["device_id"] = torch.device("cuda", rank)
        else:
            torch.set_num_threads(1)
        # The job's store (rank 0 serves it), made here so that the ranks can also meet outside the process
        # group: after a collective fails, the group can no longer be trusted to carry a barrier.
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0,
                              timeout=timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout), **extra)
        try:
            queue.put((rank, True, _packed(fn, fn(rank, world_size, *args))))
        except BaseException:
            queue.put((rank, False, traceback.format_exc()))
        finally:
            _leave_together(store, rank, world_size, deadline=time.monotonic() + timeout)
            gc.collect()  # what ``fn`` built and still holds the group (DDP, FSDP2): freed while Python runs
            dist.destroy_process_group()
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))


def _packed(fn: Callable[..., Any], result: Any) -> bytes:
    """``result`` pickled here, in the worker, as the queue would pickle it. The queue pickles what it is given
    in a thread of its own, which prints a failure to the worker's standard error and drops the result: the
    launcher would wait for it until its timeout. Pickled here, a result that cannot be sent back is this
    rank's error, with its traceback."""
    try:
        return bytes(ForkingPickler.dumps(result))
    except Exception as exc:
        raise TypeError(f"{getattr(fn, '__name__', fn)} returned {type(result).__name__} "
                        f"{short_repr(result, 60)}, which cannot be pickled to send it back to the launching "
                        f"process ({type(exc).__name__}: {exc}). Return plain values: numbers, strings, tensors, "
                        "and lists or dicts of them.") from exc


def _leave_together(store: dist.Store, rank: int, world_size: int, deadline: float) -> None:
    """Return once every rank has finished its function (or at ``deadline``). A rank that left while another
    still waited in a collective would change that rank's error: the peer's "Connection closed by peer"
    instead of its own timeout. Rank 0 serves the store, so it leaves last: the others tell it they are
    done waiting before they go."""
    try:
        if store.add("course/finished", 1) < world_size:
            while store.add("course/finished", 0) < world_size and time.monotonic() < deadline:
                time.sleep(0.01)
        if rank == 0:
            while store.add("course/left", 0) < world_size - 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            store.add("course/left", 1)
    except (RuntimeError, dist.DistStoreError):  # rank 0 has gone already: nobody is left to wait for
        pass


def launch(fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout: float = 60.0,
           start_method: str | None = None, backend: str = "gloo", group_timeout: float | None = None,
           env: dict[str, str] | None = None, quiet: bool = False) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes joined by a process group.

    ``backend`` is ``"gloo"`` (CPU, the default) or ``"nccl"`` (rank r on ``cuda:r``).
    ``group_timeout`` (seconds, default ``timeout``) is given to ``init_process_group(timeout=...)``: a
    collective that waits longer for another rank raises. ``env`` is set in each worker's environment
    before the process group starts, e.g. ``{"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}``. ``quiet=True`` sends
    the workers' standard error to /dev/null: what torch's C++ code logs there (with a time stamp) would
    otherwise appear in a notebook cell's output, and their errors come back in `WorkerError` anyway.
    ``fn`` must be importable (defined in a module, not in a notebook cell) and its arguments and
    return value picklable. Returns the results ordered by rank. Raises `WorkerError` with the first
    failing rank's traceback, or when the processes do not finish within ``timeout`` seconds.
    """
    if getattr(fn, "__module__", "__main__") in ("__main__", "__mp_main__"):
        raise WorkerError(f"{getattr(fn, '__name__', fn)!r} is defined in the notebook (module __main__); "
                          "a new process cannot import it. Put it in a module, e.g. course_utils.")
    for attempt in range(3):
        try:
            return _launch_once(fn, world_size, args, timeout, start_method, backend,
                                group_timeout or timeout, dict(env or {}), quiet)
        except WorkerError as exc:
            # The free port found a moment ago can be taken by another program before rank 0 listens
            # on it: pick another port and start again.
            if "EADDRINUSE" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _launch_once(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...], timeout: float,
                 start_method: str | None, backend: str, group_timeout: float,
                 env: dict[str, str], quiet: bool) -> list[Any]:
    ctx = _context(start_method)
    queue = ctx.Queue()
    port = free_port()
    logs = os.environ.get("COURSE_SUBPROCESS_LOGS")
    procs = [ctx.Process(target=_entry,
                         args=(fn, r, world_size, port, args, queue, group_timeout, backend, env, quiet, logs),
                         daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    finished = False
    try:
        while len(results) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"{fn.__name__}: only ranks {sorted(results)} of {world_size} finished "
                                  f"within {timeout:.0f} s")
            try:
                rank, good, value = queue.get(timeout=min(left, 1.0))
            except Empty:  # nothing yet: check that nobody died silently
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                if dead:
                    raise WorkerError(_dead_rank(fn, procs, dead[0], logs)) from None
                continue
            if not good:
                failure = _first_failure(fn.__name__, {rank: value}, queue)
                raise WorkerError(_crash_first(fn, procs, set(results) | {rank}, logs) + failure)
            results[rank] = _unpacked(fn, rank, value)
        finished = True
    finally:
        for p in procs:  # after a failure the others may wait for the failed rank until their timeout: end them
            p.join(timeout=5 if finished else 0.2)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world_size)]


def _unpacked(fn: Callable[..., Any], rank: int, payload: bytes) -> Any:
    """A rank's result, unpickled in the launching process (its classes must be importable here too)."""
    try:
        return ForkingPickler.loads(payload)
    except Exception as exc:
        raise WorkerError(f"{fn.__name__}: the result of rank {rank} cannot be unpickled in this process "
                          f"({type(exc).__name__}: {exc}). Return values whose classes this process can import: "
                          "numbers, strings, tensors, and lists or dicts of them.") from None


def _log_tail(logs: str | None, fn: Callable[..., Any], rank: int, pid: int | None, lines: int = 30) -> str:
    """The end of a quiet worker's standard error, when ``make test`` kept it (else nothing)."""
    if not logs or pid is None:
        return ""
    try:
        with open(_log_path(logs, fn, rank, pid), encoding="utf-8", errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
    except OSError:
        return ""
    return "; its last lines on stderr:\n" + "\n".join(tail) if tail else ""


def _died(exitcode: int | None) -> str:
    """How a process ended: "died with exit code 7", or for a signal "died from signal SIGSEGV (exit code -11)"."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        return f"died from signal {name} (exit code {exitcode})"
    return f"died with exit code {exitcode}"


def _dead_rank(fn: Callable[..., Any], procs: list[Any], rank: int, logs: str | None, then: str = "") -> str:
    """"fn: rank N died ...", ``then``, and the end of its standard error when ``make test`` kept it."""
    return f"{fn.__name__}: rank {rank} {_died(procs[rank].exitcode)}{then}{_log_tail(logs, fn, rank, procs[rank].pid)}"


def _crash_first(fn: Callable[..., Any], procs: list[Any], reported: set[int], logs: str | None) -> str:
    """The ranks that ended without sending anything back (a crash in native code), with their last lines,
    put before the other ranks' errors: those ("Connection closed by peer") follow from the crash."""
    then = " without sending back an error; the errors of the ranks that waited for it follow"
    return "".join(_dead_rank(fn, procs, r, logs, then) + "\n" for r, p in enumerate(procs)
                   if r not in reported and p.exitcode not in (None, 0))


def _first_failure(name: str, failures: dict[int, str], queue: Any, grace: float = 3.0) -> str:
    """The report of the lowest failing rank. When one rank fails, the others usually fail soon after
    with "connection closed by peer"; waiting a moment for their reports and naming the lowest rank
    makes the message point at the cause rather than at whichever echo arrived first."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            rank, good, value = queue.get(timeout=max(0.05, deadline - time.monotonic()))
        except Empty:
            break
        if not good:
            failures[rank] = value
    first = min(failures)
    others = sorted(set(failures) - {first})
    also = f"\n(also failed: rank {', '.join(map(str, others))})" if others else ""
    return f"{name} failed on rank {first}:\n{failures[first]}{also}"

