"""The runtime: onmt-ext's changes to how stock OpenNMT-py trains, none of them a paper's mechanism.

The data path (:mod:`.corpus`, :mod:`.batches`), the training step (:mod:`.train_step`, :mod:`.hostsync`),
distributed ranks (:mod:`.distributed`), ``torch.compile`` (:mod:`.compile`), OpenNMT-py on current torch
(:mod:`.compat`) and the training log (:mod:`.train_log`).  ``ONMT_EXT_RUNTIME=stock`` leaves out every speed
change of this layer (docs/differences-from-stock.md).

Layer rule (``tests/unit/test_layers.py``): these modules import only the foundation (:mod:`onmt_ext.errors`,
:mod:`onmt_ext.options`, :mod:`onmt_ext.patches`) and each other.
"""
