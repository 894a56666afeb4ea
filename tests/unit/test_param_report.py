"""li2019 parameter deltas at Transformer-Base against the paper's figures (Tables 2-3)."""

import sys

import pytest

import support

sys.path.insert(0, str(support.REPO / "tools"))
import param_report  # noqa: E402

BASE = support.REPO / "yaml_configs/baseline/transformer_base_wmt14_ende.yaml"
EXT = ["-encoder_type", "ext_transformer", "-decoder_type", "ext_transformer"]

# parameters the paper adds to its 88.0M Transformer-Base (li2019 Tables 2 and 3)
ROWS = {
    "simple, enc-self [1-6]": (["-li2019_enc_self", "simple"], 12.6e6),
    "EM, enc-self [1-6]": (["-li2019_enc_self", "em"], 12.6e6),
    "EM, enc-self + dec-self": (["-li2019_enc_self", "em", "-li2019_dec_self", "em"], 25.2e6),
    "EM, all three components": (["-li2019_enc_self", "em", "-li2019_dec_self", "em", "-li2019_enc_dec", "em"], 37.8e6),
    "EM, enc-self [1-3]": (["-li2019_enc_self", "em", "-li2019_enc_layers", "1", "2", "3"], 6.3e6),
    "EM, enc-self [1,2] (Effective Aggregation)": (["-li2019_enc_self", "em", "-li2019_enc_layers", "1", "2"], 4.2e6),
    "EM, enc-self [1]": (["-li2019_enc_self", "em", "-li2019_enc_layers", "1"], 2.1e6),
}


@pytest.mark.parametrize("row", sorted(ROWS))
def test_li2019_parameter_delta_within_5_percent_of_paper(row, onmt_active):
    overrides, paper = ROWS[row]
    [(_, total, base, delta)] = param_report.report([BASE], 32000, overrides=EXT + overrides)
    assert total == base + delta
    assert abs(delta - paper) <= 0.05 * paper, f"{row}: {delta / 1e6:.3f}M vs paper {paper / 1e6:.1f}M"


def test_baseline_has_zero_delta(onmt_active):
    [(_, total, base, delta)] = param_report.report([BASE], 32000)
    assert delta == 0 and total > 40e6
