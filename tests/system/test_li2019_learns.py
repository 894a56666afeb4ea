"""System tier: with routing aggregation a tiny model learns the Tatoeba sample as well as the baseline.

Both models are the smoke twins (same size, data, seed and schedule) trained
for the same number of steps through ``onmt_train``; the measure is
OpenNMT-py's validation perplexity on the 1,000 held-out sentence pairs.
"""

import pytest

import support
from onmt_ext.runtime import train_log

pytestmark = pytest.mark.slow

STEPS = 600
# li2019's own baseline row: post-norm, as the routing rows (a stock pre-norm baseline would mix in that change)
BASELINE = "yaml_configs/smoke/li2019/transformer_base_wmt17_zhen_baseline.yaml"
# EM, the paper's default aggregation (simple routing measured 89.4 under the same settings;
# left out to keep `make test` within its time budget)
ROUTING = {
    "em_enc_self": "yaml_configs/smoke/li2019/transformer_base_wmt17_zhen_em_enc_self.yaml",
}
# learning at all: the English vocabulary has 4,000 entries (measured: 94.5 after 600 steps with the stock
# pre-norm baseline config this test used before; the post-norm one passes too)
BASELINE_MAX_PPL = 120.0
TOLERANCE = 1.02  # "at least as well", up to 2% of noise (measured: EM 90.4)


def _validation_ppl(config, out):
    result = support.run_cli(
        "onmt_train", "-config", config, "-save_model", out / "model", "-save_data", out / "samples",
        "-train_steps", STEPS, "-valid_steps", STEPS, "-save_checkpoint_steps", STEPS, "-warmup_steps", 100,
        "-hidden_size", 64, "-word_vec_size", 64, "-transformer_ff", 256,
    )
    validations = train_log.parse(result.stdout + result.stderr).valid
    assert validations, f"no validation perplexity in the log of {config}"
    return validations[-1].ppl


@pytest.fixture(scope="module")
def baseline_ppl(sample_data, onmt_active, tmp_path_factory):
    ppl = _validation_ppl(BASELINE, tmp_path_factory.mktemp("baseline"))
    assert ppl < BASELINE_MAX_PPL, f"the baseline did not learn: validation perplexity {ppl:.1f}"
    return ppl


@pytest.mark.parametrize("name", sorted(ROUTING))
def test_routing_learns_as_well_as_the_baseline(name, baseline_ppl, tmp_path):
    ppl = _validation_ppl(ROUTING[name], tmp_path)
    assert ppl <= TOLERANCE * baseline_ppl, f"{name}: validation perplexity {ppl:.2f} vs baseline {baseline_ppl:.2f}"
