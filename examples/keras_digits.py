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
    hvdrun -np 4 python examples/keras_digits.py --local-sgd 4              # average every 4 steps
    hvdrun -np 4 python examples/keras_digits.py --diloco 20                          # DiLoCo
    hvdrun -np 4 python examples/keras_digits.py --diloco 20 --fragments 2 --compression fp16

Each rank trains on its own shard of the training set; gradients are averaged
by hvdlite, the logged metrics are averaged over ranks at every epoch end, and
the learning rate (scaled by the number of ranks) warms up over the first
epochs. Rank 0 prints progress and writes checkpoints. With --local-sgd or
--diloco each rank steps alone (unscaled learning rate, no warm-up) and the
ranks sync only every H steps (LocalSGDCallback, DiLoCoCallback).
"""
import argparse
import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.tensorflow.keras as hvd  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.001,
                   help="Adam learning rate for one rank; multiplied by the number of ranks")
    p.add_argument("--warmup-epochs", type=int, default=2)
    p.add_argument("--compression", choices=["none", "fp16", "bf16", "topk"], default="none")
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--run-eagerly", action="store_true", help="model.compile(run_eagerly=True)")
    p.add_argument("--checkpoint", help="rank 0 saves the model here (.keras) after training")
    p.add_argument("--resume", help="continue from a .keras file saved with --checkpoint")
    p.add_argument("--local-sgd", type=int, default=0, metavar="H",
                   help="local SGD: each rank steps alone, weights averaged every H steps")
    p.add_argument("--diloco", type=int, default=0, metavar="H",
                   help="DiLoCo: each rank steps alone; every H steps an outer Nesterov step "
                        "on the averaged outer gradient")
    p.add_argument("--fragments", type=int, default=1,
                   help="DiLoCo: fragments syncing on staggered steps (Streaming DiLoCo)")
    p.add_argument("--overlap-steps", type=int, default=None,
                   help="DiLoCo: steps a fragment's reduction overlaps (default 1 with "
                        "--fragments > 1, else 0)")
    p.add_argument("--outer-lr", type=float, default=1.0)
    p.add_argument("--outer-momentum", type=float, default=0.5,
                   help="DiLoCo's outer Nesterov momentum (0: plain SGD)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args(argv)
    local = args.local_sgd or args.diloco
    if args.local_sgd and args.diloco:
        p.error("--local-sgd and --diloco are two ways to sync less often: pick one")
    if args.fragments != 1 and not args.diloco:
        p.error("--fragments applies to --diloco")
    if local and args.compression == "topk":
        p.error("with --local-sgd/--diloco use --compression none, fp16 or bf16")
    if local and args.resume:
        p.error("--resume continues a synchronous run; --local-sgd/--diloco start a new one")
    return args


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
    if args.compression == "bf16":
        return hvd.Compression.bf16
    if args.compression == "topk":
        return hvd.Compression.topk(args.topk_ratio, error_feedback=True)
    return hvd.Compression.none


def _wire_bytes():
    """Bytes this rank has put on the wire for reductions so far (compressed
    forms where compression applies)."""
    return sum(v for k, v in hvdlite.engine_stats().items() if k.startswith("wire_bytes_"))


def main(argv=None):
    args = parse_args(argv)
    local = args.local_sgd or args.diloco
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
        # With local SGD and DiLoCo each rank steps on its own batch: the
        # learning rate is one rank's, and the optimizer is not distributed.
        scaled_lr = args.lr if local else args.lr * size
        opt = keras.optimizers.Adam(scaled_lr)
        if not local:
            opt = hvd.DistributedOptimizer(opt, compression=compression_of(args))
        model.compile(optimizer=opt,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], run_eagerly=args.run_eagerly)

    callbacks = [
        # Same starting weights and optimizer state on every rank.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Logged metrics become averages over ranks (before anything reads them).
        hvd.callbacks.MetricAverageCallback(),
    ]
    if args.local_sgd:
        callbacks.append(hvd.callbacks.LocalSGDCallback(sync_every=args.local_sgd,
                                                        compression=compression_of(args)))
    elif args.diloco:
        # Syncs every H steps; at the end of fit() every rank has the same weights.
        callbacks.append(hvd.callbacks.DiLoCoCallback(
            sync_every=args.diloco, fragments=args.fragments, overlap_steps=args.overlap_steps,
            outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
            outer_nesterov=args.outer_momentum > 0, compression=compression_of(args)))
    if args.warmup_epochs and not args.resume and not local:
        callbacks.append(hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs, verbose=0 if args.json else 1))

    start, wire_start = time.time(), _wire_bytes()
    history = model.fit(x_shard, y_shard, batch_size=args.batch_size, epochs=args.epochs,
                        validation_data=(x_test[rank::size], y_test[rank::size]),
                        callbacks=callbacks, verbose=2 if rank == 0 and not args.json else 0)
    elapsed = time.time() - start
    wire = _wire_bytes() - wire_start
    steps = args.epochs * -(-n // args.batch_size)

    # Every rank holds the same weights: evaluate the whole test set anywhere.
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if args.checkpoint and rank == 0:
        model.save(args.checkpoint)
    result = {"ranks": size, "epochs": args.epochs, "compression": args.compression,
              "seed": args.seed, "local_sgd": args.local_sgd, "diloco": args.diloco,
              "fragments": args.fragments, "steps": steps,
              "wire_bytes_per_step": round(wire / max(steps, 1)),
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
