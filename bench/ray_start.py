"""Start-to-TF-ready of 2 tasks through the Ray launcher vs the SSH launcher, on the same two test
hosts (tests/ray_cluster.py: network namespaces on a bridge, each with sshd and a Ray node).

    python -m bench.ray_start [--repeat 3] [--json PATH]

"TF-ready" is what ``Cluster.start()`` returns after (every task imported TensorFlow). The Ray
side connects through Ray Client (``ray://HEAD:10001``) and places a SPREAD placement group;
the SSH side probes each host and opens one SSH connection per task. The order alternates
between repeats. Needs root (the hosts), like the tests that make them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests import ray_cluster
from tfdist_nb import Cluster


def once(kind: str, ray2: ray_cluster.RayCluster) -> float:
    """Seconds from ``Cluster(...).start()`` to its return, 2 workers on the two hosts."""
    if kind == "ray":
        options: dict[str, Any] = {"launcher": "ray",
                                   "launcher_options": {"address": ray2.client_address}}
    else:
        options = {"launcher": "ssh", "hosts": ray2.hosts.aliases,
                   "launcher_options": {"ssh_config": ray2.hosts.ssh_config}}
    c = Cluster(workers=2, warm=False, **options)
    began = time.monotonic()
    try:
        try:
            c.start()
        except Exception:
            if kind == "ray":
                print(ray2.client_server_logs(), file=sys.stderr, flush=True)
            raise
        took = time.monotonic() - began
        hosts = set(c.status()["host"])
        assert len(hosts) == 2, f"{kind}: both tasks on {hosts}"
    finally:
        c.stop()
    return took


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ray_start")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if reason := ray_cluster.available():
        raise SystemExit(f"bench.ray_start: {reason}")
    with tempfile.TemporaryDirectory(prefix="tfd-bench-ray-") as tmp:
        made = time.monotonic()
        ray2 = ray_cluster.make_ray(Path(tmp))
        up = time.monotonic() - made
        os.environ.update(ray2.auth)  # the cluster's token, as its users set it
        times: dict[str, list[float]] = {"ray": [], "ssh": []}
        try:
            for i in range(args.repeat):
                for kind in (("ray", "ssh") if i % 2 == 0 else ("ssh", "ray")):
                    times[kind].append(once(kind, ray2))
        finally:
            ray2.remove()
    result = {"ray_cluster_up_s": round(up, 1),
              **{k: {"median_s": round(statistics.median(v), 2), "runs_s": [round(x, 2)
                                                                            for x in v]}
                 for k, v in times.items()}}
    result["ray_vs_ssh"] = round(result["ray"]["median_s"] / result["ssh"]["median_s"], 2)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
