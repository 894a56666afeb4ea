"""Decoding state owned by the modules that need it.

OpenNMT-py's ``TransformerDecoder.map_state`` knows only its own cache keys,
and its beam search reorders state with ``lambda state, dim: state[idx]``,
which ignores ``dim`` and indexes dimension 0.  So every module of ours that
carries state across decoding steps derives from :class:`DecodingStateModule`,
keeps that state in ``self.decoding_state`` (name -> tensor) with the batch
(times beam) on **dimension 0**, and the decoder walks its sub-modules to
initialise, reorder and detach it (as fairseq's
``reorder_incremental_state`` does).
"""

import torch
import torch.nn as nn


class DecodingStateModule(nn.Module):
    """Base class of modules that keep per-sentence state across decoding steps.

    Subclasses fill ``self.decoding_state`` in :meth:`init_decoding_state`
    and read/update it in ``forward``.  Invariant: every tensor in it has the
    batch (or batch x beam) on dimension 0, so :meth:`reorder_decoding_state`
    can apply OpenNMT-py's ``fn(tensor, 0)`` to each one.
    """

    def __init__(self):
        super().__init__()
        self.decoding_state = {}

    def init_decoding_state(self, src, enc_out, enc_final_hs):
        """Set the state for a new batch.

        Args:
            src: ``(batch, src_len, feats)`` source token ids.
            enc_out: ``(batch, src_len, dim)`` encoder output.
            enc_final_hs: whatever the encoder returned as its final state.
        """
        self.decoding_state = {}

    def reorder_decoding_state(self, fn):
        """Apply OpenNMT-py's ``fn(tensor, dim)`` (tile or select) on dimension 0."""
        self.decoding_state = {
            key: fn(value, 0) if torch.is_tensor(value) else value
            for key, value in self.decoding_state.items()
        }

    def detach_decoding_state(self):
        """Detach the state from the autograd graph (truncated BPTT)."""
        self.decoding_state = {
            key: value.detach() if torch.is_tensor(value) else value
            for key, value in self.decoding_state.items()
        }


def stateful_modules(root):
    """The :class:`DecodingStateModule` instances below ``root`` (``root`` excluded)."""
    return [m for m in root.modules() if m is not root and isinstance(m, DecodingStateModule)]
