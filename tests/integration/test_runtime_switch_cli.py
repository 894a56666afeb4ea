"""``ONMT_EXT_RUNTIME=stock`` (issue 60): every mechanism on stock OpenNMT-py's data path and training step.

A smoke config trains 5 steps through ``onmt_train`` with onmt-ext's runtime and with stock's: every step's
report (accuracy, perplexity, cross-entropy, sentences, tokens) and the step-5 parameters agree within float
tolerance, so the runtime (:func:`onmt_ext.patches.runtime_choice`) changes no number of any mechanism.  The
combined config is in the default tier, one config per mechanism in the slow tier.  Which changes the switch leaves
out (and only those): tests/unit/test_patches.py.
"""

import re

import pytest
import torch

import support

pytestmark = pytest.mark.usefixtures("sample_data")

COMBINED = "yaml_configs/smoke/combined/all_mechanisms.yaml"
#: one smoke config per mechanism (clause's wmt15 row also trains post-norm layers)
MECHANISMS = {
    "li2019": "yaml_configs/smoke/li2019/transformer_base_wmt14_ende_em_all.yaml",
    "cao2019": "yaml_configs/smoke/cao2019/transformer_base_wmt17_zhen_cross_self.yaml",
    "chen2019": "yaml_configs/smoke/chen2019/transformer_base_nist_zhen_mprhead.yaml",
    "disan": "yaml_configs/smoke/chen2019/transformer_base_nist_zhen_disan.yaml",
    "clause": "yaml_configs/smoke/clause/transformer_base_wmt15_envi_ca_rule.yaml",
    "gret": "yaml_configs/smoke/gret/transformer_base_wmt14_ende_gret.yaml",
}
STEPS = 5
_REPORT = re.compile(r"Step +(\d+)/ *\d+; acc: *([\d.]+); ppl: *([\d.]+); xent: *([\d.]+); .*sents: +(\d+); "
                     r"bsz: +(\d+)/ *(\d+)/ *(\d+);")


def _train(config, folder, runtime):
    """5 steps of ``config`` under ``ONMT_EXT_RUNTIME=runtime``: ``({step: report numbers}, step-5 parameters)``."""
    result = support.run_cli(
        "onmt_train", "-config", config, "-save_data", folder / "samples", "-save_model", folder / "model",
        "-train_steps", STEPS, "-report_every", 1, "-valid_steps", 100, "-save_checkpoint_steps", STEPS,
        env=support.cli_env(ONMT_EXT_RUNTIME=runtime))
    reports = {int(match[1]): [float(value) for value in match.groups()[1:]]
               for match in _REPORT.finditer(result.stderr + result.stdout)}
    assert sorted(reports) == list(range(1, STEPS + 1)), result.stderr[-3000:]
    return reports, torch.load(folder / f"model_step_{STEPS}.pt", weights_only=False)["model"]


def _same_training(config, tmp_path):
    ours, ours_model = _train(config, tmp_path / "ext", "ext")
    stock, stock_model = _train(config, tmp_path / "stock", "stock")
    for step in ours:  # printed with one decimal (acc, ppl, xent) or as counts
        assert ours[step] == pytest.approx(stock[step], rel=1e-4, abs=0.11), (step, ours[step], stock[step])
    assert ours_model.keys() == stock_model.keys()
    different = [name for name in ours_model
                 if not torch.allclose(ours_model[name], stock_model[name], rtol=1e-4, atol=1e-6)]
    assert not different, different


def test_the_combined_mechanisms_train_the_same_on_the_stock_runtime(tmp_path):
    _same_training(COMBINED, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_each_mechanism_trains_the_same_on_the_stock_runtime(mechanism, tmp_path):
    _same_training(MECHANISMS[mechanism], tmp_path)


def test_a_runtime_the_variable_cannot_take_stops_the_command_in_one_line(tmp_path):
    result = support.run_cli("onmt_train", "-config", COMBINED, "-save_model", tmp_path / "model", check=False,
                             env=support.cli_env(ONMT_EXT_RUNTIME="fast"))
    assert support.one_error_line(result, "onmt_train", 2) == (
        "onmt_train: error: ONMT_EXT_RUNTIME='fast' is not one of ext, stock; unset it (ext) or set one of those "
        "(docs/troubleshooting.md)")
