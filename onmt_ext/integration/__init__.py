"""The integration with OpenNMT-py: how the mechanisms and the runtime enter the stock commands.

Activation (:mod:`.plugin`), the encoder and decoder of ``ext_transformer`` (:mod:`.transformer`), strict option
parsing (:mod:`.parsing`, :mod:`.command_line`), the commands' one-line errors (:mod:`.commands`), checkpoints
(:mod:`.checkpoints`), progress lines (:mod:`.progress`), the source preprocessing and ``jieba`` transform
(:mod:`.preprocessing`, :mod:`.zh_segment`) and scoring (:mod:`.evaluation`).

Layer rule (``tests/unit/test_layers.py``): this layer may import every other; nothing below imports it.
"""
