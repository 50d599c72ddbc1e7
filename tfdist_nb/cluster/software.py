"""Which Python, TensorFlow and Keras a cluster's tasks run, from each task's start-up
self-description (``TaskRuntime.info``), in one line: the ``%%tfcluster`` ready line with the
Keras 3 caveat (docs/design.md, Facts, "Keras 3 and MWMS"), and the warning at start when the
tasks differ."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tfdist_nb.diagnostics.env_check import CRITICAL, critical_mismatch, env_frame
from tfdist_nb.topology import ClusterSpec


def keras_summary(infos: Iterable[Mapping[str, Any]], spec: ClusterSpec) -> str:
    """Which TensorFlow and Keras the tasks (``infos``) run, with the ``fit`` caveat for Keras 3
    under the strategy a cluster of ``spec`` is for (ps tasks: ParameterServerStrategy)."""
    infos = list(infos)
    flavours = sorted({str(info.get("keras_flavour")) for info in infos})
    tf = sorted({str(info.get("tensorflow")) for info in infos})
    text = f"TF {'/'.join(tf)}, {'/'.join(flavours)}"
    if "keras 3" not in flavours:
        return text
    if spec.ps:
        text += (": model.fit under ParameterServerStrategy (DatasetCreator, "
                 "ClusterCoordinator) runs on tf_keras: TF_USE_LEGACY_KERAS=1")
    elif spec.workers + spec.chief > 1:
        text += ": model.fit under MultiWorkerMirroredStrategy needs TF_USE_LEGACY_KERAS=1"
    return text


def mismatch(infos: Mapping[str, Mapping[str, Any]]) -> str | None:
    """One sentence when the tasks (task name -> info) run different Python, TensorFlow or
    Keras: a multi-worker job breaks outright then, so it is said at start."""
    if len(infos) <= 1:
        return None
    return critical_mismatch(env_frame(
        {name: {"props": {k: info.get(k) for k in CRITICAL}} for name, info in infos.items()}))
