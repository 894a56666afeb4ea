"""Every parameter a mechanism adds has a stated initialisation rule, and the built model follows it.

Models are built by OpenNMT-py's own ``build_model`` (its ``-param_init_glorot`` pass included, then
onmt-ext's re-application of the rules), from the smoke configs: one or two per mechanism and the
combined ones.
"""

import pytest
import torch

import support
from onmt_ext.mechanisms import initialisation

CONFIGS = [
    ("yaml_configs/smoke/li2019/em_all_components.yaml", ()),
    ("yaml_configs/smoke/li2019/transformer_base_wmt14_ende_simple_enc_self.yaml", ()),
    ("yaml_configs/smoke/cao2019/dec_self_cross_self.yaml", ()),
    ("yaml_configs/smoke/chen2019/rpehead_all_switches.yaml", ()),
    ("yaml_configs/smoke/chen2019/mprhead_all_switches.yaml", ()),
    ("yaml_configs/smoke/chen2019/transformer_base_nist_zhen_mprhead.yaml", ("-chen2019_rnn", "lstm")),
    ("yaml_configs/smoke/chen2019/transformer_base_nist_zhen_rpehead.yaml",
     ("-chen2019_rnn", "sru", "-chen2019_init", "pytorch")),
    ("yaml_configs/smoke/chen2019/transformer_base_wmt14_ende_disan.yaml", ()),
    ("yaml_configs/smoke/clause/transformer_base_wmt16_ende_ca_rule.yaml", ()),
    ("yaml_configs/smoke/clause/transformer_base_wmt16_ende_ca_rule.yaml", ("-clause_mixing", "gate")),
    ("yaml_configs/smoke/gret/transformer_base_wmt14_ende_gret.yaml", ()),
    ("yaml_configs/smoke/gret/ablations_all_switches.yaml", ()),
    ("yaml_configs/smoke/combined/all_mechanisms.yaml", ()),
    ("yaml_configs/smoke/combined/all_but_cao2019.yaml", ()),
    # -param_init a: OpenNMT-py draws every parameter from U(-a, a); the mechanisms' rules still hold after it
    ("yaml_configs/smoke/combined/all_mechanisms.yaml", ("-param_init", "0.1")),
]


def _built(config, overrides):
    """The model as ``onmt_train`` builds it (OpenNMT-py's ``build_model``, no checkpoint, on the CPU)."""
    import onmt.model_builder as builder

    opt = support.load_train_opts(config, *overrides)
    torch.manual_seed(0)
    return builder.build_model(opt, opt, support.load_vocabs(opt), None, 0)


@pytest.mark.parametrize("config, overrides", CONFIGS, ids=lambda v: str(v).rsplit("/", 1)[-1] if v else "")
def test_every_added_parameter_has_a_rule_that_the_built_model_follows(config, overrides, sample_data,
                                                                       onmt_active):
    model = _built(config, overrides)
    added = [name for name, _ in model.named_parameters() if initialisation.added_by_mechanism(model, name)]
    assert added, f"{config} adds no parameter: it does not exercise its mechanism"
    assert initialisation.uncovered(model) == []
    parameters = dict(model.named_parameters())
    wrong = {name: rule.mismatch(parameters[name]) for name, rule in initialisation.declared(model).items()}
    assert {name: why for name, why in wrong.items() if why} == {}


def test_a_missing_rule_is_reported(sample_data, onmt_active, monkeypatch):
    model = _built("yaml_configs/smoke/cao2019/dec_self_cross_self.yaml", ())
    monkeypatch.delitem(initialisation.RULES, "onmt_ext.mechanisms.cao2019.CrossAggregation")
    missing = initialisation.uncovered(model)
    assert missing and all(name.endswith("softmax.head_weight") for name in missing)


def test_rules_are_reapplied_after_opennmt_glorot_pass(sample_data, onmt_active):
    """OpenNMT-py's by-name pass gives clause attention's gate a Glorot matrix and a 3-D block-diagonal
    projection a convolution-style bound; the built model has the stated zeros and per-block Glorot instead."""
    model = _built("yaml_configs/smoke/clause/transformer_base_wmt16_ende_ca_rule.yaml", ("-clause_mixing", "gate"))
    gates = [p for name, p in model.named_parameters() if name.endswith("mix_gate.weight")]
    assert gates and all(bool((gate == 0).all()) for gate in gates)
    model = _built("yaml_configs/smoke/chen2019/rpehead_all_switches.yaml", ())
    block = model.encoder.transformer[0].self_attn.linear_query.weight  # (H, d/H, d/H)
    bound = (6 / (2 * block.size(-1))) ** 0.5
    assert block.abs().max() <= bound and block.abs().max() > 0.8 * bound


def test_rule_checks_tell_rules_apart():
    glorot = initialisation.Rule("glorot", blocks=3)
    tensor = torch.empty(3 * 40, 30)
    glorot.apply(tensor)
    assert glorot.mismatch(tensor) is None
    assert initialisation.GLOROT.mismatch(tensor) is not None  # whole-tensor bound is smaller: values beyond it
    assert initialisation.ZEROS.mismatch(tensor) is not None
    assert glorot.mismatch(tensor * 0.1) is not None  # too narrow a draw
    with pytest.raises(ValueError, match="rule kind"):
        initialisation.Rule("kaiming")
