"""chen2019's options through ``onmt_train``: a bad value stops the command with a clean error.

Moved out of tests/unit/test_chen2019.py (unit/ runs in-process only): ``onmt_train`` with
``-chen2019_enc rpehead`` and an RPE size ``-chen2019_dim`` that the layout cannot use exits non-zero with the
options named and no traceback.  The smoke config and the ``ext_transformer`` options come from
tests/unit/test_chen2019.py.
"""

import support
from unit.test_chen2019 import EXT, SMOKE


def test_bad_option_value_is_a_clean_cli_error(sample_data, tmp_path):
    result = support.run_cli("onmt_train", "-config", support.REPO / SMOKE, *EXT, "-chen2019_enc", "rpehead",
                             "-chen2019_dim", "12", "-save_model", tmp_path / "m", "-train_steps", "1", check=False)
    assert result.returncode != 0
    assert "-chen2019_dim 12 with -chen2019_enc rpehead" in result.stderr
    assert "Traceback" not in result.stderr
