"""``%tfdist_export DIR`` (docs/reference.md, Reproduce): a standalone reproducer of what a
cluster ran, to run outside Jupyter or share.

``train.py`` holds the cells the cluster ran, in order, without notebook machinery: cells for
every task inline, cells for some tasks guarded by the task's name, IPython magics and shell
escapes turned into comments, ``tfdist_nb.worker`` helpers kept (no-ops when tfdist_nb is not
installed). ``launch.sh`` starts the same tasks on this machine with the same TF_CONFIG layout
(fresh free ports) and the cluster's ``env``, prefixes every output line with its task, waits
for all and exits non-zero when any task failed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from tfdist_nb import redaction
from tfdist_nb.events import CellRecord, Restart, RestartRecord
from tfdist_nb.store.rundir import foreign, replace_private
from tfdist_nb.topology import ClusterSpec

if TYPE_CHECKING:
    pass

_MAGIC = re.compile(r"^(\s*)([%!].*)$")

TRAIN_HEADER = '''#!/usr/bin/env python
"""Reproducer exported by tfdist_nb from cluster {cluster_id} ({spec}) on {date}.

Run every task with launch.sh beside this file, or one task by hand with TF_CONFIG and
TFDIST_TASK set. Each "cell" below is one cell the cluster ran, in order.
"""
import json
import os

try:
    import tfdist_nb.worker as tw  # step timing and fault helpers used by the cells
except ImportError:  # without tfdist_nb they do nothing
    import contextlib as _contextlib
    import types as _types

    tw = _types.SimpleNamespace(step=_contextlib.nullcontext, timed=lambda d: d,
                                set_total_steps=lambda n: None, steps_done=lambda: 0,
                                StepTimer=None)
    _cfg = json.loads(os.environ.get("TF_CONFIG", "{{}}")).get("task", {{}})
    tw.task = (_cfg.get("type"), _cfg.get("index")) if _cfg else None

TASK = os.environ.get("TFDIST_TASK") or "{{}}:{{}}".format(*(tw.task or ("?", "?")))
'''


# The first lines of what export writes: a file that begins otherwise is the user's own
OURS = {"train.py": '#!/usr/bin/env python\n"""Reproducer exported by tfdist_nb',
        "launch.sh": "#!/usr/bin/env bash\n# Exported by tfdist_nb",
        "report.md": "# tfdist_nb report"}  # written by cluster/report.py
MODES = {"train.py": 0o600, "launch.sh": 0o700}  # the cells (and their secrets) stay private


class ExportError(ValueError):
    """The reproducer cannot be written where asked (the reason in words)."""


class SecretsWarning(UserWarning):
    """The exported files carry what look like secrets (named, never shown)."""


def export(directory: str | os.PathLike[str], *, cluster_id: str, spec: ClusterSpec,
           cells: list[CellRecord], env: Mapping[str, str], python: str,
           restarts: Iterable[float] = (), default_targets: list[str] | None = None,
           force: bool = False, task_env: Mapping[str, Mapping[str, str]] | None = None) -> Path:
    """Write ``train.py`` (0600) and ``launch.sh`` (0700) into ``directory`` (created
    owner-only when new); ``restarts``: times at which all tasks were restarted (marked between
    cells); ``task_env``: each task's own variables (its GPUs). A file of those names that
    export did not write is left alone (ExportError) unless ``force``; a symlink is never
    followed. What looks like a secret in the cells or ``env``
    is named in a ``SecretsWarning``."""
    out = Path(directory)
    texts = {"train.py": train_script(cluster_id, spec, cells, list(restarts)),
             "launch.sh": launch_script(spec, env, python, default_targets, task_env)}
    try:
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ExportError(f"cannot make the directory {out}: {exc.strerror or exc}") from None
    if (why := foreign(out)) is not None:
        raise ExportError(f"{out} is not yours to write into ({why}): give a directory of "
                          "your own")
    if not force:
        for name in texts:
            if not ours_or_absent(out / name):
                raise ExportError(f"{out / name} exists and was not written by %tfdist_export: "
                                  "give another directory, or --force (force=True) to replace "
                                  "it")
    for name, text in texts.items():
        write_private(out / name, text, MODES[name])
    found = secrets(cells, env)
    if found:
        warnings.warn(SecretsWarning(
            f"the reproducer in {out} (owner-only) carries what look like secrets: "
            f"{', '.join(found)}; remove them before sharing it"), stacklevel=3)
    return out


def ours_or_absent(path: Path) -> bool:
    """Whether ``path`` is free to (re)write: absent, or a regular file of this user that
    tfdist_nb wrote (``OURS``); a link, another user's file (whatever it begins with) or
    anything else in the way is not."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(200).startswith(OURS[path.name])
    except OSError:
        return False


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace ``path`` with a new file of ``text`` at ``mode`` whatever the umask: never
    written into a file that is there, never through a link (ExportError if it cannot be)."""
    try:
        replace_private(path, text, mode)
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from None


def secrets(cells: list[CellRecord], env: Mapping[str, str]) -> list[str]:
    """Where the exported files would carry a secret (docs/reference.md, Reproduce): ``env``
    names or values that look like one, and what a cell assigns to a secret name or holds in a
    secret's shape (``cell 3: api_key``, ``cell 4: URL credentials``); values never."""
    found = [f"launch.sh: {k}" for k in sorted(env) if redaction.secret_setting(k, env[k])]
    for number, cell in enumerate(cells, 1):
        for what in redaction.assignments(str(cell.get("code", ""))):
            said = f"cell {cell.get('cell', number)}: {what}"
            if said not in found:
                found.append(said)
    return found


def train_script(cluster_id: str, spec: ClusterSpec, cells: list[CellRecord],
                 restarts: list[float]) -> str:
    every = [str(t) for t in spec.tasks]
    parts = [TRAIN_HEADER.format(cluster_id=cluster_id, spec=spec,
                                 date=time.strftime("%Y-%m-%d %H:%M"))]
    pending = sorted(restarts)
    for rec in cells:
        while pending and pending[0] < rec["time"]:
            pending.pop(0)
            parts.append("# --- the tasks were restarted here (fresh processes); a "
                         "reproducer run continues in the same process ---\n")
        targets = list(rec.get("targets") or every)
        code = plain_python(rec["code"])
        if set(targets) >= set(every):
            parts.append(f"# --- cell {rec['cell']} (every task) ---\n{code.rstrip()}\n")
        else:
            names = ", ".join(repr(t) for t in targets)
            parts.append(f"# --- cell {rec['cell']} (only {', '.join(targets)}) ---\n"
                         f"_CELL_{rec['cell']} = {code.rstrip()!r}\n"
                         f"if TASK in ({names},):\n"
                         f"    exec(compile(_CELL_{rec['cell']}, 'cell {rec['cell']}', 'exec'))\n")
    return "\n".join(parts)


def plain_python(code: str) -> str:
    """A cell without notebook machinery: IPython magics and ``!`` shell escapes become
    comments saying so (the magic line tfdist_nb prepends is a comment already)."""
    lines = []
    for line in code.splitlines():
        m = _MAGIC.match(line)
        if m:
            lines.append(f"{m.group(1)}pass  # tfdist_nb export: IPython-only, left out: "
                         f"{m.group(2)}")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def launch_script(spec: ClusterSpec, env: Mapping[str, str], python: str,
                  default_targets: list[str] | None = None,
                  task_env: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """A bash script that runs every task of ``spec`` here, like the cluster did; a task's own
    variables (``task_env``: its ``CUDA_VISIBLE_DEVICES``) where ``env`` does not set them."""
    tasks = [str(t) for t in spec.tasks]
    runs = default_targets or tasks
    servers = [t for t in tasks if t not in runs]  # with ps: the servers the chief drives
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    layout = json.dumps({t.role: t.index for t in spec.tasks})
    own = {task: " ".join(f"{k}={shlex.quote(v) if v else ''}" for k, v in sorted(kv.items())
                          if k not in env)
           for task, kv in (task_env or {}).items()}
    per_task = " ".join(f"[{t}]={shlex.quote(v)}" for t, v in own.items() if v)
    return f'''#!/usr/bin/env bash
# Exported by tfdist_nb: starts the tasks of {spec} on this machine with the same TF_CONFIG
# layout as the cluster (fresh free ports), runs train.py on {", ".join(runs)}, prefixes every
# line with its task, waits for all, and exits non-zero if any task failed.
set -u
cd "$(dirname "$0")"
PYTHON="${{PYTHON:-{shlex.quote(python)}}}"
TASKS=({" ".join(tasks)})
RUNS=({" ".join(runs)})
SERVERS=({" ".join(servers)})
{exports}
declare -A TASK_ENV=({per_task})  # each task's own variables (its GPUs), as the cluster gave
# one free port per task, and each task's TF_CONFIG ({layout})
readarray -t CONFIGS < <("$PYTHON" - "${{TASKS[@]}}" <<'PY'
import json, socket, sys
tasks = sys.argv[1:]
socks = []
for _ in tasks:
    s = socket.socket(); s.bind(("localhost", 0)); socks.append(s)
ports = [s.getsockname()[1] for s in socks]
for s in socks:
    s.close()
cluster = {{}}
for task, port in zip(tasks, ports):
    role, index = task.split(":")
    cluster.setdefault(role, []).append((int(index), f"localhost:{{port}}"))
cluster = {{r: [a for _, a in sorted(v)] for r, v in cluster.items() if r != "evaluator"}}
for task in tasks:
    role, index = task.split(":")
    print(json.dumps({{"cluster": cluster, "task": {{"type": role, "index": int(index)}}}}))
PY
)
run_task() {{  # task, tf_config, command...
    local task=$1 cfg=$2; shift 2
    local own=(${{TASK_ENV[$task]:-}})
    ( set -o pipefail
      TF_CONFIG="$cfg" TFDIST_TASK="$task" env "${{own[@]}}" "$@" 2>&1 | sed -u "s/^/[$task] /" )
}}
pids=(); names=(); server_pids=()
for i in "${{!TASKS[@]}}"; do
    task=${{TASKS[$i]}}
    if [[ " ${{SERVERS[*]}} " == *" $task "* ]]; then
        run_task "$task" "${{CONFIGS[$i]}}" "$PYTHON" -u -c 'import json, os, tensorflow as tf
r = tf.distribute.cluster_resolver.TFConfigClusterResolver()
tf.distribute.Server(r.cluster_spec(), job_name=r.task_type, task_index=r.task_id,
                     protocol="grpc", start=True).join()' &
        server_pids+=($!)
    else
        run_task "$task" "${{CONFIGS[$i]}}" "$PYTHON" -u train.py &
        pids+=($!); names+=("$task")
    fi
done
failed=0
for i in "${{!pids[@]}}"; do
    if ! wait "${{pids[$i]}}"; then
        echo "launch.sh: ${{names[$i]}} failed" >&2
        failed=1
    fi
done
for pid in "${{server_pids[@]}}"; do kill "$pid" 2>/dev/null; done
exit $failed
'''


def restart_times(events: Iterable[Mapping[str, object]], every: Iterable[str]) -> list[float]:
    """When each of the tasks ``every`` was restarted together, from the run's ``Restart``
    records (by their fields, never by words)."""
    tasks = set(every)
    restarts = (cast(RestartRecord, rec) for rec in events if rec.get("kind") == Restart.kind)
    return [rec["time"] for rec in restarts if tasks <= set(rec.get("tasks") or ())]

