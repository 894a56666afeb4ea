"""What the GPU check measures: section a's configs, the cases of sections b and c with their targets, and the
A/A control's band and summary (the median of its paired ratios with its interval)."""

import statistics

from tools import common
from tools import timed_runs
from tools.timed_runs import Case

REPO = common.REPO
PROPERTY_TEST = "tests/integration/test_decoding_properties.py"
#: the fused routing kernels against their PyTorch reference, on the GPU (a process of section a, CUDA only)
KERNEL_TEST = "tests/unit/test_routing_kernels.py"
#: pytest-xdist workers of that process: its 50 tests compile about 88 kernel specialisations (counted in
#: Triton's interpreter on the CPU, 2026-11-30), and Triton compiles on the host, one kernel at a time a process
KERNEL_TEST_WORKERS = 4

#: Section a: one smoke config per mechanism (relative to yaml_configs/smoke/), then every mechanism at once.
PROPERTY_CONFIGS = (
    "li2019/em_all_components.yaml",
    "cao2019/transformer_base_wmt17_zhen_cross_zero.yaml",
    "chen2019/transformer_base_nist_zhen_rpehead.yaml",
    "chen2019/transformer_base_nist_zhen_mprhead.yaml",
    "gret/transformer_base_wmt17_zhen_gret.yaml",
    "clause/transformer_base_wmt16_ende_ca_rule.yaml",
    "combined/all_mechanisms.yaml",
)
TINY_PROPERTY_CONFIGS = ("combined/all_mechanisms.yaml",)
#: autocast dtypes of section a (the suite's ONMT_EXT_TEST_AUTOCAST values)
PROPERTY_DTYPES = ("none", "fp16", "bf16")
TINY_PROPERTY_DTYPES = ("none", "bf16")

BASELINE = Case("baseline", "baseline/transformer_base_wmt17_zhen.yaml", pre_encoded=True)
#: the baseline with -ext_half_weights (issue 59, item 4): its Linear layers compute with float16 copies of their
#: weights, refreshed once per step, the optimizer keeping the float32 parameters.  A row of section b's in-process
#: group with no target (report-only), its ratio over its neighbouring baseline runs like a mechanism's
HALF_WEIGHTS = Case("baseline, half weights", BASELINE.config, pre_encoded=True)
#: Section b and c cases with the targets of issues 29 and 35: training and decoding ratios to the baseline.
#: Decoding targets apply to the encoder-side mechanisms (0.97) and to EM on all three components (0.80).
MECHANISMS = (
    Case("li2019 EM routing, enc-self [1-6]", "li2019/transformer_base_wmt17_zhen_em_enc_self.yaml",
         train_target=0.80, translate_target=0.97, paper_train=1.20 / 1.92, paper_translate=1.65 / 1.67,
         pre_encoded=True),
    Case("li2019 Effective Aggregation (EM, enc-self [1,2])",
         "li2019/transformer_base_wmt17_zhen_em_enc_self_layers_1-2.yaml",
         train_target=0.93, translate_target=0.97, paper_train=1.67 / 1.92, pre_encoded=True),
    Case("li2019 simple routing, enc-self [1-6]", "li2019/transformer_base_wmt17_zhen_simple_enc_self.yaml",
         train_target=0.80, translate_target=0.97, paper_train=1.23 / 1.92, paper_translate=1.66 / 1.67,
         pre_encoded=True),
    Case("li2019 EM routing on all three components", "li2019/transformer_base_wmt17_zhen_em_all.yaml",
         train_target=0.50, translate_target=0.80, pre_encoded=True),
    Case("cao2019 cross aggregation, enc [1-6]", "cao2019/transformer_base_wmt17_zhen_cross_zero.yaml",
         train_target=0.90, translate_target=0.97, pre_encoded=True),
    Case("chen2019 RPEHead (enc + dec)", "chen2019/transformer_base_nist_zhen_rpehead.yaml",
         train_target=0.93, paper_train=10.5 / 11.7, pre_encoded=True, compiles_by_default=True),
    Case("chen2019 MPRHead (enc + dec)", "chen2019/transformer_base_nist_zhen_mprhead.yaml",
         train_target=0.93, paper_train=9.9 / 11.7, pre_encoded=True, compiles_by_default=True),
    Case("clause attention, rule, pre-split", "clause/transformer_base_wmt16_ende_ca_rule.yaml",
         train_target=0.95, translate_target=0.97, pre_encoded=True),
    Case("GRET", "gret/transformer_base_wmt17_zhen_gret.yaml", train_target=0.95, translate_target=0.97,
         pre_encoded=True, compiles_by_default=True),
)
TINY_MECHANISMS = MECHANISMS
#: the dry run's training corpus: this many of the sample's lines, evenly spread over it (it is sorted by length),
#: since SentencePiece-encoding and clause-splitting all 21,977 took most of its preparation; repeated as varied
#: copies like the GPU run's
TINY_LINES = 2000
#: issue 35's targets for the baseline
BASELINE_TOKENS_TARGET = 100_000
BASELINE_BUSY_TARGET = 0.90
STOCK_SPEEDUP_TARGET = 3.0
#: issue 59: the baseline's target tok/s on the users' data path over the in-process baseline's, at the same batch
USERS_PATH_TARGET = 0.95
SYNCS_TARGET = 0
FIRST_STEP_TARGET_S = 5.0
STARTUP_OVERHEAD_TARGET_S = 1.0
#: peak memory of EM routing over the baseline's: (case, at most)
MEMORY_TARGETS = ((MECHANISMS[0], 2.0), (MECHANISMS[3], 4.0))

#: the A/A control's band: on a GPU its median should lie within it, else the report says so beside every ratio
#: of its group
AA_BAND = (0.97, 1.03)


def aa_summary(ratios, band=AA_BAND):
    """The A/A control's ratios summed up: their ``median``, an ``interval`` of the median with its ``coverage``
    (the distribution-free 95% interval from six ratios on, else their range, whose coverage is 1 - 2^(1-n)), and
    whether the median lies ``within`` ``band``; None without a ratio."""
    if not ratios:
        return None
    ordered, count = sorted(ratios), len(ratios)
    interval, coverage = timed_runs.median_interval(ordered), 0.95
    if interval is None:
        interval, coverage = (ordered[0], ordered[-1]), 1 - 2 ** (1 - count)
    median = statistics.median(ordered)
    return {"runs": count, "ratios": [round(ratio, 4) for ratio in ratios], "median": median,
            "interval": list(interval), "coverage": round(coverage, 3), "band": list(band),
            "within": band[0] <= median <= band[1]}


def aa_note(summary):
    """What the report says beside each ratio of a group whose A/A control is outside its band (None: within)."""
    if summary is None:
        return "no A/A run measured"
    if summary["within"]:
        return None
    return f"A/A {summary['median']:.3f}: outside {summary['band'][0]:g}-{summary['band'][1]:g}"


def aa_text(summary):
    """One line on a group's A/A control."""
    if summary is None:
        return "A/A control: no run measured"
    low, high = summary["interval"]
    few = " (fewer than 3 runs)" if summary["runs"] < 3 else ""
    return (f"A/A control: median {summary['median']:.3f} over {summary['runs']} runs{few}, interval "
            f"{low:.3f}-{high:.3f} ({summary['coverage']:.0%} coverage), "
            + ("within" if summary["within"] else "OUTSIDE") + f" {summary['band'][0]:g}-{summary['band'][1]:g}")
