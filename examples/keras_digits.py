"""Data-parallel Keras model.fit on scikit-learn's handwritten digits
(8x8 images, 10 classes; the data ships inside scikit-learn, so this runs
offline). A Horovod-style script: with ``import horovod.tensorflow.keras as hvd``
it would read the same. It uses ``tf.keras``: Keras 3, or Keras 2 (tf_keras)
with ``TF_USE_LEGACY_KERAS=1``.

    mpiexec -n 2 python examples/keras_digits.py
    TF_USE_LEGACY_KERAS=1 mpiexec -n 2 python examples/keras_digits.py    # tf_keras
    hvdrun -np 2 python examples/keras_digits.py --compression fp16
    mpiexec -n 2 python examples/keras_digits.py --run-eagerly --epochs 3
    mpiexec -n 2 python examples/keras_digits.py --checkpoint /tmp/digits.keras
    mpiexec -n 2 python examples/keras_digits.py --resume /tmp/digits.keras --epochs 2

Each rank trains on its own shard of the training set; gradients are averaged
by hvdlite, the logged metrics are averaged over ranks at every epoch end, and
the learning rate (scaled by the number of ranks) warms up over the first
epochs. Rank 0 prints progress and writes checkpoints.
"""
import argparse
import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.001,
                   help="Adam learning rate for one rank; multiplied by the number of ranks")
    p.add_argument("--warmup-epochs", type=int, default=2)
    p.add_argument("--compression", choices=["none", "fp16", "topk"], default="none")
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--run-eagerly", action="store_true", help="model.compile(run_eagerly=True)")
    p.add_argument("--checkpoint", help="rank 0 saves the model here (.keras) after training")
    p.add_argument("--resume", help="continue from a .keras file saved with --checkpoint")
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
    # One compute thread per rank by default: ranks sharing a host do not
    # fight over cores ("auto" = cores on this host // ranks on this host).
    hvd.init(intra_op_threads="auto", inter_op_threads=1)
    keras = tf.keras  # Keras 3, or tf_keras when TF_USE_LEGACY_KERAS=1
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(args.seed + rank)  # different on purpose: the broadcast fixes it

    x_train, x_test, y_train, y_test = load_data(args.seed)
    # Equal-length shards: every rank must run the same number of steps.
    n = len(x_train) // size
    x_shard, y_shard = x_train[rank::size][:n], y_train[rank::size][:n]

    if args.resume:
        model = hvd.load_model(args.resume, compression=compression_of(args))
        scaled_lr = float(model.optimizer.learning_rate.numpy())
    else:
        model = make_model(keras)
        scaled_lr = args.lr * size
        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr),
                                       compression=compression_of(args))
        model.compile(optimizer=opt,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], run_eagerly=args.run_eagerly)

    callbacks = [
        # Same starting weights and optimizer state on every rank.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Logged metrics become averages over ranks (before anything reads them).
        hvd.callbacks.MetricAverageCallback(),
    ]
    if args.warmup_epochs and not args.resume:
        callbacks.append(hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs, verbose=0 if args.json else 1))

    start = time.time()
    history = model.fit(x_shard, y_shard, batch_size=args.batch_size, epochs=args.epochs,
                        validation_data=(x_test[rank::size], y_test[rank::size]),
                        callbacks=callbacks, verbose=2 if rank == 0 and not args.json else 0)
    elapsed = time.time() - start

    # Every rank holds the same weights: evaluate the whole test set anywhere.
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if args.checkpoint and rank == 0:
        model.save(args.checkpoint)
    result = {"ranks": size, "epochs": args.epochs, "compression": args.compression,
              "test_accuracy": round(100 * float(accuracy), 2),
              "val_accuracy_averaged": round(100 * float(history.history["val_accuracy"][-1]), 2),
              "seconds": round(elapsed, 2)}
    if rank == 0:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"test accuracy {result['test_accuracy']:.2f}% ({size} ranks, compression "
                  f"{args.compression}, {elapsed:.1f}s)", flush=True)
            if args.checkpoint:
                print(f"saved {args.checkpoint}", flush=True)
    return result


if __name__ == "__main__":
    tf.get_logger().setLevel("ERROR")
    main()
