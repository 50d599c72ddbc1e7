"""What a task's agent publishes about itself once a second (``worker.telemetry``), typed once
for both ends (docs/reference.md, "GPU readings"; docs/design.md, "Telemetry on the kernel's own
iopub"). JSON crosses between them: pure, no imports beyond typing and the ledger's rows, so the
worker side and the controller's diagnostics both read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypedDict, cast

from tfdist_nb.ledger_runs import LedgerDrain

#: ``[step, begin, duration_ms, input_wait_ms, arrival, local_fetch_ms, sync_entries]``: per
#: position its own type (``input_wait_ms`` and ``local_fetch_ms`` may be None, the last is the
#: times the task entered the step's collectives), as a JSON array
StepRow = list[float | list[float] | None]


class GpuStatic(TypedDict):
    """What a GPU reading says of the board, read once (``worker.gpu.GpuReader``)."""

    uuid: str | None
    name: str | None
    mem_total_mb: float | None
    sm_clock_max_mhz: float | None
    power_limit_w: float | None
    pcie_gen_max: int | None
    pcie_width_max: int | None


class GpuReading(GpuStatic):
    """One GPU's part of a sample; a query the board or driver does not answer is None."""

    index: int
    util_percent: float | None
    mem_used_mb: float | None
    task_mem_mb: float | None  # the task's own processes', where NVML tells them apart
    temperature_c: float | None
    sm_clock_mhz: float | None
    power_w: float | None
    throttle: list[str] | None  # clock event reasons now (worker.gpu.CLOCK_EVENT_REASONS)
    throttle_ms: dict[str, float] | None  # per reason, how long it held the clocks down
    pcie_gen: int | None
    pcie_width: int | None
    pcie_replays: int | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    xid: list[int] | None  # the XID codes reported since the task began


class MemoryReading(TypedDict):
    """The memory limit on a task and what it counts against it (``Telemetry._memory``)."""

    mem_limit_mb: float | None
    mem_limit_source: str | None  # "injected" | "cgroup" | "rlimit"
    mem_limit_used_mb: float | None
    oom_kills: int | None  # counted in its memory cgroup
    mem_cgroup: str | None  # that cgroup's directory


class Resources(MemoryReading):
    """A resource reading (``Telemetry.resources``): the task's process, its host, its GPUs."""

    cpu_percent: float
    rss_mb: float
    threads: int
    host_cpu_percent: float
    load1: float
    cpus: int | None
    host_mem_total_mb: float
    host_mem_available_mb: float
    net_rx_mb_s: float | None  # None at the first reading
    net_tx_mb_s: float | None
    net_scope: str  # "host" | "cluster-netns" | "task-netns" (worker.telemetry.net_scope)
    gpus: list[GpuReading] | None  # None: no GPU
    gpu_reason: str | None  # why there is none


class _NoteExtras(TypedDict, total=False):
    finding: str  # an events.Finding
    facts: Mapping[str, object]  # what it saw, as JSON values


class Note(_NoteExtras):
    """A finding a task sends with its next sample (``Telemetry.note``)."""

    text: str
    level: str


class _SampleExtras(TypedDict, total=False):
    notes: list[Note]
    ledger: LedgerDrain
    instrumentation_errors: dict[str, str]  # per patch that could not be installed


class Sample(Resources, _SampleExtras):
    """One heartbeat (``kind`` "sample"): the last resource reading, the step count and the
    steps recorded since the last one."""

    kind: Literal["sample"]
    seq: int  # from 1 in each process: lower than the last means a new process
    time: float
    step: int
    total_steps: int | None
    steps: list[StepRow]


class LedgerMessage(TypedDict):
    """The ledger's rows sent alone, between samples, when a collective waits."""

    kind: Literal["ledger"]
    time: float
    ledger: LedgerDrain
    step: int


TelemetryMessage = Sample | LedgerMessage


def sample_gpus(sample: Mapping[str, object] | None) -> list[GpuReading]:
    """A sample's GPU readings as received: the records, none when it has no list of them."""
    gpus = (sample or {}).get("gpus")
    if not isinstance(gpus, list):
        return []
    # the worker's records (GpuReader.read), checked to be records: they came as JSON
    return [cast(GpuReading, g) for g in gpus if isinstance(g, dict)]
