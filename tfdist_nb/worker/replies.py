"""What the worker agent's RPC calls answer, typed once for both ends (docs/design.md, "Calls
into the worker agent"): the worker returns these, :mod:`tfdist_nb.cluster.agent_client` reads
them. JSON crosses between them, so every field is a JSON value. Pure: no imports beyond typing,
so the controller may import it (the worker side imports nothing of the controller).
"""

from __future__ import annotations

from typing import Any, TypedDict


class TaskInfo(TypedDict):
    """``describe``: who and where the task is, after importing what it preloads (the start-up
    handshake; the controller keeps it as ``TaskRuntime.info``)."""

    pid: int
    host: str
    python: str
    executable: str
    task: list[Any] | None  # [role, index]
    tf_config: str | None
    tensorflow: str | None
    keras: str | None
    tf_keras: str | None
    keras_flavour: str | None
    numpy: str | None
    os: str
    port: int | None
    port_free: bool | None
    gpus: str | None  # CUDA_VISIBLE_DEVICES as given (docs/reference.md, GPUs)
    imported: dict[str, str | None]
    instrumentation_errors: dict[str, str]


class HowAdopted(TypedDict):
    warm_s: float | None
    low_priority_threads: int  # threads whose priority stayed low (idle TF helpers)


class Adopted(TaskInfo):
    """``adopt``: a spare became the task; what ``describe`` says, plus how it was warmed."""

    adopted: HowAdopted


class Warmed(TypedDict):
    """``warm``: a spare imported its preload."""

    pid: int
    executable: str
    imported: dict[str, str | None]
    warm_s: float


class _Where(TypedDict):
    kind: str  # "tensorflow" | "python" | "idle" | "unknown"
    at: str


class Where(_Where, total=False):
    """Where a thread stands: inside TensorFlow, in Python, idle; ``line`` is the user's own
    line that led there (``cell N line L``), when it is in a cell."""

    line: str | None


class Stacks(TypedDict):
    """``stacks``: every thread's Python stack by name (the main thread first), where the main
    thread stands, and the threads inside a TensorFlow op."""

    threads: dict[str, str]
    main: Where
    in_tf: list[str]


class LastException(TypedDict):
    """``last_exception``: what the task's last failing cell raised (its innermost frame)."""

    ename: str
    evalue: str
    where: str


class TfConfigView(TypedDict):
    """``tf_config_view``: TF_CONFIG as the task sees it, whether each cluster host resolves
    there (``"ok"`` or why not) and the state of its port(s), a ``PortState`` word each."""

    host: str
    tf_config: str | None
    resolve: dict[str, str]
    ports: dict[str, str]


class PeerReach(TypedDict):
    """``connect_peers``: whether the task connected to one peer's TF port, how fast, or why
    not."""

    ok: bool
    ms: float | None
    error: str | None


class EnvReport(TypedDict):
    """``env_report``: the task's environment, its properties and installed distributions."""

    props: dict[str, Any]
    packages: dict[str, str]
