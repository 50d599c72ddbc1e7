"""What the worker agent's RPC calls answer, typed once for both ends (docs/design.md, "Calls
into the worker agent"): the worker returns these, :mod:`tfdist_nb.cluster.agent_client` reads
them. JSON crosses between them, so every field is a JSON value. Pure: no imports beyond typing,
so the controller may import it (the worker side imports nothing of the controller).
"""

from __future__ import annotations

from typing import Any, TypedDict, final


class Versions(TypedDict):
    """A task's host, interpreter, system and the versions it trains with (``describe`` and
    ``env_report`` both say them)."""

    host: str
    python: str
    executable: str
    os: str
    tensorflow: str | None
    keras: str | None
    tf_keras: str | None
    numpy: str | None
    keras_flavour: str | None


class TaskInfo(Versions):
    """``describe``: who and where the task is, after importing what it preloads (the start-up
    handshake; the controller keeps it as ``TaskRuntime.info``)."""

    pid: int
    task: list[Any] | None  # [role, index]
    tf_config: str | None
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


@final
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


class NumericsState(TypedDict):
    """``set_numerics``: whether NaN/Inf checking is on, and the Debugger V2 dump root."""

    numerics: bool
    dump_root: str | None


class CaptureState(TypedDict, total=False):
    """``profile_state``: the capture thread's state (empty before the first capture)."""

    running: bool
    logdir: str
    error: str | None


class TraceFile(TypedDict):
    events: int
    top_ms: list[tuple[str, float]]  # the busiest host ops, [op, ms] each


class ProfileSummary(TypedDict, total=False):
    """``profile_summary``: the newest capture's run directory and its trace files by name;
    ``unreadable``: the controller could not read it (why)."""

    run: str | None
    files: dict[str, TraceFile]
    unreadable: str


class _Failure(TypedDict):
    error: str


class Released(TypedDict, total=False):
    released: bool  # the controller aborted its collectives (cluster/checks.py)


@final
class Failure(_Failure, total=False):
    """A check's answer when the probe failed there (``error``), the task did not answer in
    time (``answered``: False) or was released from its collective (``released``)."""

    answered: bool
    released: bool


class BandwidthRow(TypedDict):
    size_mb: float
    time_ms: float
    algbw_gb_s: float
    busbw_gb_s: float


@final
class Bandwidth(TypedDict, total=False):
    """``allreduce_bandwidth``: best time per size through the strategy, or ``skipped``."""

    skipped: str
    replicas: int
    rows: list[BandwidthRow]
    devices: list[str]
    implementation: str | None
    released: bool


class GivenGpu(TypedDict, total=False):
    """One entry of CUDA_VISIBLE_DEVICES as NVML reads it (docs/gpus.md); an unfound one is
    ``entry``, ``found`` and ``hidden_after`` alone; None: the board does not answer."""

    entry: str
    found: bool
    hidden_after: list[str]
    mig: bool
    uuid: str
    index: int
    name: str | None
    compute_capability: str | None
    mem_total_mb: float | None
    util_percent: float | None
    pcie_gen: int | None
    pcie_gen_max: int | None
    pcie_width: int | None
    pcie_width_max: int | None
    ecc_on: bool | None
    ecc_pending_on: bool | None
    ecc_uncorrected: int | None
    retired_pending: bool | None
    remap_pending: bool | None
    remap_failure: bool | None


class NvmlView(TypedDict, total=False):
    """NVML's side of a task: ``state`` (an ``NvmlState`` word), and once it opened the
    driver, CUDA driver version, device count and the devices given."""

    state: str
    error: str | None
    driver: str | None
    cuda_driver: int | None
    count: int
    devices: list[GivenGpu]


class TfBuild(TypedDict, total=False):
    cuda_build: bool
    cuda: str | None
    cudnn: str | None
    capabilities: list[str]


class TfGpuView(TypedDict, total=False):
    """What TensorFlow sees (``gpus``, memory growth and limit per GPU) and was built for."""

    build: TfBuild
    gpus: int | None
    growth: list[bool]
    limit_mb: list[float | None]
    error: str


@final
class GpuReadings(TypedDict):
    """``gpu_readings``: a task's GPUs as given, read by NVML and seen by TensorFlow (``tf``:
    None when the task has not imported it)."""

    host: str
    cuda_visible_devices: str | None
    allow_growth_env: str | None
    nccl: str | None
    tf: TfGpuView | None
    devices: list[GivenGpu]
    nvml: NvmlView


class ShardCall(TypedDict):
    num_shards: int | None
    index: int | None
    after_unseeded_shuffle: bool


class Pipeline(TypedDict):
    """What a dataset's graph says (``graph``: False when it could not be serialized)."""

    graph: bool
    batched: bool | None
    shards: list[ShardCall]
    unseeded_shuffle: bool | None
    file_based: bool | None
    files: int | None
    readers: list[str]


class Described(TypedDict, total=False):
    """``sharding_describe``: what EXPR is in the task, nothing read (or ``error``)."""

    error: str
    kind: str  # "dataset" | "distributed"
    made_by: str
    strategy_name: str
    workers: int | None
    replicas: int | None
    policy: str | None
    pipeline: Pipeline


class _Read(TypedDict):
    examples: int
    steps: int
    counts: dict[str, int]  # fingerprint -> how many times read
    previews: dict[str, str]
    cut: str | None  # the bound that cut the reading short
    seconds: float


@final
class Read(_Read, total=False):
    """A task's read of a dataset (``sharding_fingerprints``); ``reference``: the
    undistributed dataset's read, or why none (``skipped``, ``error``)."""

    unbatched: bool
    kind: str
    origin: str
    reference: Read | Failure | Skipped
    released: bool


@final
class Skipped(TypedDict):
    skipped: str


class _VariableRow(TypedDict):
    name: str
    dtype: str
    shape: list[int]
    size: int
    sha: str  # of dtype, shape and bytes


class VariableRow(_VariableRow, total=False):
    """One variable's checksums; numbers only for numeric dtypes, ``values`` when small."""

    nonfinite: int
    sum: float
    sumsq: float
    min: float
    max: float
    samples: list[tuple[int, float | str]]  # [position, value]; NaN/Inf as text
    values: list[float | str]
    mirrored: bool
    variable_type: str


class Checksums(TypedDict, total=False):
    """``variable_checksums``: EXPR's variables as the task holds them (or ``error``)."""

    error: str
    variables: list[VariableRow]
    strategy: str | None
