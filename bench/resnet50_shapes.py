"""The 161 parameter tensors of ResNet-50 (25,557,032 float32, 102 MB), in the
order autograd produces their gradients (last layer first)."""


def resnet50_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]  # conv1, bn1
    in_ch = 64
    for width, blocks in [(64, 3), (128, 4), (256, 6), (512, 3)]:
        for b in range(blocks):
            out_ch = width * 4
            shapes += [(width, in_ch, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (out_ch, width, 1, 1), (out_ch,), (out_ch,)]
            if b == 0:  # projection shortcut
                shapes += [(out_ch, in_ch, 1, 1), (out_ch,), (out_ch,)]
            in_ch = out_ch
    shapes += [(1000, 2048), (1000,)]
    return list(reversed(shapes))


if __name__ == "__main__":
    import numpy as np
    s = resnet50_shapes()
    print(len(s), sum(int(np.prod(x)) for x in s))
