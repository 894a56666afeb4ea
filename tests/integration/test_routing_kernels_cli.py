"""The decoding properties (checks 1-4 of test_decoding_properties.py) of li2019, GRET and cao2019 with their routing
in the fused kernels (onmt_ext.mechanisms.routing_triton), on this machine: through Triton's interpreter without CUDA.

On a GPU the default ``auto`` choice already puts their routing in the kernels, and gpu-check's property
section runs the suite there; this test gives the CPU the same evidence.  The suite's own first check,
``test_routing_runs_on_the_chosen_path``, fails unless the kernels ran (li2019, GRET, cao2019: its horizontal
routing's shared votes and long sentences in the chunked kernels).
"""

import subprocess
import sys

import pytest

import support

pytestmark = pytest.mark.slow

CONFIGS = ["li2019/em_all_components.yaml", "li2019/transformer_base_wmt14_ende_simple_enc_self.yaml",
           "gret/transformer_base_wmt14_ende_gret.yaml", "cao2019/dec_self_cross_self.yaml"]


def test_decoding_properties_hold_through_the_kernels(sample_data):
    env = support.cli_env()
    env.update({"ONMT_EXT_ROUTING_KERNEL": "triton", support.CONFIGS_VARIABLE: ",".join(CONFIGS),
                "TRITON_INTERPRET": "1"})
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                             "-W", "error::UserWarning:onmt_ext.mechanisms.routing",
                             "tests/integration/test_decoding_properties.py"],
                            capture_output=True, text=True, cwd=support.REPO, env=env, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
