import tensorflow as tf

import tfdist_nb.worker as tw

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("replicas in sync:", strategy.num_replicas_in_sync)

GLOBAL_BATCH = 64
x = tf.random.stateless_normal((1024, 8), seed=(1, 2))
y = x @ (tf.range(8, dtype=tf.float32)[:, None] / 8.0) + 0.5
dist_ds = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(GLOBAL_BATCH))

with strategy.scope():
    # MEAN aggregation: each update is all-reduced across the workers before it is applied
    w = tf.Variable(tf.zeros((8, 1)), aggregation=tf.VariableAggregation.MEAN)
    b = tf.Variable(0.0, aggregation=tf.VariableAggregation.MEAN)

@tf.function
def train_step(x, y):
    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(x @ w + b - y))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * gw)
        b.assign_sub(0.1 * gb)
        return loss
    loss = strategy.reduce("MEAN", strategy.run(step_fn, args=(x, y)), axis=None)
    tf.print("loss", loss)
    return loss

batches = iter(dist_ds)
for _ in range(20):
    with tw.step():
        loss = train_step(*next(batches))
print(f"{tw.task[0]}:{tw.task[1]} final loss {float(loss):.4f} after {tw.steps_done()} steps")
