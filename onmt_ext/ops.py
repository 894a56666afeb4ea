"""Tensor helpers shared by the mechanisms (no OpenNMT-py imports).

:func:`softmax` works around a CPU performance problem of torch 2.13:
``torch.softmax`` over a last dimension of 4 to 15 elements takes the
kernel's slow path, about 3.5 times slower forward + backward at 14 (on a
``(40, 4, 14, 14)`` tensor: 880 µs against 250 µs after padding the rows to
16, ``tools/layer_cost.py``-style micro-benchmark on one thread), while 16
and longer rows are fast.  Tatoeba-length sentences (about 8 to 15
pieces) land exactly there.

It is used only for the softmaxes a mechanism adds (clause attention's
block-local attention, the routing couplings); the softmax a layer shares
with the stock Transformer (the attention probabilities of OpenNMT-py's own
``MultiHeadedAttention``) keeps torch's kernel, so ``make bench`` compares
the mechanism's extra work, not a faster kernel for work the baseline does
too.  Results equal ``torch.softmax`` up to float rounding (a few ulps: the
padded row is summed in another order).
"""

import torch
import torch.nn.functional as F

#: Last-dimension rows shorter than this (and at least ``_PAD_FROM``) are padded to it on the CPU.
_FAST_ROW = 16
_PAD_FROM = 4


def softmax(x, dim=-1):
    """``torch.softmax(x, dim)``; on the CPU, last-dimension rows of 4 to 15 elements are padded to 16 first.

    The padding is ``-inf`` (weight exactly 0) and is cut off again, so the
    result and its gradient are those of the softmax over the real row.  On
    other devices, over other dimensions (torch's strided kernel has no such
    slow path, and padding there costs a copy: 9 times slower measured), and
    for other row lengths, it is ``torch.softmax``.
    """
    size = x.size(dim)
    if x.device.type != "cpu" or dim not in (-1, x.dim() - 1) or not _PAD_FROM <= size < _FAST_ROW:
        return torch.softmax(x, dim)
    padded = F.pad(x, (0, _FAST_ROW - size), value=float("-inf"))
    return torch.softmax(padded, -1)[..., :size]
