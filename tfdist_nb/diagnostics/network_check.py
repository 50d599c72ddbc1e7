"""``%tfdist_check network``: who reaches whom on the TensorFlow addresses, how fast, and what
the cluster's own all-reduce moves (pure: the probes measured it in the tasks)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from tfdist_nb.diagnostics.report import CheckReport
from tfdist_nb.topology import task_order
from tfdist_nb.worker.replies import Bandwidth, PeerReach

#: the latency table's column for the outbound path (a listener on this host's address)
OUTSIDE = "outside"


def analyse(reach: Mapping[str, Mapping[str, PeerReach]],
            stand_ins: Mapping[str, str],
            bandwidth: Bandwidth | None = None,
            outbound: Mapping[str, PeerReach] | None = None,
            outside: str = "", trouble: str | None = None) -> CheckReport:
    """``reach[src][dst]``: ``{"ok", "ms", "error"}``; ``stand_ins[task]``: whether its TF port
    was served or listened on for the check (or why not); ``bandwidth``: one task's
    all-reduce measurement; ``outbound[task]``: its connect to ``outside`` (this host's
    address beyond loopback: the way out a download takes), with ``trouble`` the launcher's
    cause and cure when its choice of network took that way."""
    tasks = sorted({*reach, *stand_ins}, key=task_order)
    latency = pd.DataFrame(index=tasks, columns=tasks + ([OUTSIDE] if outbound else []),
                           dtype="float64")
    paths = [(src, dst, got) for src, row in reach.items() for dst, got in row.items()]
    paths += [(src, OUTSIDE, got) for src, got in (outbound or {}).items()]
    failed: list[tuple[str, str, str]] = []
    for src, dst, got in paths:
        if got["ok"] and got["ms"] is not None:
            latency.loc[src, dst] = round(got["ms"], 3)
        else:
            failed.append((src, dst, str(got["error"])))
    failures = [f for f in failed if f[1] != OUTSIDE]
    cut_off = [(src, why) for src, dst, why in failed if dst == OUTSIDE]
    latency.index.name = "from \\ to"
    details = [f"{src} -> {dst}: {why}" for src, dst, why in failures]
    if cut_off:
        details.append("no way out: " + "; ".join(f"{src} cannot reach {outside} ({why})"
                                                  for src, why in cut_off) +
                       (f". Cause: {trouble}" if trouble else ""))
    elif outbound:
        details.append(f"outbound: every task reaches {outside} (this host's address beyond "
                       "loopback, the way out a download takes)")
    for task, state in stand_ins.items():
        if state not in ("served", "listening"):
            details.append(f"{task}: its TF port could not be opened for the check: {state}")
    table = latency
    fields: dict[str, Any] = {"failures": failures, "latency_ms": latency}
    if bandwidth and bandwidth.get("rows"):
        bw = pd.DataFrame(bandwidth["rows"])
        fields["bandwidth"] = bw
        details.append("all-reduce through the cluster's strategy (" +
                       f"{bandwidth.get('replicas')} replicas): " + "; ".join(
                           f"{r['size_mb']:g} MB in {r['time_ms']:.1f} ms, algbw "
                           f"{r['algbw_gb_s']:.3f} GB/s, busbw {r['busbw_gb_s']:.3f} GB/s"
                           for r in bandwidth["rows"]))
    elif bandwidth and bandwidth.get("skipped"):
        details.append(f"bandwidth not measured: {bandwidth['skipped']}")
    if cut_off and not failures:
        summary = (f"{len(cut_off)} task(s) cannot reach this host's address {outside}: no "
                   "outbound network (downloads, DNS)")
    elif failures:
        worst = _most_named(failures)
        summary = (f"{len(failures)} unreachable pair(s): " +
                   "; ".join(f"{s} -> {d} ({w})" for s, d, w in failures[:3]) +
                   (" ..." if len(failures) > 3 else "") +
                   (f"; every path to {worst} fails" if worst else ""))
    else:
        worst_ms = latency.max().max()
        summary = ("every task reaches every other task's TF address"
                   + (f" (slowest connect {worst_ms:.1f} ms)" if pd.notna(worst_ms) else ""))
    fields["outbound"] = dict(outbound or {})
    return CheckReport("network", not failures and not cut_off, summary, table, details=details,
                       fields=fields)


def _most_named(failures: list[tuple[str, str, str]]) -> str | None:
    """The task every failing path leads to, when there is one (its port or host is the
    likely cause)."""
    targets = {d for _, d, _ in failures}
    return next(iter(targets)) if len(targets) == 1 else None


