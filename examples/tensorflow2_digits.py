"""Data-parallel TensorFlow 2 custom training loop with DistributedGradientTape
on scikit-learn's handwritten digits (runs offline). Horovod-style: with
``import horovod.tensorflow as hvd`` it would read the same.

    mpiexec -n 2 python examples/tensorflow2_digits.py
    hvdrun -np 2 python examples/tensorflow2_digits.py --compression topk
    mpiexec -n 2 python examples/tensorflow2_digits.py --eager --epochs 2
    mpiexec -n 2 python examples/tensorflow2_digits.py --check    # verify every step

The training step is a tf.function (``--eager`` runs it eagerly): the tape's
gradients are averaged over ranks as one group, then a Keras optimizer
applies them. With ``--check`` every rank verifies after each step that (1)
the weights are identical on all ranks and (2) they equal a single-process
model trained on the combined batch of all ranks (to ``--check-tol``).
"""
import argparse
import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05,
                   help="SGD learning rate for one rank; multiplied by the number of ranks")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--compression", choices=["none", "fp16", "topk"], default="none")
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--eager", action="store_true", help="run the step eagerly, not as tf.function")
    p.add_argument("--check", action="store_true",
                   help="verify identical weights and the single-process reference every step")
    p.add_argument("--check-tol", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    return p.parse_args(argv)


def load_data(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def make_model(keras):
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def compression_of(args):
    if args.compression == "fp16":
        return hvd.Compression.fp16
    if args.compression == "topk":
        return hvd.Compression.topk(args.topk_ratio, error_feedback=True)
    return hvd.Compression.none


def main(argv=None):
    args = parse_args(argv)
    hvd.init(intra_op_threads="auto", inter_op_threads=1)
    import keras
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(args.seed + rank)  # differs by rank: the broadcast fixes it

    x_train, x_test, y_train, y_test = load_data(args.seed)
    # Rank r trains on every size-th example; all shards get the same length so
    # every rank runs the same number of steps (a rank with one step more would
    # wait forever for the others in its extra reduction).
    n = len(x_train) // size
    dataset = (tf.data.Dataset.from_tensor_slices((x_train[rank::size][:n], y_train[rank::size][:n]))
               .shuffle(len(x_train), seed=args.seed, reshuffle_each_iteration=True)
               .batch(args.batch_size))

    model = make_model(keras)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(args.lr * size, momentum=args.momentum)
    # Build the optimizer so its slots exist, then start every rank from rank 0's state.
    opt.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables + opt.variables, root_rank=0)
    compression = compression_of(args)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    if not args.eager:
        train_step = tf.function(train_step)

    reference = None
    if args.check:
        reference = make_model(keras)
        reference.set_weights(model.get_weights())
        ref_opt = keras.optimizers.SGD(args.lr * size, momentum=args.momentum)
        ref_opt.build(reference.trainable_variables)
    max_diff, steps, start = 0.0, 0, time.time()
    for epoch in range(args.epochs):
        losses = []
        for x, y in dataset:
            losses.append(float(train_step(x, y)))
            steps += 1
            if reference is not None:
                max_diff = max(max_diff, check_step(model, reference, ref_opt, loss_fn, x, y,
                                                    steps, args.check_tol))
        # Metric averaging: the mean of the ranks' mean losses.
        train_loss = float(hvd.allreduce(tf.constant(np.mean(losses)), name="metric.loss"))
        logits = model(x_test, training=False)
        accuracy = float(np.mean(np.argmax(logits.numpy(), 1) == y_test))
        if rank == 0 and not args.json:
            print(f"epoch {epoch + 1:3d}  train loss {train_loss:.4f}  "
                  f"test accuracy {100 * accuracy:.2f}%", flush=True)
    elapsed = time.time() - start
    result = {"ranks": size, "epochs": args.epochs, "compression": args.compression,
              "eager": args.eager, "test_accuracy": round(100 * accuracy, 2), "steps": steps,
              "seconds": round(elapsed, 2)}
    if args.check:
        result["max_diff_vs_single_process"] = max_diff
    if rank == 0:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"final test accuracy {100 * accuracy:.2f}% ({size} ranks, compression "
                  f"{args.compression}, {elapsed:.1f}s)", flush=True)
            if args.check:
                print(f"checked {steps} steps: weights identical on all ranks; largest difference "
                      f"from single-process training {max_diff:.2e}", flush=True)
    return result


def check_step(model, reference, ref_opt, loss_fn, x, y, step, tol):
    mine = [w for w in model.get_weights()]
    rank0 = hvd.broadcast_object(mine, root_rank=0, name="check.weights")
    for a, b in zip(mine, rank0):
        if not np.array_equal(a, b):
            raise SystemExit(f"step {step}: weights differ from rank 0's "
                             f"(max {float(np.max(np.abs(a - b))):.3e})")
    # The same step on one process with every rank's batch together. The
    # loss is the mean over the ranks' batch means (batches can differ in size
    # at the end of an epoch), which is what averaging the gradients computes.
    xs = hvd.allgather_object(x.numpy(), name="check.x")
    ys = hvd.allgather_object(y.numpy(), name="check.y")
    with tf.GradientTape() as tape:
        loss = tf.add_n([loss_fn(yb, reference(xb, training=True)) for xb, yb in zip(xs, ys)]) / len(xs)
    ref_opt.apply(tape.gradient(loss, reference.trainable_variables), reference.trainable_variables)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(reference.get_weights(), mine))
    if diff > tol:
        raise SystemExit(f"step {step}: weights differ from single-process training on the "
                         f"combined batch by {diff:.3e} > {tol}")
    return diff


if __name__ == "__main__":
    main()
