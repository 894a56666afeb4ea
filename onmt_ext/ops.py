"""Tensor helpers shared by the mechanisms (no OpenNMT-py imports).

:func:`softmax_width` works around a CPU performance problem of torch 2.13:
``torch.softmax`` over a last dimension of 4 to 15 elements takes the
kernel's slow path, about 3.5 times slower forward + backward at 14 (on a
``(40, 4, 14, 14)`` tensor on one thread, measured with a one-off script:
880 µs, against 250 µs when the rows are padded to 16 with ``-inf``), while
rows of 16 and more are fast.
Tatoeba-length sentences (about 8 to 15 pieces) land exactly there.  Over
other dimensions torch's strided kernel has no such slow path.

It is used only for the softmaxes a mechanism adds (clause attention's
block-local attention); the softmax a layer shares with the stock
Transformer (the attention probabilities of OpenNMT-py's own
``MultiHeadedAttention``) keeps torch's kernel at the real width, so ``make
bench`` compares the mechanism's extra work, not a faster kernel for work
the baseline does too.  The padded columns get weight exactly 0; the real
ones equal ``torch.softmax`` up to float rounding (a few ulps: the padded
row is summed in another order).
"""

import torch

#: Last-dimension rows shorter than this (and at least ``_PAD_FROM``) are computed at this width on the CPU.
_FAST_ROW = 16
_PAD_FROM = 4


def softmax_width(length, device):
    """The width at which to run a last-dimension softmax over ``length`` elements on ``device``.

    16 for CPU rows of 4 to 15 elements, else ``length``.  The caller pads
    its scores to this width with ``-inf`` (weight exactly 0), calls
    ``torch.softmax`` and cuts the extra columns off, possibly after further
    arithmetic at the padded width.
    """
    return _FAST_ROW if torch.device(device).type == "cpu" and _PAD_FROM <= length < _FAST_ROW else length
