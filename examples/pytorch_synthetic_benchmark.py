"""Synthetic training throughput in the shape of Horovod's
pytorch_synthetic_benchmark.py: random images, a CPU-sized CNN, img/sec per
rank and in total.

    mpiexec -n 2 python examples/pytorch_synthetic_benchmark.py
    mpiexec -n 2 python examples/pytorch_synthetic_benchmark.py --fp16-allreduce
    mpiexec -n 2 python examples/pytorch_synthetic_benchmark.py --model resnet18 --image-size 64

``--model resnet18/resnet50`` uses torchvision when it is installed; the
default ``smallresnet`` (a 10-layer residual CNN, 32x32 inputs) needs nothing.
"""
import argparse
import time
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import hvdlite.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smallresnet")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-warmup-batches", type=int, default=3)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--fp16-allreduce", action="store_true", help="Compression.fp16")
    p.add_argument("--topk", type=float, default=0.0, help="Compression.topk(ratio) when > 0")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    return p.parse_args()


class Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.skip = torch.nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.skip(x))


class SmallResNet(torch.nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(32), torch.nn.ReLU())
        self.layers = torch.nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2),
                                          Block(128, 256, 2))
        self.fc = torch.nn.Linear(256, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(name):
    if name == "smallresnet":
        return SmallResNet(), 10
    try:
        import torchvision
    except ImportError:
        raise SystemExit(f"--model {name} needs torchvision (pip install torchvision); "
                         "the default smallresnet does not") from None
    return getattr(torchvision.models, name)(), 1000


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    model, classes = build_model(args.model)
    compression = hvd.Compression.none
    if args.fp16_allreduce:
        compression = hvd.Compression.fp16
    if args.topk > 0:
        compression = hvd.Compression.topk(args.topk)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, classes, (args.batch_size,))

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {hvd.size()} ({args.threads} thread(s) each)")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    img_secs = []
    for i in range(args.num_iters):
        t0 = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            benchmark_step()
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - t0)
        log(f"Iter #{i}: {rate:.1f} img/sec per CPU")
        img_secs.append(rate)
    mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")


if __name__ == "__main__":
    main()
