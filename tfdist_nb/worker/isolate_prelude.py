# tfdist_nb isolate: how this variant changes the cells' TensorFlow (docs/shrink-and-isolate.md).
# %tfdist_isolate runs this text as the first cell of every task of a variant, with the VARIANT
# line set; an exported variant runs it in train.py, without tfdist_nb. It is plain TensorFlow.
# Imported as a module it does nothing.
VARIANT = {"strategy": "multi_worker", "devices": 1, "eager": False, "implementation": None,
           "collective_timeout_s": None, "as_task": None}


def _tfdist_isolate(variant):
    """Apply ``variant`` to this process:

    - ``as_task``: ``[type, index, cluster]`` to take that task's identity (TF_CONFIG and
      TFDIST_TASK) in a process that runs alone: its share of the data, its code paths.
    - ``strategy``: ``multi_worker`` keeps MultiWorkerMirroredStrategy (with the collective
      timeout and implementation below); ``local`` makes it a MirroredStrategy on this task's
      own devices, with no cross-task collectives, that reads the task's share of the data as
      the multi-worker strategy would (``tf.distribute.InputContext`` and auto-sharding by
      TF_CONFIG); ``mirrored`` a MirroredStrategy on ``devices`` logical CPU devices (or the
      local GPUs) that reads all the data: the job's replicas in one process.
    - ``eager``: ``tf.config.run_functions_eagerly(True)``.
    """
    import contextlib
    import json
    import os

    import tensorflow as tf

    if variant["as_task"]:
        role, index, cluster = variant["as_task"]
        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                              "task": {"type": role, "index": index}})
        os.environ["TFDIST_TASK"] = f"{role}:{index}"
        globals()["TASK"] = f"{role}:{index}"  # an exported train.py's own name for the task
        try:
            import tfdist_nb.worker as tw
            tw.task = (role, index)
        except ImportError:
            pass
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster, task = config.get("cluster", {}), config.get("task", {})
    chiefs = len(cluster.get("chief", []))
    pipelines = max(1, chiefs + len(cluster.get("worker", [])))
    pipeline = (task.get("index", 0) + (chiefs if task.get("type") == "worker" else 0)
                if task.get("type") in ("chief", "worker") else 0)
    if variant["eager"]:
        tf.config.run_functions_eagerly(True)

    multi_worker = tf.distribute.MultiWorkerMirroredStrategy

    def options_for(given):
        implementation = {"ring": tf.distribute.experimental.CommunicationImplementation.RING,
                          "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
                          "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                          }.get(variant["implementation"] or "")
        if given is None and implementation is None and not variant["collective_timeout_s"]:
            return None
        return tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=getattr(given, "bytes_per_pack", 0),
            timeout_seconds=(getattr(given, "timeout_seconds", None)
                             or variant["collective_timeout_s"]),
            implementation=implementation or getattr(
                given, "implementation",
                tf.distribute.experimental.CommunicationImplementation.AUTO))

    class TimedMultiWorkerMirroredStrategy(multi_worker):
        """MultiWorkerMirroredStrategy whose collectives time out (and use the variant's
        implementation)."""

        def __init__(self, cluster_resolver=None, communication_options=None):
            super().__init__(cluster_resolver=cluster_resolver,
                             communication_options=options_for(communication_options))

    wanted = max(1, int(variant["devices"]))
    split_cpu = wanted > 1 and not tf.config.list_physical_devices("GPU")
    if split_cpu:  # now, before a cell starts TensorFlow's runtime (then it could not be done)
        cpu = tf.config.list_physical_devices("CPU")[0]
        with contextlib.suppress(RuntimeError):  # already started: the devices it has
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)

    def local_devices():
        if not split_cpu:
            return None  # MirroredStrategy's own choice: the GPUs here, or the CPU
        return [d.name for d in tf.config.list_logical_devices("CPU")][:wanted]

    def _batch(dataset):
        shape = tf.data.experimental.get_structure(dataset)
        first = tf.nest.flatten(shape)[0].shape
        return int(first[0]) if first.rank and first[0] is not None else 1

    class LocalStrategy(tf.distribute.MirroredStrategy):
        """MirroredStrategy in place of MultiWorkerMirroredStrategy: no cross-task
        collectives. ``local`` reads this task's share of the data."""

        def __init__(self, cluster_resolver=None, communication_options=None):
            super().__init__(devices=local_devices())

        def experimental_distribute_dataset(self, dataset, options=None):
            if variant["strategy"] != "local" or pipelines == 1:
                return super().experimental_distribute_dataset(dataset, options)
            total = pipelines * self.num_replicas_in_sync
            try:  # as MultiWorkerMirroredStrategy does it: the global batch split into the
                # job's replicas, this task's part taken by its auto-shard policy
                from tensorflow.python.distribute import input_util
                return input_util.get_distributed_dataset(
                    dataset, self.extended._input_workers_with_options(options), self,
                    num_replicas_in_sync=total, input_context=tf.distribute.InputContext(
                        pipelines, pipeline, total), options=options)
            except (ImportError, AttributeError):  # an approximation: its share, by element
                batches = dataset.unbatch().batch(max(1, _batch(dataset) // pipelines))
                return super().experimental_distribute_dataset(
                    batches.shard(pipelines, pipeline), options)

        def distribute_datasets_from_function(self, dataset_fn, options=None):
            if variant["strategy"] != "local":
                return super().distribute_datasets_from_function(dataset_fn, options)

            def as_this_task(context):
                return dataset_fn(tf.distribute.InputContext(
                    num_input_pipelines=pipelines, input_pipeline_id=pipeline,
                    num_replicas_in_sync=pipelines * context.num_replicas_in_sync))
            return super().distribute_datasets_from_function(as_this_task, options)

    chosen = (TimedMultiWorkerMirroredStrategy if variant["strategy"] == "multi_worker"
              else LocalStrategy)
    tf.distribute.MultiWorkerMirroredStrategy = chosen


if __name__ == "__main__":  # a cell, or a script: never an import
    _tfdist_isolate(VARIANT)
    del _tfdist_isolate
