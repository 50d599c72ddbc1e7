"""The cluster core: the Cluster facade, task state machine, TF_CONFIG, run orchestration."""
