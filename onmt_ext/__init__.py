"""onmt-ext: published Transformer modifications for MT, inside stock OpenNMT-py.

Importing this package is cheap and has no side effects; the extension is
wired into OpenNMT-py by :mod:`onmt_ext._autoload` (start-up hook) through
:func:`onmt_ext.integration.plugin.activate`.
"""

__version__ = "0.1.0"
