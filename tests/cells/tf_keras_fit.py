import numpy as np
import tensorflow as tf

import tfdist_nb.worker as tw

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")

x = np.random.default_rng(0).normal(size=(512, 8)).astype("float32")
y = x @ (np.arange(8, dtype="float32")[:, None] / 8.0)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
history = model.fit(ds, epochs=2, verbose=2)  # tfdist_nb adds its step timer itself
print("keras", tf.keras.__name__, "final loss", round(history.history["loss"][-1], 4),
      "steps", tw.steps_done())
