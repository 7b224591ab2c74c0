"""`harness sweep FILE --backend ray [--address ADDR] [--retries N] [--transfer objects|shared-fs]`: every
point is a Ray task.

Each task runs `harness.experiments.point.run_point`, the function the local backend runs, so a point writes
the same files with the same metrics whichever backend ran it. The local process pool stays the
default; `ray` is the optional extra `dist` (pip install -e '.[dist]').

How the files reach results/ (--transfer; harness.experiments.ray_transfer has the task side):
  objects (the default): no filesystem is shared. A task runs its point in a folder of its own node
    ($HARNESS_RAY_SCRATCH there, else <temp dir>/harness-ray), filled with the point's files as this
    driver holds them (a resumed point's checkpoint and logs). At every checkpoint the trainer writes,
    and when the point ends, the task ships the files that changed to a mailbox actor on this driver's
    node, through Ray's object store; this driver alone writes them into results/<sweep>/<point>/
    (harness.store.transfer: each file atomically, the logs before the checkpoint, the status last),
    so a point ends with the files and bytes the local backend writes. A retried attempt (--retries,
    on any node) starts from the last checkpoint this driver got, and a driver killed and started
    again resumes from what results/ holds. This driver holds each point's lock while its task runs,
    and copies points whose identical run finished in another sweep folder itself (`find_donor`).
    Size limits: a point folder larger than --max-point-mb (default 1024 MiB) is refused (the point
    fails with a message); the change sets of the points in flight must fit in the object stores
    (Ray spills to disk beyond them; a local instance has 256 MiB) and in this driver's memory; a
    point's whole folder is read at each checkpoint (its logs included) and, for a point that resumes,
    sent with its task. Without a shared filesystem the default MLflow store (a file beside results/)
    is out of the tasks' reach: MLflow is then off in the tasks with a warning (metrics.jsonl holds
    everything), unless MLFLOW_TRACKING_URI names a server. Each node keeps its own model cache
    (<scratch>/cache) unless HARNESS_CACHE is set, which then names a path on every node.
  shared-fs: every node sees the results folder at the same path and tasks write into it directly.
    At the start of each look, a task on every node writes a probe file there and the driver checks
    that it sees it; where it does not, the command stops with a message (nodes joining later are
    not checked).

Resources a task asks for, derived from its config (no extra config keys):
    num_cpus = max(1, train.threads)     (threads 0 = torch's default still reserves one CPU)
    num_gpus = 1 when train.device is cuda, or auto on a cluster that has GPUs; else 0
A point asking for more than the whole cluster has is an error before anything is submitted.

Without --address, a local Ray instance is started for the sweep and stopped after it: bound to
127.0.0.1 only (Ray's local-only mode, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), no dashboard, no usage
stats, max(--workers, the largest num_cpus of a point) logical CPUs. With --address the driver
connects to a running cluster (in local-only mode too when ADDR is 127.0.0.1 / localhost)
(`ray start --head` ...); every node then needs this project installed. The driver must run on a
node of the cluster (Ray's own rule for `ray.init(address=...)`): the mailbox lives there. Joining a
cluster requires Ray's token authentication
(RAY_AUTH_MODE=token, set here): the token comes from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
~/.ray/auth_token (`ray get-auth-token --generate` on the head), and without one the command stops
before connecting. `--insecure` joins a cluster without authentication (anyone who can reach it can
run code there).

Retries: --retries N runs a point again, up to N times, when it fails (status `failed`) or when its
worker process dies or its node is lost (Ray's max_retries and retry_exceptions); it resumes from its
last checkpoint. Without retries such a point is marked `failed` with its checkpoint kept, and
--retry-failed resumes it. Only the variables of FORWARDED_ENV (caches, offline switches, the MLflow
tracking URI) and PYTHONPATH are set in the tasks: tokens and passwords (HF_TOKEN,
MLFLOW_TRACKING_PASSWORD, ...) are never sent to the cluster; its nodes use their own. Ctrl-C cancels
the running tasks; their points keep status `running` (with what they shipped) and resume next time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any

from harness.config.errors import ConfigError, UnavailableError
from harness.experiments.point import RunOptions, find_donor, point_dir, read_status, spec_string
from harness.experiments.ray_transfer import (
    DEFAULT_MAX_MB,
    Mailbox,
    PointFailedError,
    PointTooLargeError,
    run_point_task,
    run_shipped_task,
    write_probe,
)
from harness.experiments.redact import mask_credentials
from harness.experiments.runner import _record, _run_one
from harness.experiments.sweep import Point
from harness.store import FINISHED, TRACEBACK, atomic_write_text, point_lock, write_status
from harness.store.transfer import read_files, write_files

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
TRANSFERS = ("objects", "shared-fs")
DEFAULT_TRANSFER = "objects"


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


# ----------------------------------------------------------------------------- the driver
class RayExecutor:
    """`RunOptions.executor` for harness.experiments.runner.run_sweep."""

    def __init__(
        self,
        address: str | None = None,
        retries: int = 0,
        insecure: bool = False,
        transfer: str | None = None,
        max_point_mb: float | None = None,
    ):
        self.address, self.retries = address, retries
        self.transfer = transfer or DEFAULT_TRANSFER
        self.max_bytes = int((max_point_mb or DEFAULT_MAX_MB) * 2**20)
        self.own_cache = bool(os.environ.get("HARNESS_CACHE"))  # the user's, not the sweep's default
        self.warned = False
        host = address.rpartition(":")[0].strip("[]") if address and ":" in address else address
        # a cluster on the loopback interface is joined in Ray's local-only mode too: a driver that
        # registered with this host's outside address would wait forever for a raylet there
        self.loopback = address is None or host in ("127.0.0.1", "localhost", "::1")
        if address is not None and not insecure:
            require_token_auth(address)
        import_ray(self.loopback)  # fail early with the install hint

    @property
    def objects(self) -> bool:
        return self.transfer == "objects"

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
        if env.get("HARNESS_CACHE") and self.objects and not self.own_cache and not self.loopback:
            del env["HARNESS_CACHE"]  # the default beside results/: each node keeps its own (ray_transfer)
        if env.get("HARNESS_CACHE"):  # workers do not share the driver's working directory
            env["HARNESS_CACHE"] = str(Path(env["HARNESS_CACHE"]).resolve())
        paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        return {**env, "PYTHONPATH": os.pathsep.join(paths)}

    def _task_mlflow(self, uri: str | None) -> str | None:
        """The tracking URI the tasks get: a file store beside results/ only where they can reach it."""
        if uri is None or not self.objects or self.loopback:
            return uri
        if not uri.startswith(("sqlite:", "file:")) and ("://" in uri or uri == "databricks"):
            return uri  # a tracking server
        if not self.warned:
            self.warned = True
            print(
                f"warning: MLflow is off in the Ray tasks: its store {mask_credentials(uri)} is a file on this machine "
                f"and --transfer objects assumes no shared filesystem; metrics.jsonl holds every metric. Set "
                f"MLFLOW_TRACKING_URI to a tracking server the nodes reach to log there.",
                flush=True,
            )
        return None

    def _mailbox(self, ray: Any) -> Any:
        """The look's mailbox actor, on the driver's node (it must outlive any other node)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        return ray.remote(Mailbox).options(num_cpus=0, scheduling_strategy=here).remote()

    def _probe_shared(self, ray: Any, folder: Path) -> None:
        """--transfer shared-fs: every alive node writes a file into the sweep folder, which this driver
        must then see; an UnavailableError naming the nodes that do not share it."""
        from ray.exceptions import GetTimeoutError, RayError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        folder, probe, bad = folder.resolve(), ray.remote(num_cpus=0)(write_probe), []
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        for n in nodes:
            path = folder / f".shared-fs-probe-{n['NodeID'][:16]}-{os.getpid()}"
            there = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            try:
                error = ray.get(probe.options(scheduling_strategy=there).remote(str(path)), timeout=120)
            except (GetTimeoutError, RayError) as e:
                error = f"{type(e).__name__}"
            if error is not None or not path.exists():
                bad.append(f"{n.get('NodeManagerAddress')} ({error or 'wrote it, and this driver does not see it'})")
            path.unlink(missing_ok=True)
        if bad:
            raise UnavailableError(
                f"--transfer shared-fs: the results folder {folder} is not shared with every Ray node: a task on "
                f"{'; '.join(bad)} tried to write a file into it. Use --transfer objects (the default), which ships "
                f"each point's files to this driver through Ray's object store."
            )
        print(f"--transfer shared-fs: all {len(nodes)} Ray node(s) see {folder}", flush=True)

    def _claim(self, sweep: str, todo: list[Point], opts: RunOptions, progress: Any, result: Any, locks: Any) -> list:
        """--transfer objects: the points this driver submits, each locked here (their tasks run
        elsewhere); a point with an identical finished run in another sweep folder is copied here."""
        _room_for(len(todo))
        out = []
        for p in todo:
            if opts.reuse and find_donor(p, sweep, opts) is not None:
                if not _run_one(sweep, p, opts, progress, result, wait=False):
                    return []
                continue
            run_dir = point_dir(opts.results, sweep, p)
            run_dir.mkdir(parents=True, exist_ok=True)
            if not locks.enter_context(point_lock(run_dir, blocking=False)):
                _record(result, progress, p, {"status": "busy", "wall_s": 0.0, "error": "running in another process"})
                continue
            out.append(p)
        return out

    def _submit(self, ray: Any, sweep: str, todo: list[Point], opts: RunOptions, mailbox: Any) -> dict:
        total = ray.cluster_resources()
        child = RunOptions(
            results=Path(opts.results).resolve(),
            mlflow_uri=self._task_mlflow(opts.mlflow_uri),
            train_fn=spec_string(opts.train_fn),
            env_info=opts.env_info,
            tags=dict(opts.tags),
            reuse=opts.reuse and not self.objects,  # the driver looked for donors (_claim)
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
        task, env = ray.remote(run_shipped_task if self.objects else run_point_task), self._env()
        retry = [PointFailedError] if self.retries else False
        refs = {}
        for p in todo:
            args = (p, sweep, child, env, mailbox)
            if self.objects:  # what a retried attempt needs beyond the mailbox's change sets
                args += (read_files(point_dir(opts.results, sweep, p)) or {}, self.max_bytes)
            opt = {**asks[p.id], "max_retries": self.retries, "retry_exceptions": retry, "name": f"harness:{p.id}"}
            refs[task.options(**opt).remote(*args)] = p
        return refs

    def _run(self, ray: Any, sweep: str, todo: list[Point], opts: RunOptions, progress: Any, result: Any) -> None:
        mailbox, by_id = self._mailbox(ray), {p.id: p for p in todo}
        with contextlib.ExitStack() as locks:
            if self.objects:
                todo = self._claim(sweep, todo, opts, progress, result, locks)
            else:
                self._probe_shared(ray, Path(opts.results) / sweep)
            refs = self._submit(ray, sweep, todo, opts, mailbox)
            try:
                while refs:
                    done, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
                    self._drain(ray, mailbox, sweep, opts, progress, by_id)
                    for ref in done:
                        point = refs.pop(ref)
                        self._finish(ray, ref, point, sweep, opts, progress, result)
                        mailbox.forget.remote(point.id)
            except KeyboardInterrupt:
                result.interrupted = True
                for ref in refs:
                    ray.cancel(ref)
                try:
                    ray.wait(list(refs), num_returns=len(refs), timeout=60)
                    self._drain(ray, mailbox, sweep, opts, None, by_id)  # what the cancelled tasks shipped
                except KeyboardInterrupt:
                    pass

    def _drain(self, ray: Any, mailbox: Any, sweep: str, opts: RunOptions, progress: Any, by_id: dict) -> None:
        """Write the change sets the mailbox holds into results/; pass the progress events on. A Ctrl-C
        or SIGTERM meanwhile waits until the change sets it handed over are on disk."""
        with _uninterrupted():
            events, changes = ray.get(mailbox.drain.remote())
            for pid, files in changes.items():
                if pid in by_id:
                    write_files(point_dir(opts.results, sweep, by_id[pid]), files)
        for kind, pid, info in events if progress is not None else ():
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
            elif isinstance(cause, PointTooLargeError):
                res = self._mark_failed(point, sweep, opts, str(cause), str(cause))
            else:  # the worker died (out of memory, killed, a crash, its node lost) after its retries
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                res = self._mark_failed(point, sweep, opts, f"Ray task failed: {type(e).__name__}: {first}", str(e))
        if res["status"] == "interrupted":
            result.interrupted = True
            if progress is not None:
                progress.point_end(point.id, "interrupted")
        else:
            _record(result, progress, point, res)

    @staticmethod
    def _mark_failed(point: Point, sweep: str, opts: RunOptions, error: str, detail: str) -> dict:
        """A point whose task never reported: `failed`, with a traceback.txt, its checkpoint kept."""
        run_dir = point_dir(opts.results, sweep, point)
        if read_status(run_dir) not in FINISHED:
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(run_dir / TRACEBACK, f"{error}\n\n{detail}\n")
            write_status(run_dir, "failed")
        return {"status": "failed", "wall_s": None, "error": error}


@contextlib.contextmanager
def _uninterrupted() -> Any:
    """Hold Ctrl-C and SIGTERM (in the main thread) until the block is over, then deliver them."""
    signals = [signal.SIGINT, signal.SIGTERM]
    old = {s: signal.getsignal(s) for s in signals}
    if threading.current_thread() is not threading.main_thread() or None in old.values():
        yield
        return
    caught: list[int] = []
    for s in signals:
        signal.signal(s, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if caught:
            os.kill(os.getpid(), caught[0])


def _room_for(locks: int) -> None:
    """Raise the soft limit of open files so that a lock per point in flight fits."""
    try:
        import resource
    except ImportError:  # not POSIX: file_lock takes no lock there
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = locks + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
