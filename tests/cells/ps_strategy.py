import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    counter = tf.Variable(0.0)

@tf.function
def step():
    counter.assign_add(1.0)
    return counter.read_value()

for _ in range(10):
    coordinator.schedule(step)
coordinator.join()
print("variables on", counter.device, "counter =", counter.numpy())
