"""The papers' mechanisms, one module (or subpackage) per paper key, and what they share.

- :mod:`.routing`: the routing-by-agreement core (simple and EM routing) of li2019, cao2019 and GRET, and
  :mod:`.routing_triton`, its fused kernels;
- :mod:`.li2019`, :mod:`.cao2019`, :mod:`.chen2019`, :mod:`.gret`, :mod:`.clause` (attention and the
  signal-word transform), :mod:`.disan` (a chen2019 baseline): each paper's options, modules, initialisation
  rules and checks;
- :mod:`.normalisation` (pre- or post-norm layers), :mod:`.state` (decoding state that beam search reorders),
  :mod:`.initialisation` (each parameter's rule).

Layer rule (``tests/unit/test_layers.py``): these modules import the foundation (:mod:`onmt_ext.errors`,
:mod:`onmt_ext.options`, :mod:`onmt_ext.patches`) and the runtime, never the integration.
"""
