"""``python -m tools.gpu_check``: runs the GPU check (:func:`tools.gpu_check.cli.main`), or one of its child
processes (``--child KIND ...``)."""

import sys

from tools.gpu_check.cli import main

sys.exit(main())
