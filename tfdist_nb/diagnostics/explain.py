"""Known TensorFlow failures recognised from a task's error, explained with their fix
(docs/design.md, Facts); shown above the task's traceback, so the cause is read first."""

from __future__ import annotations

from tfdist_nb.ledger_runs import RELEASED_ERRORS

KERAS3_MWMS = (
    "Keras 3 `model.fit` does not work under MultiWorkerMirroredStrategy (keras-team/keras#20585): "
    "it hands a PerReplica value to an op that expects a tensor. Fix: use tf_keras by starting "
    "the tasks with TF_USE_LEGACY_KERAS=1, e.g. `%%tfcluster 2 workers --env "
    "TF_USE_LEGACY_KERAS=1` (or Cluster(env={'TF_USE_LEGACY_KERAS': '1'})), and build the model "
    "with `tf.keras`; or write a custom loop with `strategy.run`."
)
STRATEGY_NOT_FIRST = (
    "The distribution strategy must be created before any other TensorFlow op in the process, "
    "and a second strategy needs a fresh process. Restart the tasks and create the strategy "
    "first: `%%tfcluster --restart` (or cluster.restart())."
)
CLUSTER_PEER_GONE = (
    "A peer task of this collective is gone or unreachable. Find the task that crashed or hung "
    "(`%tfdist_status --table`), then restart all tasks (`%%tfcluster --restart`): after a failed "
    "collective the others cannot continue either."
)


PORT_TAKEN = (
    "TensorFlow could not listen on this task's TF port (the one in its TF_CONFIG): another "
    "program holds it, most often another notebook's cluster on this host's network that drew "
    "the same free port. %tfdist_restart moves every task to fresh ports; clusters on their "
    "private network (launcher_options={'net': 'private'}, the default where this machine "
    "allows it) never clash.")


#: what a task's error says when it had no route out or no resolver (errno 101, EAI_AGAIN,
#: EAI_NONAME, EAI_NODATA), in Python's and in Keras' ``get_file`` wording
NETWORK_GONE = ("Network is unreachable", "[Errno 101]", "Temporary failure in name resolution",
                "[Errno -3]", "Name or service not known", "[Errno -2]",
                "No address associated with hostname", "[Errno -5]")


def network_gone(evalue: str) -> bool:
    """Whether an error is the task's outbound network missing (no route, no resolver)."""
    return any(sign in evalue for sign in NETWORK_GONE)


def explain_network(cause: str, cure: str) -> str:
    """A network error's explanation, when the launcher's choice took the tasks' outbound
    network (``Launcher.network_trouble``): the cause first, then the cure."""
    return f"This task has no outbound network here: {cause}. Fix: {cure}."


#: what a collective aborted under a second strategy in the same process says
SECOND_STRATEGY_ABORT = ("BufRendezvous", "Collective ops is aborted by")
SECOND_STRATEGY = (
    "This task made a second MultiWorkerMirroredStrategy in the same process (said in an alert "
    "when it was made): TensorFlow configures collective ops once per process, and collectives "
    "under a later strategy can be aborted like this. Fix: restart the tasks (`%%tfcluster "
    "--restart`, or cluster.restart()) and make the strategy once per process, in a cell of "
    "its own.")


def explain_second_strategy(evalue: str) -> str | None:
    """A collective's abort explained by a second strategy the task made (the caller knows it
    did: ``events.Finding.SECOND_STRATEGY``)."""
    return SECOND_STRATEGY if any(sign in evalue for sign in SECOND_STRATEGY_ABORT) else None


def explain(ename: str, evalue: str, keras_flavour: str | None = None) -> str | None:
    """A short explanation with the fix for a recognised error, else None."""
    if "aborted by: tfdist_nb" in evalue:
        return None  # our own release of a stuck collective: the run report says why
    if "PerReplica" in evalue and ename in ("ValueError", "TypeError") and (
        keras_flavour in (None, "keras 3")
    ):
        return KERAS3_MWMS
    if "Collective ops must be configured at program startup" in evalue or (
        "configure_collective_ops" in evalue
    ):
        return STRATEGY_NOT_FIRST
    if "Could not start gRPC server" in evalue:
        return PORT_TAKEN
    if ename in RELEASED_ERRORS and (
        "unhealthy" in evalue or "Connection refused" in evalue or "collective" in evalue.lower()
    ):
        return CLUSTER_PEER_GONE
    return None
