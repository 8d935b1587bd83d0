"""Elastic Keras model.fit on scikit-learn's digits: the job keeps training
when a host is lost and grows when hosts are added. Keras 3, or tf_keras with
``TF_USE_LEGACY_KERAS=1``.

    hvdrun -np 2 python examples/keras_elastic_digits.py             # a plain job
    hvdrun --min-np 2 --max-np 3 -H node1,node2,node3 python examples/keras_elastic_digits.py

The model, its optimizer, the epoch and the batch live in a ``KerasState``;
the callbacks keep epoch and batch up to date and commit every
--commit-every batches. ``fit`` runs inside a function decorated with
``hvd.elastic.run``: after a host is lost or added the job starts again from
the newest commit, and ``fit`` does the epochs still to do on the data shards of
the ranks there are then (as in Horovod, the epoch that was interrupted
starts over on the new shards; the torch example's ElasticSampler resumes it
sample by sample instead).

With --events every rank prints one JSON line per event (start, begin, step,
commit, done), as examples/pytorch_elastic_digits.py does.
"""
import argparse
import hashlib
import json
import os
import socket
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402

from keras_digits import load_data, make_model  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.001, help="Adam learning rate per rank")
    p.add_argument("--commit-every", type=int, default=4, help="batches between commits")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds each step sleeps")
    p.add_argument("--events", action="store_true", help="print JSON event lines")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    hvd.init(intra_op_threads=1, inter_op_threads=1)
    keras = tf.keras
    keras.utils.set_random_seed(args.seed)
    x_train, x_test, y_train, y_test = load_data(args.seed)

    def event(kind, all_ranks=False, **fields):
        if args.events and (all_ranks or hvd.rank() == 0):
            line = json.dumps(dict(ev=kind, rank=hvd.rank(), size=hvd.size(), t=time.time(), **fields))
            sys.stdout.write(line + "\n")  # one write: ranks share a pipe
            sys.stdout.flush()

    event("start", all_ranks=True, pid=os.getpid(), host=socket.gethostname(),
          generation=int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0")))
    model = make_model(keras)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr * hvd.size()))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    state = hvd.elastic.KerasState(model, optimizer, batch=0, epoch=0, step=0)

    def on_reset():
        optimizer.learning_rate.assign(args.lr * hvd.size())
    state.register_reset_callbacks([on_reset])

    def params_sha256():
        flat = np.concatenate([np.asarray(v).reshape(-1) for v in model.get_weights()])
        return hashlib.sha256(flat.astype(np.float32).tobytes()).hexdigest()

    class Events(keras.callbacks.Callback):
        """Counts steps and reports steps and commits (after CommitStateCallback)."""

        def __init__(self):
            super().__init__()
            self.commits = state._commit_seq

        def on_train_batch_end(self, batch, logs=None):
            state.step += 1
            event("step", step=state.step, epoch=state.epoch)
            if args.step_sleep:
                time.sleep(args.step_sleep)

        def after_commit(self):
            if state._commit_seq != self.commits:
                self.commits = state._commit_seq
                event("commit", step=state.step)

    events = Events()

    class ReportCommits(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            events.after_commit()

        def on_epoch_end(self, epoch, logs=None):
            events.after_commit()

    @hvd.elastic.run
    def train(state):
        event("begin", all_ranks=True, pid=os.getpid(), step=state.step, epoch=state.epoch, params_sha256=params_sha256())
        rank, size = hvd.rank(), hvd.size()
        steps = len(x_train) // (args.batch_size * size)
        x_shard = x_train[rank::size][:steps * args.batch_size]
        y_shard = y_train[rank::size][:steps * args.batch_size]
        data = tf.data.Dataset.from_tensor_slices((x_shard, y_shard)).batch(args.batch_size).repeat()
        # Keras counts epochs from 0 in every fit(): ask for the ones still to do.
        model.fit(data, steps_per_epoch=steps, epochs=args.epochs - state.epoch, verbose=0,
                  callbacks=[hvd.elastic.UpdateEpochStateCallback(state),
                             hvd.elastic.UpdateBatchStateCallback(state), events,
                             hvd.elastic.CommitStateCallback(state, batches_per_commit=args.commit_every),
                             ReportCommits()])

    train(state)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    event("done", all_ranks=True, steps=state.step, accuracy=round(100 * float(accuracy), 2),
          params_sha256=params_sha256())
    if not args.events and hvd.rank() == 0:
        print(f"test accuracy {100 * float(accuracy):.2f}% after {state.step} steps on {hvd.size()} ranks")


if __name__ == "__main__":
    main()
