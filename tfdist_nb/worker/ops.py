"""The worker agent's operations by name: the one list both ends of the RPC use (the controller's
:class:`~tfdist_nb.cluster.agent_client.AgentClient` sends them, :mod:`tfdist_nb.worker.rpc`
answers them), and the words their replies are made of. Imports nothing, so the controller can
read it without loading the worker side.
"""

from __future__ import annotations

from tfdist_nb.strenum import StrEnum


class Op(StrEnum):
    DESCRIBE = "describe"  # the start-up handshake: who and where the task is
    STACKS = "stacks"
    SET_ENVIRONMENT = "set_environment"  # attached workers: TF_CONFIG and env= before any cell
    INJECT = "inject"
    ABORT_COLLECTIVES = "abort_collectives"
    SET_LOG_LEVEL = "set_log_level"
    START_TF_SERVER = "start_tf_server"
    WARM = "warm"  # spare kernels: import preload at low priority
    ADOPT = "adopt"  # a spare becomes a task
    TF_CONFIG_VIEW = "tf_config_view"  # the checks (docs/reference.md, Checks)
    OPEN_STAND_IN = "open_stand_in"
    CLOSE_STAND_INS = "close_stand_ins"
    CONNECT_PEERS = "connect_peers"
    ALLREDUCE_BANDWIDTH = "allreduce_bandwidth"
    ENV_REPORT = "env_report"
    GPU_READINGS = "gpu_readings"
    SHARDING_DESCRIBE = "sharding_describe"
    SHARDING_FINGERPRINTS = "sharding_fingerprints"
    VARIABLE_CHECKSUMS = "variable_checksums"
    SET_NUMERICS = "set_numerics"
    PROFILER_SERVER = "profiler_server"
    PROFILE_CAPTURE = "profile_capture"
    PROFILE_STATE = "profile_state"
    PROFILE_SUMMARY = "profile_summary"
    LAST_EXCEPTION = "last_exception"  # %tfdist_debug: what a post-mortem would open on


class PortState(StrEnum):
    """A TF port as a task's probe finds it (``tf_config_view``'s ``ports``): the word travels
    in the JSON reply and is said as it is (docs/reference.md, Checks)."""

    FREE = "free"
    SERVED = "served by this task"
    IN_USE = "in use"  # another process holds it: TensorFlow's server cannot bind it
