"""Synthetic-data training throughput with DistributedGradientTape
(TensorFlow 2 / Keras 3 models, random inputs, no data pipeline).

    mpiexec -n 2 python examples/tensorflow2_synthetic_benchmark.py
    mpiexec -n 2 python examples/tensorflow2_synthetic_benchmark.py --compression fp16
    mpiexec -n 2 python examples/tensorflow2_synthetic_benchmark.py --no-reduce   # no communication
    mpiexec -n 2 python examples/tensorflow2_synthetic_benchmark.py --model ResNet50 \\
        --image-size 64 --batch-size 8 --num-iters 3

``--model mlp`` (default) is 6 dense layers of ``--width`` 2048 units (23 M parameters),
cheap enough for a CPU laptop; any ``keras.applications`` name (ResNet50,
MobileNetV2, ...) works too, with random weights. Each iteration times
``--num-batches-per-iter`` steps; the script prints samples/sec per rank
(mean +- 1.96 std over iterations) and in total.
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
    p.add_argument("--model", default="mlp", help="'mlp' or a keras.applications model name")
    p.add_argument("--width", type=int, default=2048, help="units per layer of the mlp")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--image-size", type=int, default=224, help="for keras.applications models")
    p.add_argument("--num-warmup-batches", type=int, default=3)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--compression", choices=["none", "fp16", "topk"], default="none")
    p.add_argument("--fp16-allreduce", action="store_true", help="Horovod's spelling of --compression fp16")
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--eager", action="store_true", help="run steps eagerly instead of tf.function")
    p.add_argument("--no-reduce", action="store_true",
                   help="plain tape, no communication: the single-rank speed of this model")
    p.add_argument("--threads", default="auto", help="TF intra-op threads per rank (int or auto)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    return p.parse_args(argv)


def build(args, keras):
    if args.model == "mlp":
        w = args.width
        layers = [keras.Input((w,))]
        layers += [keras.layers.Dense(w, activation="relu") for _ in range(5)]
        layers += [keras.layers.Dense(1000)]
        return keras.Sequential(layers), (w,), 1000
    try:
        factory = getattr(keras.applications, args.model)
    except AttributeError:
        raise SystemExit(f"unknown model {args.model!r}: use 'mlp' or a keras.applications name")
    shape = (args.image_size, args.image_size, 3)
    try:  # logits out: the loss below uses from_logits=True
        model = factory(weights=None, input_shape=shape, classes=1000, classifier_activation=None)
    except TypeError:
        model = factory(weights=None, input_shape=shape, classes=1000)
    return model, shape, 1000


def compression_of(args):
    if args.fp16_allreduce or args.compression == "fp16":
        return hvd.Compression.fp16
    if args.compression == "topk":
        return hvd.Compression.topk(args.topk_ratio, error_feedback=True)
    return hvd.Compression.none


def main(argv=None):
    args = parse_args(argv)
    hvd.init(intra_op_threads=args.threads, inter_op_threads=1)
    import keras
    rank, size = hvd.rank(), hvd.size()
    model, input_shape, classes = build(args, keras)
    opt = keras.optimizers.SGD(0.01)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(rank)
    data = tf.constant(rng.standard_normal((args.batch_size,) + input_shape, dtype=np.float32))
    target = tf.constant(rng.integers(0, classes, size=(args.batch_size,)))
    compression = compression_of(args)
    n_params = int(sum(np.prod(v.shape) for v in model.trainable_variables))

    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        if not args.no_reduce:
            tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    if not args.eager:
        step = tf.function(step)

    hvd.broadcast_variables(model.variables + opt.variables, root_rank=0)
    if rank == 0 and not args.json:
        print(f"model {args.model} ({n_params / 1e6:.1f} M parameters), batch {args.batch_size} per "
              f"rank, {size} ranks, compression {compression!r}, "
              f"{'no reduction' if args.no_reduce else 'DistributedGradientTape'}, "
              f"{'eager' if args.eager else 'tf.function'}", flush=True)
    for _ in range(args.num_warmup_batches):
        step()
    rates = []
    for i in range(args.num_iters):
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            step()
        # make sure the last update has run before stopping the clock
        float(tf.reduce_sum(model.trainable_variables[0]))
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start)
        rates.append(rate)
        if rank == 0 and not args.json:
            print(f"iter {i}: {rate:.1f} samples/sec per rank", flush=True)
    mean, conf = float(np.mean(rates)), float(1.96 * np.std(rates))
    total = float(hvd.allreduce(tf.constant(mean, tf.float64), op=hvd.Sum, name="bench.total"))
    result = {"model": args.model, "ranks": size, "batch_size": args.batch_size,
              "compression": "none" if args.no_reduce else repr(compression),
              "reduce": not args.no_reduce, "eager": args.eager,
              "samples_per_sec_per_rank": round(mean, 2), "conf95": round(conf, 2),
              "samples_per_sec_total": round(total, 2),
              "step_ms": round(1000 * args.batch_size / mean, 2)}
    if rank == 0:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"samples/sec per rank: {mean:.1f} +- {conf:.1f}", flush=True)
            print(f"total samples/sec on {size} rank(s): {total:.1f}", flush=True)
    return result


if __name__ == "__main__":
    main()
