"""onmt-ext's Transformer encoder and decoder: the blocks the mechanisms plug into.

Both are subclasses of OpenNMT-py's Transformer classes, built by
``from_opt`` from one :class:`~onmt_ext.options.ExtConfig`.  With every
onmt-ext option at its default they *are* the stock modules: the same
sub-modules, parameter names and arithmetic, so a stock checkpoint's weights
load into them and give identical outputs (``tests/unit/test_transformer.py``).

Selected with ``encoder_type: ext_transformer`` / ``decoder_type:
ext_transformer``; registered in OpenNMT-py's registries by
:mod:`onmt_ext.integration.plugin`.
"""

from functools import partial

from onmt.decoders.transformer import TransformerDecoder
from onmt.encoders.transformer import TransformerEncoder
from onmt.utils.misc import sequence_mask

from onmt_ext import _autoload
from onmt_ext.mechanisms import cao2019, chen2019, disan, gret, li2019  # options: options.MECHANISM_ORDER
from onmt_ext.mechanisms.clause import attention as clause_attention
from onmt_ext.mechanisms import normalisation
from onmt_ext.runtime import compile as ext_compile
from onmt_ext.options import ExtConfig
from onmt_ext.mechanisms.state import stateful_modules


class _ExtConfigured:
    """Mixin: the stock constructor plus ``ext_config``, and the stock ``from_opt``.

    The stock ``from_opt`` maps ``opt`` to the (long) constructor argument
    list; reusing it keeps us in step with OpenNMT-py instead of copying it.
    ``_stock`` names the OpenNMT-py class whose ``from_opt`` is reused;
    ``_mechanisms`` lists ``attach(module, config)`` functions that put each
    enabled mechanism into the freshly built stock module (a mechanism that
    is off attaches nothing, so the module stays exactly the stock one);
    ``-ext_layer_norm post`` goes first, so the mechanisms plug into post-norm layers.
    With ``-ext_compile`` the attached modules then run their tensor cores
    compiled (:mod:`onmt_ext.runtime.compile`).
    """

    _stock = None
    _mechanisms = ()

    def __init__(self, *args, ext_config, **kwargs):
        super().__init__(*args, **kwargs)
        self.ext_config = ext_config
        for attach in self._mechanisms:
            attach(self, ext_config)
        ext_compile.enable(self, ext_config.of(ext_compile.Compile).compile)

    @classmethod
    def from_opt(cls, opt, embeddings):
        """Build from OpenNMT-py options (validates the onmt-ext options)."""
        config = ExtConfig.from_opt(opt)
        return cls._stock.from_opt.__func__(partial(cls, ext_config=config), opt, embeddings)


class ExtTransformerEncoder(_ExtConfigured, TransformerEncoder):
    """OpenNMT-py's Transformer encoder plus onmt-ext's configuration.

    Args:
        *args, **kwargs: the stock :class:`TransformerEncoder` arguments.
        ext_config (ExtConfig): onmt-ext's typed configuration.

    ``forward(src, src_len)`` maps ``src`` ``(batch, src_len, feats)`` to
    ``enc_out`` ``(batch, src_len, d_model)``, the final state (``None``, or
    GRET's global state ``(batch, d_model)``) and ``src_len``.
    """

    _stock = TransformerEncoder
    _mechanisms = (normalisation.attach_encoder, li2019.attach_encoder, cao2019.attach_encoder, disan.attach_encoder,
                   chen2019.attach_encoder, clause_attention.attach_encoder, gret.attach_encoder)

    def forward(self, src, src_len=None):
        """The stock forward; with GRET the final state is the global state ``(batch, d_model)``."""
        clauses, summary = getattr(self, "clause", None), getattr(self, "gret", None)
        if clauses is None and summary is None:
            return super().forward(src, src_len)
        padding = sequence_mask(src_len, src.size(1))  # (OpenNMT-py's mask: True at padding)
        if clauses is not None:  # clause ids of this batch, read by the clause attentions
            clauses.start(src, padding)
        if summary is None:
            return super().forward(src, src_len)
        summary.start()
        enc_out, _, src_len = super().forward(src, src_len)
        return enc_out, summary.summarise(~padding), src_len


class ExtTransformerDecoder(_ExtConfigured, TransformerDecoder):
    """OpenNMT-py's Transformer decoder plus onmt-ext's configuration and state.

    Besides the stock self/context-attention caches, any sub-module deriving
    from :class:`~onmt_ext.mechanisms.state.DecodingStateModule` gets its decoding state
    initialised in :meth:`init_state`, reordered in :meth:`map_state` (beam
    tiling, beam reordering, finished hypotheses) and detached in
    :meth:`detach_state`.

    ``forward(tgt, enc_out, step, src_len=...)`` maps ``tgt``
    ``(batch, tgt_len, feats)`` to ``dec_out`` ``(batch, tgt_len, d_model)``
    and the attention dict, as the stock decoder does.
    """

    _stock = TransformerDecoder
    _mechanisms = (normalisation.attach_decoder, li2019.attach_decoder, cao2019.attach_decoder,
                   chen2019.attach_decoder, gret.attach_decoder)

    _stateful = None  # the stateful sub-modules, found again by each init_state

    def _stateful_modules(self):
        """The :class:`~onmt_ext.mechanisms.state.DecodingStateModule` sub-modules, as found by the last ``init_state``.

        Walking every sub-module costs about 0.5 ms at six layers, and
        ``forward`` runs once per decoding step, so the walk is done once per
        batch (in :meth:`init_state`; a module added later is found at the
        next batch) rather than per call.
        """
        if self._stateful is None:
            self._stateful = stateful_modules(self)
        return self._stateful

    def forward(self, tgt, enc_out=None, step=None, **kwargs):
        """The stock forward; stateful sub-modules are told whether this is a decoding step."""
        for module in self._stateful_modules():
            module.stepwise = step is not None
        dec_out, attns = super().forward(tgt, enc_out, step=step, **kwargs)
        fusion = getattr(self, "gret", None)
        return (dec_out if fusion is None else fusion(dec_out)), attns

    def init_state(self, src, enc_out, enc_final_hs):
        """Start decoding a batch: stock state plus every stateful sub-module."""
        super().init_state(src, enc_out, enc_final_hs)
        self._stateful = stateful_modules(self)
        for module in self._stateful:
            module.init_decoding_state(src, enc_out, enc_final_hs)

    def map_state(self, fn):
        """Apply ``fn(tensor, dim)`` to the stock caches and to our modules' state."""
        super().map_state(fn)
        for module in self._stateful_modules():
            module.reorder_decoding_state(fn)

    def detach_state(self):
        """Detach all decoding state from the autograd graph."""
        super().detach_state()
        for module in self._stateful_modules():
            module.detach_decoding_state()


# When importing this module was what imported onmt, the start-up hook waited for it (onmt_ext._autoload)
_autoload.activate_deferred(__name__)
