"""`harness sweep FILE --backend ray [--address ADDR] [--retries N]`: every point is a Ray task.

Each task runs `harness.experiments.point.run_point`, the function the local backend runs, so a point writes
the same files with the same metrics whichever backend ran it. The local process pool stays the
default; `ray` is the optional extra `dist` (pip install -e '.[dist]').

Resources a task asks for, derived from its config (no extra config keys):
    num_cpus = max(1, train.threads)     (threads 0 = torch's default still reserves one CPU)
    num_gpus = 1 when train.device is cuda, or auto on a cluster that has GPUs; else 0
A point asking for more than the whole cluster has is an error before anything is submitted.

Without --address, a local Ray instance is started for the sweep and stopped after it: bound to
127.0.0.1 only (Ray's local-only mode, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), no dashboard, no usage
stats, max(--workers, the largest num_cpus of a point) logical CPUs. With --address the driver
connects to a running cluster (in local-only mode too when ADDR is 127.0.0.1 / localhost)
(`ray start --head` ...); every node then needs this project installed and the results folder at
the same path (a shared filesystem). Joining a cluster requires Ray's token authentication
(RAY_AUTH_MODE=token, set here): the token comes from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
~/.ray/auth_token (`ray get-auth-token --generate` on the head), and without one the command stops
before connecting. `--insecure` joins a cluster without authentication (anyone who can reach it can
run code there).

Retries: --retries N runs a point again, up to N times, when it fails (status `failed`) or when its
worker process dies (Ray's max_retries and retry_exceptions); it resumes from its checkpoint.
Only the variables of FORWARDED_ENV (caches, offline switches, the MLflow tracking URI) and
PYTHONPATH are set in the tasks: tokens and passwords (HF_TOKEN, MLFLOW_TRACKING_PASSWORD, ...) are
never sent to the cluster; its nodes use their own. Ctrl-C cancels the running tasks; their points
keep status `running` and resume next time.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from harness.config.errors import ConfigError, UnavailableError
from harness.experiments.point import RunOptions, point_dir, read_status, run_point, spec_string
from harness.experiments.redact import mask_credentials
from harness.experiments.runner import _record
from harness.experiments.sweep import Point
from harness.store import FINISHED, TRACEBACK, atomic_write_text, write_status

FORWARDED_ENV = (
    "HARNESS_CACHE",
    "MLFLOW_TRACKING_URI",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "TRANSFORMERS_CACHE",
    "OMP_NUM_THREADS",
    "PYTHONHASHSEED",
)

LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2


class PointFailedError(RuntimeError):
    """A point ended with status `failed` inside a Ray task (Ray retries it when --retries > 0)."""


def point_resources(cfg: Any, cluster_gpus: float) -> dict[str, float]:
    """What one point's task asks Ray for (see the module doc)."""
    device = cfg.train.device
    gpus = 1 if device == "cuda" or (device == "auto" and cluster_gpus > 0) else 0
    return {"num_cpus": max(1, int(cfg.train.threads)), "num_gpus": gpus}


def require_token_auth(address: str) -> None:
    """Turn Ray's token authentication on for joining `address`; a ConfigError when no token is
    found or authentication was switched off (the caller skips this for --insecure)."""
    mode = os.environ.get("RAY_AUTH_MODE", "token")
    if mode.lower() != "token":
        raise ConfigError(
            f"--address {address}: RAY_AUTH_MODE={mode} turns Ray's token authentication off; unset it, "
            f"or pass --insecure to join a cluster without authentication (anyone who can reach it can run code)."
        )
    path, default = os.environ.get("RAY_AUTH_TOKEN_PATH"), Path.home() / ".ray" / "auth_token"
    if not os.environ.get("RAY_AUTH_TOKEN") and not Path(path or default).expanduser().is_file():
        where = f"RAY_AUTH_TOKEN_PATH={path} is not a file" if path else f"no {default}"
        raise ConfigError(
            f"--address {address}: joining a Ray cluster needs its authentication token and none was found "
            f"(RAY_AUTH_TOKEN is unset, {where}). Copy the head's token (`ray get-auth-token` there) into "
            f"RAY_AUTH_TOKEN or {default}, or pass --insecure to join without authentication."
        )
    os.environ["RAY_AUTH_MODE"] = "token"


def import_ray(local: bool) -> Any:
    """`ray`, or a one-line UnavailableError naming the extra to install. Ray reads these variables
    when it is imported."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if local:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError as e:
        raise UnavailableError(
            f"--backend ray needs the `ray` package ({e}); install the extra: "
            f"pip install -e '.[dist]' (or pip install ray), or use --backend local"
        ) from None
    if local and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0":
        from ray._private import ray_constants  # imported before we set the variable: same effect

        ray_constants.ENABLE_RAY_CLUSTER = False
    return ray


# ----------------------------------------------------------------------------- inside a Ray worker
def _apply_env(env: dict[str, str]) -> None:
    for path in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})


def run_point_task(point: Point, sweep: str, opts: RunOptions, env: dict[str, str], queue: Any) -> dict:
    """The Ray task: one point, progress sent to the driver's queue."""
    _apply_env(env)
    if threading.current_thread() is threading.main_thread():  # ray.cancel interrupts with SIGINT, which a
        signal.signal(signal.SIGINT, signal.default_int_handler)  # background driver passes on ignored
    if queue is not None:
        queue.put(("start", point.id, None))
    progress = (lambda info: queue.put(("update", point.id, dict(info)))) if queue is not None else None
    try:
        res = run_point(point, sweep, opts, progress)
    except KeyboardInterrupt:  # ray.cancel: the point stays `running` and resumes next time
        return {"status": "interrupted", "wall_s": None, "error": None}
    if res["status"] == "failed":
        raise PointFailedError(res["error"] or "failed")
    return res


# ----------------------------------------------------------------------------- the driver
class RayExecutor:
    """`RunOptions.executor` for harness.experiments.runner.run_sweep."""

    def __init__(self, address: str | None = None, retries: int = 0, insecure: bool = False):
        self.address, self.retries = address, retries
        host = address.rpartition(":")[0].strip("[]") if address and ":" in address else address
        # a cluster on the loopback interface is joined in Ray's local-only mode too: a driver that
        # registered with this host's outside address would wait forever for a raylet there
        self.loopback = address is None or host in ("127.0.0.1", "localhost", "::1")
        if address is not None and not insecure:
            require_token_auth(address)
        import_ray(self.loopback)  # fail early with the install hint

    def __call__(self, sweep: str, todo: list[Point], opts: RunOptions, progress: Any, result: Any) -> None:
        if not todo:  # every point finished before: no cluster needed
            return
        ray = import_ray(self.loopback)
        self._connect(ray, todo, opts)
        try:
            self._run(ray, sweep, todo, opts, progress, result)
        finally:
            ray.shutdown()  # stops a local instance; a cluster keeps running

    def _connect(self, ray: Any, todo: list[Point], opts: RunOptions) -> None:
        on_sigterm = signal.getsignal(signal.SIGTERM)  # ray.init installs its own (abort): keep ours
        try:
            if self.address is None:
                cpus = max([opts.workers] + [point_resources(p.config, 0)["num_cpus"] for p in todo])
                ray.init(
                    address="local",
                    num_cpus=cpus,
                    include_dashboard=False,
                    logging_level="WARNING",
                    object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                )
            else:
                ray.init(address=self.address, logging_level="WARNING")
        except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError, auth errors
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
            auth = "InvalidAuthToken" in f"{e} {e.__cause__} {e.__context__}"
            hint = (
                "; the cluster wants its authentication token: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN "
                "(or RAY_AUTH_TOKEN_PATH)"
                if auth
                else ""
            )
            raise UnavailableError(
                mask_credentials(f"cannot start or reach {where}: {type(e).__name__}: {first}{hint}")
            ) from None
        if callable(on_sigterm) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_sigterm)

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        if env.get("HARNESS_CACHE"):  # workers do not share the driver's working directory
            env["HARNESS_CACHE"] = str(Path(env["HARNESS_CACHE"]).resolve())
        paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        return {**env, "PYTHONPATH": os.pathsep.join(paths)}

    def _submit(self, ray: Any, sweep: str, todo: list[Point], opts: RunOptions, queue: Any) -> dict:
        total = ray.cluster_resources()
        child = RunOptions(
            results=Path(opts.results).resolve(),
            mlflow_uri=opts.mlflow_uri,
            train_fn=spec_string(opts.train_fn),
            env_info=opts.env_info,
            tags=dict(opts.tags),
            reuse=opts.reuse,
        )
        asks = {p.id: point_resources(p.config, total.get("GPU", 0)) for p in todo}
        for p in todo:
            need = asks[p.id]
            if need["num_cpus"] > total.get("CPU", 0) or need["num_gpus"] > total.get("GPU", 0):
                raise UnavailableError(
                    f"point {p.id} asks for {need['num_cpus']} CPU(s) (train.threads) and {need['num_gpus']} GPU(s) "
                    f"(train.device {p.config.train.device!r}); the Ray cluster has {total.get('CPU', 0):g} CPU(s) and "
                    f"{total.get('GPU', 0):g} GPU(s). Lower train.threads / set train.device, or add nodes."
                )
        task, env = ray.remote(run_point_task), self._env()
        retry = [PointFailedError] if self.retries else False
        return {
            task.options(**asks[p.id], max_retries=self.retries, retry_exceptions=retry, name=f"harness:{p.id}").remote(
                p, sweep, child, env, queue
            ): p
            for p in todo
        }

    def _run(self, ray: Any, sweep: str, todo: list[Point], opts: RunOptions, progress: Any, result: Any) -> None:
        from ray.util.queue import Queue

        queue = Queue(actor_options={"num_cpus": 0}) if progress is not None else None
        refs = self._submit(ray, sweep, todo, opts, queue)
        try:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
                self._drain(queue, progress, {p.id: p for p in refs.values()})
                for ref in done:
                    self._finish(ray, ref, refs.pop(ref), sweep, opts, progress, result)
        except KeyboardInterrupt:
            result.interrupted = True
            for ref in refs:
                ray.cancel(ref)
            try:
                ray.wait(list(refs), num_returns=len(refs), timeout=60)
            except KeyboardInterrupt:
                pass

    @staticmethod
    def _drain(queue: Any, progress: Any, by_id: dict[str, Point]) -> None:
        while queue is not None and not queue.empty():
            kind, pid, info = queue.get_nowait()
            if kind == "start" and pid in by_id:
                progress.point_start(pid, by_id[pid].config.train.updates)
            elif kind == "update":
                progress.point_update(pid, info)

    def _finish(
        self, ray: Any, ref: Any, point: Point, sweep: str, opts: RunOptions, progress: Any, result: Any
    ) -> None:
        from ray.exceptions import RayError, TaskCancelledError

        try:
            res = ray.get(ref)
        except TaskCancelledError:
            res = {"status": "interrupted"}
        except RayError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, PointFailedError):
                res = {"status": "failed", "wall_s": None, "error": str(cause)}
            else:  # the worker died (out of memory, killed, a crash) after its retries
                res = self._mark_crashed(point, sweep, opts, e)
        if res["status"] == "interrupted":
            result.interrupted = True
            if progress is not None:
                progress.point_end(point.id, "interrupted")
        else:
            _record(result, progress, point, res)

    @staticmethod
    def _mark_crashed(point: Point, sweep: str, opts: RunOptions, e: Exception) -> dict:
        run_dir = point_dir(opts.results, sweep, point)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        error = f"Ray task failed: {type(e).__name__}: {first}"
        if read_status(run_dir) not in FINISHED:
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(run_dir / TRACEBACK, f"{error}\n\n{e}\n")
            write_status(run_dir, "failed")
        return {"status": "failed", "wall_s": None, "error": error}
