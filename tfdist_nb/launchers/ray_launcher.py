"""Tasks as Ray actors on a Ray cluster (docs/remote.md, "Ray"; docs/security.md, "Ray launcher").

One placement group holds a bundle per task; each bundle's actor
(:class:`tfdist_nb.worker.ray_node.TaskNode`) says its node's address and a free TF port, then
starts the task's kernel. Ray is imported only when a cluster starts: the package runs without
it. What Ray users hit (unplaceable asks, dead nodes, version skew) is said in Ray's terms.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from jupyter_client.asynchronous import AsyncKernelClient

from tfdist_nb.errors import ClusterStartError
from tfdist_nb.gpu_plan import Placement
from tfdist_nb.launchers.base import (
    Launcher,
    LauncherOption,
    StopPath,
    StopReport,
    TaskHandle,
    TaskLaunch,
)
from tfdist_nb.launchers.ray_said import SPAWN_TRIES, spawn_failed, version_mismatch
from tfdist_nb.launchers.ssh import forwarded_environment
from tfdist_nb.topology import TaskId

T = TypeVar("T")

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle
    from ray.util.placement_group import PlacementGroup

    from tfdist_nb.worker.ray_node import NodeWhere, StartedKernel, TaskNode
    from tfdist_nb.worker.remote import KernelSetup

    class _Call(Protocol[T]):
        def remote(self, *args: object) -> ObjectRef[T]: ...

    class NodeActor(ActorHandle[TaskNode]):
        """A :class:`TaskNode`'s actor, its methods as the launcher calls them (Ray types an
        ``ActorHandle``'s methods as Never)."""

        where: _Call[NodeWhere]
        start: _Call[StartedKernel]
        poll: _Call[tuple[int | None, bytes, int]]
        stop: _Call[tuple[int | None, str, bytes]]
        signal: _Call[None]


logger = logging.getLogger(__name__)

STRATEGIES = ("PACK", "SPREAD", "STRICT_SPREAD")
LOST = 255  # the exit code of a task whose actor or node is gone
CALL_TIMEOUT_S = 5.0  # one look at an actor (poll, where)
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # a local Ray's: the tasks pass nothing through it


def strategy_of_line(text: str) -> str:
    if text.upper() not in STRATEGIES:
        raise ValueError(f"--ray-strategy takes {', '.join(STRATEGIES)}, got {text!r}, e.g. "
                         "--ray-strategy STRICT_SPREAD (one task per node)")
    return text.upper()


def _said(exc: BaseException) -> str:
    """The first line of what Ray said."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _get(ref: ObjectRef[T], timeout: float) -> T:
    """``ray.get`` of one object reference (what an actor's method returns)."""
    import ray

    return ray.get(ref, timeout=timeout)


def _answers(host: str, port: int, timeout: float = 3.0) -> str | None:
    """None if ``host:port`` accepts a TCP connection, else why not."""
    try:
        socket.create_connection((host, port), timeout).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


@dataclass
class RayTaskHandle(TaskHandle):
    """A task's kernel, started by its Ray actor; liveness and output come through the actor."""

    actor: NodeActor = field(default=None, repr=False)  # type: ignore[assignment]
    launcher: RayLauncher = field(default=None, repr=False)  # type: ignore[assignment]
    node_id: str = ""
    log_path: Path | None = None
    offset: int = 0
    lost: str | None = None  # why the actor or its node is gone, in Ray's words
    code: int | None = None

    def _append(self, text: bytes) -> None:
        if text and self.log_path is not None:
            with open(self.log_path, "ab") as f:
                f.write(text)

    async def poll(self) -> int | None:
        if self.lost is not None or self.code is not None:
            return LOST if self.lost is not None else self.code
        import ray

        try:
            code, text, self.offset = await asyncio.to_thread(
                _get, self.actor.poll.remote(self.offset), CALL_TIMEOUT_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.ActorUnavailableError):
            self.lost = await asyncio.to_thread(self.launcher.node_gone, self.node_id)
            return None if self.lost is None else LOST
        except ray.exceptions.RayError as exc:
            gone = await asyncio.to_thread(self.launcher.node_gone, self.node_id)
            self.lost = gone or f"its Ray actor died ({_said(exc)})"
            return LOST
        self._append(text)
        self.code = code
        return code

    def describe_exit(self, code: int) -> str:
        if self.lost is not None:
            return f"was lost with Ray node {self.host}: {self.lost}"
        return f"{super().describe_exit(code)} on Ray node {self.host}"

    async def interrupt(self) -> None:
        import signal

        self.actor.signal.remote(signal.SIGINT)

    async def stop(self, grace_s: float) -> StopReport:
        start, path = self.close_channels(), StopPath.ALREADY_DEAD
        if self.lost is None and self.code is None:
            import ray

            try:
                code, how, tail = await asyncio.to_thread(
                    _get, self.actor.stop.remote(grace_s, self.offset), grace_s + 15.0)
                self._append(tail)
                self.code = code
                path = {"request": StopPath.REQUEST, "kill": StopPath.KILL}.get(
                    how, StopPath.ALREADY_DEAD)
            except ray.exceptions.RayError as exc:  # the actor is stuck or gone: end it
                self.lost = f"its Ray actor did not stop the kernel ({_said(exc)})"
                with contextlib.suppress(Exception):
                    ray.kill(self.actor)
                path = StopPath.KILL
        code = LOST if self.lost is not None else self.code
        return StopReport(str(self.task), path, code, time.monotonic() - start)


class RayLauncher(Launcher):
    """One Ray actor per task in a placement group; the actors start the tasks' kernels."""

    name = "ray"
    remote = True
    gpu_placement = Placement.SCHEDULER  # --gpus-per-task N is asked of Ray (num_gpus)
    no_hosts = ("launcher='ray' places tasks where Ray's placement group puts them; drop hosts= "
                "and name the cluster with launcher_options={'address': 'ray://head:10001'}")
    line_options = (
        LauncherOption("--ray-address", "address", metavar="ADDR",
                       help="for --launcher ray (implied): the Ray cluster, e.g. "
                            "ray://head:10001 (Ray Client); default $RAY_ADDRESS, else a local "
                            "Ray started and stopped with the cluster"),
        LauncherOption("--ray-strategy", "strategy", metavar="PACK|SPREAD|STRICT_SPREAD",
                       parse=strategy_of_line,
                       help="for --launcher ray (implied): how the placement group places the "
                            "tasks on Ray's nodes (default SPREAD)"),
    )

    def __init__(self, address: str | None = None, strategy: str = "SPREAD",
                 cpus_per_task: float = 1.0, place_timeout: float = 60.0,
                 ready_timeout: float = 120.0, **_: object) -> None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ValueError("the ray launcher needs Ray in the notebook's environment: "
                             "pip install 'tfdist-nb[ray]' (the same Ray version as the "
                             "cluster's)")
        self.address = address or None
        self.strategy = strategy_of_line(strategy)
        if cpus_per_task <= 0:
            raise ValueError("cpus_per_task must be positive (Ray CPUs per task), e.g. 1")
        self.cpus = float(cpus_per_task)
        self.gpus = 0
        self.place_timeout = place_timeout
        self.ready_timeout = ready_timeout
        self.own_ray = False  # this launcher started or connected Ray, and ends that
        self.pg: PlacementGroup | None = None
        self.actors: dict[TaskId, NodeActor] = {}
        self.found: dict[TaskId, NodeWhere] = {}
        self.token = secrets.token_hex(4)

    def line_values(self) -> dict[str, object]:
        return {"address": self.address, "strategy": self.strategy}

    def ask_gpus(self, per_task: int) -> bool:
        self.gpus = per_task
        return True

    def base_environment(self) -> dict[str, str]:
        return forwarded_environment()  # CUDA_VISIBLE_DEVICES is Ray's on each node

    def env_rows(self) -> dict[str, tuple[str, dict[str, str]]]:
        """Ray's version in the notebook and on each task's node (what its actor runs)."""
        import ray

        return {"ray": (ray.__version__, {str(t): str(f.get("ray")) for t, f in
                                          self.found.items()})}

    def network(self) -> str:
        return ("the TF ports listen on every interface of the Ray nodes, without "
                "authentication, and must be open between the cluster's nodes; the kernels' "
                "channels listen on their nodes' addresses, CurveZMQ-encrypted and signed, "
                "reached by the notebook directly (docs/security.md, Ray launcher)")

    # ------------------------------------------------------------------ Ray
    def _target(self) -> str | None:
        return self.address or os.environ.get("RAY_ADDRESS") or None

    def _connect(self, n_tasks: int) -> None:
        import ray

        if ray.is_initialized():  # the notebook's own connection (or ours, from before)
            return
        target = self._target()
        if target and target not in ("auto", "local"):
            host, _, port = target.removeprefix("ray://").rpartition(":")
            why = _answers(host, int(port)) if port.isdigit() else "no port in the address"
            if why:
                raise ClusterStartError(f"the Ray cluster at {target} does not answer ({why}); "
                                        "start it (ray start --head) or give its address, e.g. "
                                        "--ray-address ray://head:10001")
        with contextlib.suppress(Exception):  # Ray keeps the first token it read for the
            from ray._raylet import (  # type: ignore[attr-defined]  # process: this one's
                AuthenticationTokenLoader,
            )

            AuthenticationTokenLoader.instance().reset_cache()
        options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
        if not target:
            options.update(num_cpus=max(os.cpu_count() or 1, int(n_tasks * self.cpus + 0.999)),
                           include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES)
        hook = os.environ.get("PYTHONBREAKPOINT")  # ray.init() points it at Ray's debugger,
        try:  # which fails outside a Ray worker: the notebook's breakpoint() stays its own
            for attempt in range(1, SPAWN_TRIES + 1):
                try:
                    ray.init(target, **options)
                    break
                except Exception as exc:
                    text = str(exc)
                    if spawn_failed(text) and attempt < SPAWN_TRIES:  # a new connection gets
                        with contextlib.suppress(Exception):  # a new server (docs/remote.md)
                            ray.shutdown()
                        continue
                    if (differ := version_mismatch(text, target or "local")) is not None:
                        raise ClusterStartError(differ) from None
                    said = " ".join(text.split())[:800]
                    raise ClusterStartError(f"cannot connect to Ray at {target or 'a local Ray'}"
                                            f"{spawn_failed(text, attempt)}: {said}") from None
        finally:
            if hook is None:
                os.environ.pop("PYTHONBREAKPOINT", None)
            else:
                os.environ["PYTHONBREAKPOINT"] = hook
        self.own_ray = True

    def _unplaceable(self, n: int, ask: dict[str, float]) -> str | None:
        """Why the live nodes cannot hold ``n`` bundles of ``ask`` under the strategy, or None:
        fails at once rather than at the placement timeout."""
        import ray

        nodes = [node for node in ray.nodes() if node.get("Alive")]
        fits = [min(int(node["Resources"].get(k, 0) // v) for k, v in ask.items())
                for node in nodes]
        room = sum(min(f, 1) for f in fits) if self.strategy == "STRICT_SPREAD" else sum(fits)
        if room >= n:
            return None
        has = "; ".join(f"{node['NodeManagerAddress']}: "
                        + ", ".join(f"{k} {node['Resources'].get(k, 0):g}" for k in ask)
                        for node in nodes) or "no live node"
        one = ", ".join(f"{k} {v:g}" for k, v in ask.items())
        return (f"Ray cannot place {n} task(s) of {{{one}}} each with strategy {self.strategy} "
                f"(room for {room}); the cluster's live nodes have {has}")

    def _place(self, tasks: Sequence[TaskId]) -> None:
        import ray
        from ray.util.placement_group import placement_group, placement_group_table

        bundle = {"CPU": self.cpus, **({"GPU": float(self.gpus)} if self.gpus else {})}
        if (why := self._unplaceable(len(tasks), bundle)) is not None:
            raise ClusterStartError(why)
        self.pg = placement_group([dict(bundle) for _ in tasks], strategy=self.strategy,
                                  name=f"tfdist-{self.token}")
        if not self.pg.wait(self.place_timeout):
            state = placement_group_table(self.pg).get("state", "?")
            free = {k: v for k, v in ray.available_resources().items() if k in bundle}
            self.release()
            raise ClusterStartError(f"Ray did not place the placement group of {len(tasks)} "
                                    f"task(s) ({self.strategy}) within {self.place_timeout:.0f}s "
                                    f"(state {state}); free now: {free}")
        for index, task in enumerate(tasks):
            self.actors[task] = self._actor(task, index)

    def _actor(self, task: TaskId, index: int) -> NodeActor:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from tfdist_nb.worker.ray_node import TaskNode

        assert self.pg is not None  # placed first (_place)
        return cast("NodeActor", ray.remote(TaskNode).options(
            num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=index)).remote(str(task)))

    def node_gone(self, node_id: str) -> str | None:
        """Why the Ray node is gone (Ray's death reason, or its raylet not answering); None
        while it is alive and answers."""
        with contextlib.suppress(Exception):
            for node in __import__("ray").nodes():
                if node["NodeID"] != node_id:
                    continue
                if not node.get("Alive"):
                    return (f"Ray marked the node dead ({node.get('DeathReasonMessage') or ''}"
                            ")").replace(" ()", "")
                why = _answers(node["NodeManagerAddress"], int(node["NodeManagerPort"]))
                return None if why is None else f"its raylet does not answer ({why})"
        return None

    # ------------------------------------------------------------------ launcher
    def tf_addresses(self, tasks: Sequence[TaskId],
                     avoid: Mapping[TaskId, str] | None = None) -> dict[TaskId, str]:
        import ray

        self._connect(len(tasks))
        if self.pg is None or set(self.actors) != set(tasks):
            self.release(keep_ray=True)
            self._place(tasks)
        ports = [int(a.rpartition(":")[2]) for a in (avoid or {}).values()]
        try:
            found: list[NodeWhere] = ray.get(
                [self.actors[t].where.remote(ports) for t in tasks], timeout=self.ready_timeout)
        except ray.exceptions.RayError as exc:
            raise ClusterStartError(f"the tasks' Ray actors did not start: {_said(exc)}") from None
        self.found = dict(zip(tasks, found, strict=True))
        nodes = sorted({f["address"] for f in found})
        print(f"tfdist_nb: Ray {self._target() or '(local)'}: {len(tasks)} task(s) placed "
              f"{self.strategy} on {', '.join(nodes)}; {self.network()}", flush=True)
        if (theirs := {f["ray"] for f in found}) != {ray.__version__}:
            print(f"tfdist_nb: WARNING: Ray {', '.join(sorted(theirs))} on the nodes, "
                  f"{ray.__version__} here (%tfdist_env shows each task's)", flush=True)
        return {t: f"{f['address']}:{f['port']}" for t, f in self.found.items()}

    async def start(self, launch: TaskLaunch) -> TaskHandle:
        import ray

        where = self.found[launch.task]
        setup: KernelSetup = {"key": secrets.token_hex(32), "env": dict(launch.env),
                              "cwd": launch.cwd}
        actor = self.actors[launch.task]
        info: StartedKernel
        try:
            info = await asyncio.to_thread(_get, actor.start.remote(setup),
                                           self.ready_timeout)
        except ray.exceptions.RayActorError:  # died with its kernel or node: one more actor
            actor = await asyncio.to_thread(self._replace, launch)
            info = await asyncio.to_thread(_get, actor.start.remote(setup),
                                           self.ready_timeout)
        except ray.exceptions.RayError as exc:
            raise ClusterStartError(f"{launch.task} on Ray node {where['address']}: "
                                    f"{_said(exc)}") from None
        client = AsyncKernelClient()
        channels = {k: v for k, v in info.items() if k != "pid"}
        client.load_connection_info(channels)  # type: ignore[arg-type]  # KernelConnectionInfo
        return RayTaskHandle(task=launch.task, host=where["address"], pid=info["pid"],
                             client=client, actor=actor, launcher=self,
                             node_id=where["node_id"], log_path=launch.log_path)

    def _replace(self, launch: TaskLaunch) -> NodeActor:
        """A new actor in the task's bundle; refused when Ray moved the bundle to another
        node than the one its TF_CONFIG names."""
        index = list(self.actors).index(launch.task)
        self.actors[launch.task] = actor = self._actor(launch.task, index)
        now: NodeWhere = _get(actor.where.remote([]), self.ready_timeout)
        was = self.found[launch.task]["address"]
        cfg = json.loads(launch.env.get("TF_CONFIG", "{}") or "{}")
        if now["address"] != was and cfg:
            raise ClusterStartError(f"{launch.task}'s Ray node {was} is gone and Ray placed its "
                                    f"bundle on {now['address']}; restart the cluster "
                                    "(%%tfcluster --restart) for a TF_CONFIG of the new nodes")
        self.found[launch.task] = {**now, "port": self.found[launch.task]["port"]}
        return actor

    def release(self, keep_ray: bool = False) -> None:
        """Kill the actors, remove the placement group (gone from Ray's tables on return), and
        end the Ray this launcher started or connected."""
        with contextlib.suppress(ImportError):
            import ray
            from ray.util.placement_group import placement_group_table, remove_placement_group

            if not ray.is_initialized():
                return
            for actor in self.actors.values():
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            if self.pg is not None:
                with contextlib.suppress(Exception):
                    remove_placement_group(self.pg)
                deadline = time.monotonic() + 15.0
                while time.monotonic() < deadline:
                    with contextlib.suppress(Exception):
                        if placement_group_table(self.pg).get("state") == "REMOVED":
                            break
                    time.sleep(0.1)
            self.actors, self.pg, self.found = {}, None, {}
            if self.own_ray and not keep_ray:
                ray.shutdown()
                self.own_ray = False
