"""Many environment instances stepped in lock-step, in-process or in worker processes.

Every instance is its own Env object. `workers=0` keeps them in this process; `workers=k`
spreads them over k processes (instance i lives in worker i % k), so a native crash (the
TextWorld interpreter can segfault) kills one worker only: its episodes in flight end with
done=True and info["env_error"], the worker is restarted, and other workers go on.
An exception raised by an env's reset/step/expert is caught the same way in both modes;
nothing an environment does raises into the caller.

Step results carry info["truncated"] (True when `max_turns` ended the episode) and, for a
failed episode, info["env_error"] (the message). `stats` counts env errors, worker restarts
and truncations.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from envs.base import REWARD_DENSITIES, StepResult
from envs.registry import env_class, make_env, validate_options


def error_info(message: str) -> dict[str, Any]:
    """The info of an episode ended by an environment failure."""
    return {
        "won": False,
        "score": 0.0,
        "admissible": None,
        "state_key": "",
        "format_error": False,
        "env_error": message,
        "done": True,
    }


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:500]


class _Failure:
    """A worker that died, hung or failed a whole call: each of its items gets `message`."""

    def __init__(self, message: str):
        self.message = message


class _Pool:
    """The instances one process owns; every env exception becomes an error result."""

    def __init__(self, env_name: str, options: dict, reward_density: str, format_penalty: float, indices: list[int]):
        self.build = lambda: make_env(env_name, options, reward_density=reward_density, format_penalty=format_penalty)
        self.envs: dict[int, Any] = dict.fromkeys(indices)  # built on first reset

    def reset(self, items: list[tuple[int, int]]) -> list:
        out = []
        for i, seed in items:
            try:
                if self.envs[i] is None:
                    self.envs[i] = self.build()
                out.append(self.envs[i].reset(seed))
            except Exception as e:  # noqa: BLE001 - contained, reported as env_error
                self.discard(i)  # rebuilt on the next reset
                out.append(("", error_info(_describe(e))))
        return out

    def step(self, items: list[tuple[int, str]]) -> list[StepResult]:
        out = []
        for i, text in items:
            try:
                if self.envs[i] is None:
                    raise RuntimeError("no episode in progress (its worker was restarted?)")
                out.append(self.envs[i].step(text))
            except Exception as e:  # noqa: BLE001
                self.discard(i)
                out.append(StepResult("", 0.0, True, error_info(_describe(e))))
        return out

    def expert(self, items: list[tuple[int, Any]]) -> list[str | None]:
        out = []
        for i, _ in items:
            try:
                out.append(self.envs[i].expert_action())
            except Exception:  # noqa: BLE001 - no expert action for a broken episode
                out.append(None)
        return out

    def instructions(self, items: list[tuple[int, Any]]) -> list[str]:
        return [self.build().instructions for _ in items]

    def discard(self, i: int) -> None:
        env, self.envs[i] = self.envs[i], None
        try:
            if env is not None:
                env.close()
        except Exception:  # noqa: BLE001 - a broken env may fail to close too
            pass

    def close(self, _: Any = None) -> None:
        for i in list(self.envs):
            self.discard(i)


def _worker_main(conn, env_module: str, pool_args: tuple) -> None:
    importlib.import_module("envs")
    importlib.import_module(env_module)  # registers envs defined outside the package
    pool = _Pool(*pool_args)
    while True:
        try:
            command, payload = conn.recv()
        except (EOFError, OSError):
            return
        if command == "close":
            pool.close()
            return
        try:
            result = getattr(pool, command)(payload)
        except Exception as e:  # noqa: BLE001 - a bug in the pool: fail this call only
            result = RuntimeError(_describe(e))
        conn.send(result)


class _Worker:
    def __init__(self, ctx, env_module: str, pool_args: tuple):
        self.ctx, self.env_module, self.pool_args = ctx, env_module, pool_args
        self.start()

    def start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker_main, daemon=True, args=(child, self.env_module, self.pool_args))
        self.proc.start()
        child.close()

    def send(self, message) -> bool:
        try:
            self.conn.send(message)
            return True
        except (OSError, ValueError):
            return False

    def receive(self, timeout_s: float | None):
        """The worker's answer (a list), or a _Failure when it died or timed out."""
        ready = wait([self.conn, self.proc.sentinel], timeout_s)
        if self.conn in ready or self.conn.poll(0):
            try:
                result = self.conn.recv()
                return result if not isinstance(result, Exception) else _Failure(_describe(result))
            except (EOFError, OSError):
                pass
        if not ready:
            return _Failure(f"worker timed out after {timeout_s}s")
        self.proc.join(1)
        return _Failure(f"worker process died (exit code {self.proc.exitcode})")

    def restart(self) -> None:
        self.stop(graceful=False)
        self.start()

    def stop(self, graceful: bool = True) -> None:
        if graceful and self.proc.is_alive():
            self.send(("close", None))
            self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2)
        self.conn.close()


def _context(start_method: str | None, env_module: str):
    """'forkserver' (default where available) or 'spawn'; never 'fork' (unsafe after CUDA).

    The forkserver imports `envs` (and torch, via the registries) once, and every worker,
    first or restarted, forks from it in ~20 ms instead of re-importing for seconds."""
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # the server process does not inherit sys.path (Python 3.11): make `envs` importable
        root = str(Path(__file__).resolve().parent.parent)
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if root not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p])
        ctx.set_forkserver_preload(["envs", env_module])  # no effect once it is running
    return ctx


class VectorEnv:
    """`n` instances of one environment, reset and stepped together.

    reset(seeds) -> [(obs, info) | None]: a None seed leaves that instance alone.
    step(actions) -> [StepResult | None]: a None action, or an instance whose episode is
    over, is skipped and gives None. `max_turns` truncates an episode after that many steps
    (done=True, info["truncated"]=True). `timeout_s` (worker mode) ends the episodes of a
    worker that does not answer a call in time, and restarts it. `start_method`: see
    `_context`. Call `close()` (or use `with`) to stop the workers.
    """

    def __init__(
        self,
        env_name: str,
        options: dict | None = None,
        reward_density: str = "sparse",
        format_penalty: float = 0.0,
        n: int = 1,
        workers: int = 0,
        max_turns: int | None = None,
        timeout_s: float | None = None,
        start_method: str | None = None,
    ):
        cls = env_class(env_name)
        opts = validate_options(env_name, options).model_dump()
        if reward_density not in REWARD_DENSITIES:
            raise ValueError(f"reward_density must be one of {REWARD_DENSITIES}, got {reward_density!r}")
        if n < 1 or workers < 0:
            raise ValueError(f"VectorEnv needs n >= 1 and workers >= 0, got n={n}, workers={workers}")
        self.env_name, self.n, self.max_turns, self.timeout_s = env_name, n, max_turns, timeout_s
        self.workers = min(workers, n)
        self.active = [False] * n  # an episode is in progress
        self.turns = [0] * n
        self.stats = {"env_errors": 0, "worker_restarts": 0, "truncated": 0}
        self._instructions: str | None = None
        args = (env_name, opts, reward_density, format_penalty)
        if self.workers == 0:
            self._pools: list = [_Pool(*args, list(range(n)))]
        else:
            ctx = _context(start_method, cls.__module__)
            self._pools = [
                _Worker(ctx, cls.__module__, args + (list(range(w, n, self.workers)),)) for w in range(self.workers)
            ]

    @property
    def instructions(self) -> str:
        """The environment's (task-independent) instructions."""
        if self._instructions is None:
            result = self._run("instructions", {0: None})[0]
            if isinstance(result, _Failure):
                raise RuntimeError(f"{self.env_name}: no instance could be built: {result.message}")
            self._instructions = result
        return self._instructions

    def reset(self, seeds: list[int | None]) -> list[tuple[str, dict] | None]:
        self._check_len(seeds, "seeds")
        results = self._run("reset", {i: s for i, s in enumerate(seeds) if s is not None})
        out: list = [None] * self.n
        for i, result in results.items():
            if isinstance(result, _Failure):
                result = ("", error_info(result.message))
            error = "env_error" in result[1]
            self.stats["env_errors"] += error
            self.active[i], self.turns[i] = not error, 0
            out[i] = result
        return out

    def step(self, actions: list[str | None]) -> list[StepResult | None]:
        self._check_len(actions, "actions")
        items = {i: a for i, a in enumerate(actions) if a is not None and self.active[i]}
        out: list = [None] * self.n
        for i, result in self._run("step", items).items():
            if isinstance(result, _Failure):
                result = StepResult("", 0.0, True, error_info(result.message))
            self.turns[i] += 1
            result.info["truncated"] = False
            if "env_error" in result.info:
                self.stats["env_errors"] += 1
            elif not result.done and self.max_turns is not None and self.turns[i] >= self.max_turns:
                result.done = True
                result.info["truncated"] = True
                self.stats["truncated"] += 1
            self.active[i] = not result.done
            out[i] = result
        return out

    def expert_actions(self) -> list[str | None]:
        """The expert's next action per active instance (None: inactive or no expert)."""
        results = self._run("expert", {i: None for i in range(self.n) if self.active[i]})
        return [None if isinstance(r, _Failure) else r for r in (results.get(i) for i in range(self.n))]

    def close(self) -> None:
        """Close every instance and stop the workers; the VectorEnv is unusable after."""
        for pool in self._pools:
            pool.stop() if self.workers else pool.close()
        self._pools = []

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _check_len(self, values: list, what: str) -> None:
        if len(values) != self.n:
            raise ValueError(f"VectorEnv of n={self.n} got {len(values)} {what}")

    def _run(self, command: str, items: dict[int, Any]) -> dict[int, Any]:
        """`command` on the instances in `items` (index -> argument), every pool at once.

        Returns index -> result, or index -> _Failure for the items of a dead/hung worker
        (which is restarted)."""
        if not self._pools:
            raise RuntimeError(f"VectorEnv({self.env_name!r}) is closed")
        groups: dict[int, list[int]] = {}
        for i in items:
            groups.setdefault(0 if self.workers == 0 else i % self.workers, []).append(i)
        calls = {w: [(i, items[i]) for i in idx] for w, idx in groups.items()}
        if self.workers == 0:
            return dict(zip(groups.get(0, []), getattr(self._pools[0], command)(calls.get(0, []))))
        sent = {w: self._pools[w].send((command, call)) for w, call in calls.items()}
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        out: dict[int, Any] = {}
        for w, idx in groups.items():
            worker = self._pools[w]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            result = worker.receive(left) if sent[w] else _Failure("worker pipe is closed")
            if isinstance(result, _Failure):
                worker.restart()
                self.stats["worker_restarts"] += 1
                result = [result] * len(idx)
            out.update(zip(idx, result))
        return out
