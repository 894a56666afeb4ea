"""onmt-ext's activation inside the stock OpenNMT-py commands, and the registration of its models and options.

:func:`activate`, called once by the start-up hook (:mod:`onmt_ext._autoload`) right after ``onmt`` is imported,
registers ``ext_transformer`` with ``register_encoder``/``register_decoder``, adds onmt-ext's options to
``onmt.opts.model_opts`` (YAML, command line, checkpoints) and ``-ext_compile`` to ``onmt_translate``, adds the
``clause_split`` and ``jieba`` transforms, and has each module apply its own changes, in a fixed order:
:mod:`~onmt_ext.runtime.compat` (OpenNMT-py on current torch, its crash fixes), :mod:`~onmt_ext.integration.parsing`
(strict options), :mod:`~onmt_ext.integration.checkpoints` (loading, ``-train_from``, averaging),
:mod:`~onmt_ext.integration.commands` (one-line errors, exit codes), and the mechanisms' own hooks (GRET's fine-tuning,
clause attention's checks).

Every change goes through :mod:`onmt_ext.patches`; :func:`activate` is idempotent and all-or-nothing (a failure
undoes what it applied, nothing older), and ``ONMT_EXT_DISABLE=1`` prevents all of it; ``ONMT_EXT_RUNTIME=stock``
only the runtime (:func:`onmt_ext.patches.runtime_choice`).  Each change against stock: docs/differences-from-stock.md.
"""

import importlib

from onmt_ext.runtime import batches, binarized, compat, corpus, distributed, half_weights, train_step
from onmt_ext.integration import checkpoints, command_line, commands, parsing, preprocessing, progress
from onmt_ext.mechanisms.clause import attention as clause_attention
from onmt_ext.mechanisms import gret, initialisation
from onmt_ext import patches
from onmt_ext.runtime import compile as ext_compile
from onmt_ext.options import EXT_TYPE, add_model_options, str2bool
from onmt_ext.patches import NEEDED, add_entry, patch
from onmt_ext.runtime.train_step import STOCK_ADAM_EPS

# OpenNMT-py, onmt_ext.integration.transformer and the transforms (which import OpenNMT-py) are imported inside the
# functions: this module may be imported before OpenNMT-py, whose import activates onmt-ext (onmt_ext._autoload).

_active = False


def _register_models():
    import onmt.decoders
    import onmt.encoders

    from onmt_ext.integration.transformer import ExtTransformerDecoder, ExtTransformerEncoder

    test = "tests/integration/test_plugin_cli.py::test_hook_registers_types_on_first_onmt_import"
    add_entry(onmt.encoders, "str2enc", EXT_TYPE, ExtTransformerEncoder, kind=NEEDED, test=test,
              reason="-encoder_type ext_transformer: the Transformer encoder with onmt-ext's mechanisms")
    add_entry(onmt.decoders, "str2dec", EXT_TYPE, ExtTransformerDecoder, kind=NEEDED, test=test,
              reason="-decoder_type ext_transformer: the Transformer decoder with onmt-ext's mechanisms")


def _extend_model_options():
    import onmt.opts

    patch(onmt.opts, "model_opts", _model_opts, kind=NEEDED,
          reason="adds onmt-ext's options (and -overwrite_checkpoints) to onmt_train, so checkpoints store them",
          test="tests/unit/test_options.py::test_options_reach_the_train_parser_with_defaults")


def _translation_compile():
    """``onmt_translate -ext_compile``: compile the mechanisms' cores for this translation (off by default)."""
    import onmt.bin.translate
    import onmt.model_builder as builder
    import onmt.opts

    for owner in (onmt.opts, onmt.bin.translate):  # onmt_translate's parser calls the name it imported
        patch(owner, "translate_opts", _translate_opts, kind=NEEDED,
              reason="adds -ext_compile to onmt_translate (torch.compile of the mechanisms' cores when translating)",
              test="tests/unit/test_compile.py::test_onmt_translate_compiles_only_when_asked")
    patch(builder, "load_test_model", _load_test_model, kind=NEEDED, order=1,
          reason="onmt_translate's -ext_compile, not the training run's, decides whether translation compiles",
          test="tests/unit/test_compile.py::test_onmt_translate_compiles_only_when_asked")


def _translate_opts(stock, parser, *args, **kwargs):
    stock(parser, *args, **kwargs)
    if not any("-ext_compile" in action.option_strings for action in parser._actions):
        group = parser.add_argument_group("onmt-ext translation")
        group.add("--ext_compile", "-ext_compile", type=str2bool, nargs="?", const=True, default=False,
                  help="Run the onmt-ext mechanisms' tensor cores through torch.compile while translating (the "
                       "first batches compile); without it translation is eager, whatever training used. As in "
                       "onmt_train: -ext_compile alone or -ext_compile true turns it on, -ext_compile false off.")


def _load_test_model(stock, opt, *args, **kwargs):
    vocabs, model, model_opt = stock(opt, *args, **kwargs)
    ext_compile.enable(model, getattr(opt, "ext_compile", False))
    return vocabs, model, model_opt


def _model_opts(stock, parser):
    stock(parser)
    add_model_options(parser)
    if not any("-overwrite_checkpoints" in action.option_strings for action in parser._actions):
        group = parser.add_argument_group("onmt-ext training")
        group.add("--overwrite_checkpoints", "-overwrite_checkpoints", action="store_true",
                  help="Train into a -save_model that already holds <save_model>_step_N.pt files of another run, or "
                       "of this run's later steps when resuming (they are overwritten step by step); without it "
                       "onmt_train refuses to start.")
        group.add("--adam_eps", "-adam_eps", type=float, default=STOCK_ADAM_EPS,
                  help="Adam's epsilon (-optim adam only); OpenNMT-py fixes it at 1e-8, Vaswani et al. (2017) "
                       "used 1e-9, which the paper configs set.")


def _register_transforms():
    """Add onmt-ext's data transforms (``clause_split``, ``jieba``) to OpenNMT-py's registry."""
    # one whose import activated onmt-ext is at its end: whole
    for name in ("onmt_ext.mechanisms.clause.split", "onmt_ext.integration.zh_segment"):
        importlib.import_module(name).install()


def activate():
    """Register onmt-ext with the already-imported ``onmt`` package: all of it or, when a step fails (or
    OpenNMT-py's version is not :data:`onmt_ext.patches.SUPPORTED`), nothing: every change undone, the error
    re-raised.  Idempotent."""
    global _active
    if _active:
        return
    with patches.all_or_nothing():
        patches.check_version()
        _activate()
    _active = True


def deactivate():
    """Undo every change onmt-ext made to OpenNMT-py (:func:`onmt_ext.patches.rollback`): stock again."""
    global _active
    patches.rollback()
    _active = False


def _activate():
    compat.apply()
    compat.keep_log_file()
    compat.atomic_checkpoints()
    compat.resume_data_position()
    compat.count_filtered_examples()
    compat.explain_position_limit()
    compat.attention_backends()  # OpenNMT-py's GPU attention: the backends it names, not cuDNN's
    corpus.install()
    batches.install()  # training batches: tensors only, copied to the GPU without waiting
    binarized.install()  # -ext_binarized: training corpora read as ids that onmt_ext_binarize stored
    train_step.install()  # the training step: no host-device synchronisation between reports
    half_weights.install()  # -ext_half_weights: Linear layers on float16 copies of float32 master weights
    distributed.install()  # -world_size N -gpu_ranks ... on a torch without CUDA: CPU ranks over gloo
    _register_models()
    _extend_model_options()
    _translation_compile()
    parsing.make_parsing_strict()
    checkpoints.check_on_model_validation()
    gret.load_checkpoints_with_new_parameters()
    checkpoints.check_checkpoints()
    checkpoints.check_train_from_options()
    checkpoints.install()  # resuming, fine-tuning a replaced module, onmt_average_models (after check_checkpoints)
    command_line.install()
    _register_transforms()
    clause_attention.tell_builders_the_vocabs()
    initialisation.install()  # the mechanisms' stated initialisation, after OpenNMT-py's own
    clause_attention.check_translation_split()
    preprocessing.install()  # onmt_translate repeats (or checks) the checkpoint's source preprocessing
    progress.install()  # onmt_translate's progress on stderr
    commands.one_line_errors()


def is_active():
    """True once :func:`activate` has run in this process."""
    return _active
