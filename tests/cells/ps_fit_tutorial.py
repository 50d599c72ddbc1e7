# TensorFlow's parameter server training tutorial, the model.fit part (tf_keras): a
# DatasetCreator, steps_per_execution, and the tutorial's three callbacks
import os
import tempfile

import tensorflow as tf

import tfdist_nb.worker as tw

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)

def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(64)
    x = tf.random.uniform((10, 10))
    y = tf.random.uniform((10,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size).prefetch(2)

dc = tf.keras.utils.experimental.DatasetCreator(dataset_fn)
with strategy.scope():
    model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])
model.compile(tf.keras.optimizers.legacy.SGD(), loss="mse", steps_per_execution=10)
working_dir = tempfile.mkdtemp()
callbacks = [
    tf.keras.callbacks.TensorBoard(log_dir=os.path.join(working_dir, "log")),
    tf.keras.callbacks.ModelCheckpoint(filepath=os.path.join(working_dir, "ckpt")),
    tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(working_dir, "backup")),
]
history = model.fit(dc, epochs=3, steps_per_epoch=20, callbacks=callbacks)
print("epochs", len(history.history["loss"]), "timed", tw.steps_done(),
      "checkpoint", os.path.isdir(os.path.join(working_dir, "ckpt")))
