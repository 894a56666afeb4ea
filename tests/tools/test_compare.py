"""tools/compare.py: log parsing, run naming and the report, from fixed inputs (no training)."""

import json
import math
import statistics
from pathlib import Path

import pytest

from tools import compare
from onmt_ext.runtime import train_log

LOG = """[2026-11-23 12:26:01,531 INFO] * number of parameters: 5689032
[2026-11-23 12:26:01,531 INFO] Step  5/  600; acc: 1.0; ppl: 900.0; xent: 6.8; lr: 0.00001; sents:     100; bsz:  731/ 831/106; 1000/1200 tok/s;      3 sec;
[2026-11-23 12:26:33,044 INFO] Step 200/  600; acc: 32.0; ppl: 167.3; xent: 5.1; lr: 0.00110; sents:    8513; bsz:  729/ 838/85; 2314/2660 tok/s;     66 sec;
[2026-11-23 12:26:59,983 INFO] Step 300/  600; acc: 36.7; ppl: 105.9; xent: 4.7; lr: 0.00090; sents:    8129; bsz:  722/ 821/81; 2680/3040 tok/s;     93 sec;
"""


def test_speed_leaves_out_the_first_report_and_reads_target_tokens():  # the reader compare.score uses
    assert train_log.parse(LOG).tokens_per_second() == (2660 + 3040) / 2
    assert train_log.parse(LOG).parameters == 5689032
    assert train_log.parse("no reports").tokens_per_second() is None


def test_translations_are_named_after_steps_and_test_lines(tmp_path):
    a = compare.Run("gret", 1, tmp_path, 600)
    b = compare.Run("gret", 1, tmp_path, 20, test_lines=50)
    assert a.hypotheses.name == "test.step600.all.hyp.en" and b.hypotheses.name == "test.step20.50.hyp.en"
    assert compare.checkpoint(b).name == "model_step_20.pt"


def test_translate_command_splits_clause_sources_like_training(tmp_path):
    run = compare.Run("clause_ca_rule", 2, tmp_path, 600)
    command = compare.translate_command(run, Path("test.zh"))
    after = command[command.index("-transforms") + 1:]
    transforms = after[:next(i for i, part in enumerate(after) if part.startswith("-"))]
    assert transforms == ["sentencepiece", "clause_split"]
    assert command[command.index("-clause_lang") + 1] == "zh"
    base = compare.translate_command(compare.Run("baseline", 2, tmp_path, 600), Path("test.zh"))
    assert "clause_split" not in base


def _row(config, bleus, deltas=None, speed=1000.0):
    seeds = []
    for k, bleu in enumerate(bleus):
        entry = {"seed": k + 1, "bleu": bleu}
        if deltas:
            entry.update(delta=deltas[k], p_value=0.001 if abs(deltas[k]) > 1 else 0.4, marker="‡")
        seeds.append(entry)
    return {"config": config, "label": config, "file": f"yaml_configs/compare/{config}.yaml", "bleu_mean": sum(bleus) / len(bleus),
            "bleu_sd": 0.5, "chrf_mean": 40.0, "chrf_sd": 0.1, "tok_per_s": speed, "parameters": 100,
            "speed_ratio": speed / 1000.0, "significant_better": sum(d > 1 for d in deltas or []),
            "significant_worse": sum(d < -1 for d in deltas or []), "seeds": seeds}


def test_report_from_fixed_results(tmp_path):
    report = {"seeds": [1, 2], "train_steps": 600, "jobs": 2, "threads": 1, "test_sentences": 2601,
              "wall_seconds": 600.0, "command": "python tools/compare.py",
              "rows": [_row("baseline", [18.0, 19.0]), _row("li2019_em", [22.0, 21.0], [4.0, 2.0], speed=640.0)]}
    text = compare.markdown(report)
    assert "| baseline (`yaml_configs/compare/baseline.yaml`) | 18.50 ± 0.50 |" in text
    assert "| 2 / 0 | — | — | 0.64 |" in text  # no across-seeds test in these rows
    rows = compare.add_seed_tests(report["rows"])
    assert set(rows[1]["across_seeds"]) == {"bleu"}  # the rows hold no per-seed chrF: no chrF test
    assert rows[1]["across_seeds"]["bleu"]["exact_p"] == 0.5 and "verdict" in rows[1]
    assert "| 2 / 0 | +3.00 (2 / 0); 0.500; " in compare.markdown({**report, "rows": rows})
    assert "22.00 (+4.00, p 0.001 ‡)" in text
    assert "10.0 min" in text
    compare.plot(report, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_a_report_that_reuses_runs_names_the_invocations_that_trained_them():
    first = {"command": "python tools/compare.py", "wall_seconds": 3000.0, "estimate_text": "x",
             "run_logs": {"baseline/seed1": 1.0, "gret/seed1": 2.0}}
    logs = {"baseline/seed1": 1.0, "gret/seed1": 2.0, "new/seed1": 3.0}
    assert compare.earlier_invocations(first, [], logs) == []  # nothing reused: a report of its own
    earlier = compare.earlier_invocations(first, ["baseline/seed1", "gret/seed1"], logs)
    assert earlier == [{"command": "python tools/compare.py", "wall_seconds": 3000.0, "estimate_text": "x"}]
    # a reused run retrained since (another log) or unknown to the previous report: its provenance is not known
    assert compare.earlier_invocations(first, ["gret/seed1"], {**logs, "gret/seed1": 9.0}) is None
    assert compare.earlier_invocations(None, ["gret/seed1"], logs) is None
    second = {**first, "earlier_invocations": earlier, "command": "python tools/compare.py --max-steps 9",
              "wall_seconds": 600.0, "run_logs": logs}
    assert len(compare.earlier_invocations(second, ["new/seed1"], logs)) == 2
    assert compare.earlier_invocations({**second, "earlier_invocations": None}, ["new/seed1"], logs) is None

    report = {"seeds": [1], "train_steps": 600, "jobs": 2, "threads": 1, "test_sentences": 10,
              "wall_seconds": 600.0, "command": "python tools/compare.py --max-steps 9",
              "rows": [_row("baseline", [18.0])], "reused_runs": ["baseline/seed1", "gret/seed1"],
              "earlier_invocations": earlier}
    assert ("Wall-clock time: 60.0 min in 2 invocations sharing the runs of the work folder: 50.0 min "
            "(`python tools/compare.py`), then 10.0 min (`python tools/compare.py --max-steps 9`), which reused 2 "
            "finished runs.") in compare.markdown(report)
    assert "does not record them" in compare.markdown({**report, "earlier_invocations": None})
    assert "of the whole comparison: 10.0 min" in compare.markdown({**report, "earlier_invocations": []})


def test_the_seed_test_is_an_exact_sign_flip_test_over_the_seeds():
    # three seeds all better: only the all-plus and all-minus sign patterns reach |mean| 1.0: p = 2/8
    test = compare.seed_test([20.0, 21.0, 22.0], [21.0, 22.0, 23.0])
    assert test["deltas"] == [1.0, 1.0, 1.0] and test["exact_p"] == 0.25 == test["min_p"]
    assert (test["better"], test["worse"]) == (3, 0)
    # deltas (2, 1, -1), |sum| 2: of the 8 sign patterns only (+2, -1, +1) and (-2, +1, -1) sum to 0, the
    # other six reach |sum| >= 2 (counted by hand): p = 6/8
    test = compare.seed_test([10.0, 10.0, 10.0], [12.0, 11.0, 9.0])
    assert test["exact_p"] == 0.75 and (test["better"], test["worse"]) == (2, 1)
    assert test["mean_delta"] == 2 / 3
    # six seeds all better in the same direction can reach the 5% level (2/64); a bootstrap count cannot
    assert compare.seed_test([0.0] * 6, [1.0, 2.0, 0.5, 1.5, 1.0, 0.7])["exact_p"] == 2 / 64
    assert compare.seed_test([0.0] * 2, [1.0, -1.0])["exact_p"] == 1.0


def _t_tail(t, df, steps=20000):
    """Two-sided tail of Student's t by Simpson's rule over its density from 0 to |t| (independent of the code)."""
    density = lambda x: (math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
                         * (1 + x * x / df) ** (-(df + 1) / 2))
    h = abs(t) / steps
    area = sum((1 if k in (0, steps) else 4 if k % 2 else 2) * density(k * h) for k in range(steps + 1)) * h / 3
    return 1 - 2 * area


@pytest.mark.parametrize("deltas", [[1.0, 2.0], [1.0, 2.0, 3.0], [1.16, 1.01, 1.34], [0.3, -0.2, 0.5, 0.1],
                                    [1.0, 2.0, 0.5, 1.5, 1.0, 0.7], [0.2, -0.4, 0.1, 0.3, -0.1, 0.6, 0.0]])
def test_the_t_test_matches_the_t_distribution(deltas):
    t, p = compare.t_test_p(deltas)
    n = len(deltas)
    assert t == pytest.approx(statistics.fmean(deltas) / statistics.stdev(deltas) * math.sqrt(n))
    assert p == pytest.approx(_t_tail(t, n - 1), abs=1e-6)
    if n == 3:  # two degrees of freedom: the tail is 1 - t / sqrt(t^2 + 2) exactly
        assert p == pytest.approx(1 - abs(t) / math.sqrt(t * t + 2), abs=1e-12)
    assert compare.t_test_p([1.0] * n) == (math.inf, 0.0) and compare.t_test_p([0.0] * n)[1] == 1.0


def test_holm_multiplies_the_kth_smallest_by_m_minus_k_plus_1_and_keeps_the_order():
    assert compare.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert compare.holm([0.5, 0.2]) == [0.5, 0.4] and compare.holm([0.6, 0.7]) == [1.0, 1.0] and compare.holm([]) == []


def _seeds(bleus, chrfs):
    return [{"seed": k + 1, "bleu": b, "chrf": c} for k, (b, c) in enumerate(zip(bleus, chrfs))]


def test_a_verdict_needs_a_holm_adjusted_p_below_005_and_names_its_metric():
    base = {"config": "baseline", "seeds": _seeds([30.0] * 6, [50.0] * 6)}
    gain = {"config": "gain",
            "seeds": _seeds([31.0, 31.2, 30.9, 31.1, 31.0, 30.8], [50.3, 49.6, 50.4, 49.8, 50.1, 50.0])}
    none = {"config": "none",
            "seeds": _seeds([30.5, 29.4, 30.2, 29.9, 30.1, 29.6], [50.2, 49.9, 50.1, 49.7, 50.3, 50.0])}
    rows = compare.add_seed_tests([base, gain, none])
    bleu = rows[1]["across_seeds"]["bleu"]
    assert bleu["exact_p"] == 2 / 64 and bleu["exact_p_holm"] == 4 / 64  # two configs: the smaller p times 2
    assert bleu["t_p_holm"] == 2 * bleu["t_p"] < 0.05 and rows[1]["across_seeds"]["chrf"]["t_p_holm"] > 0.05
    assert rows[1]["verdict"].startswith("better than the baseline in BLEU") and "not shown apart in chrF" in \
        rows[1]["verdict"]
    assert rows[2]["verdict"].startswith("not shown apart") and "better" not in rows[2]["verdict"]
    worse = {"config": "worse", "seeds": [{**e, "bleu": 60 - e["bleu"]} for e in gain["seeds"]]}
    assert compare.add_seed_tests([base, worse])[1]["verdict"].startswith("worse than the baseline in BLEU")


def test_step_verdicts_only_when_corrected_for_the_number_of_looks():
    steps = range(100, 1800, 100)  # 17 looks, as in the committed report
    verdicts = {s: "better" if s >= 1000 else "tie" for s in steps}
    text, looks = compare.looks_verdict(verdicts, 6)  # 17 x 2 / C(12, 6) = 0.037
    assert looks["family_p"] == pytest.approx(17 * 2 / 924) and text.startswith("beats the baseline from step 1000")
    text, looks = compare.looks_verdict(verdicts, 3)  # 17 x 2 / C(6, 3) = 1.7: no step may be named
    assert looks["family_p"] == 1.0 and text.startswith("no verdict") and "1000" not in text


def test_the_verdict_names_earlier_leads_besides_the_last_one():
    steps = [100, 200, 300, 400, 1000]
    clause = dict(zip(steps, ["tie", "better", "tie", "tie", "better"]))  # clause attention's committed curve
    assert compare.verdict_text(clause) == "beats the baseline from step 1000 on, and earlier at step 200"
    assert compare.verdict_text(dict(zip(steps, ["better"] * 5))) == "beats the baseline from step 100 on"
    mixed = dict(zip(steps, ["worse", "tie", "better", "better", "better"]))
    assert compare.verdict_text(mixed) == "beats the baseline from step 300 on; behind the baseline at step 100"
    lost = dict(zip(steps, ["better", "better", "tie", "better", "tie"]))
    assert compare.verdict_text(lost) == "beats the baseline at steps 100-200, 400; not at the last step"
    assert compare.verdict_text(dict(zip(steps, ["tie"] * 5))).startswith("never apart")


def test_report_only_rewrites_the_report_from_its_json(tmp_path, capsys):
    report = {"seeds": [1, 2, 3], "train_steps": 300, "jobs": 2, "threads": 1, "test_sentences": 10,
              "wall_seconds": 60.0, "command": "python tools/compare.py",
              "rows": [_row("baseline", [18.0, 19.0, 20.0]), _row("clause_ca_rule", [19.0, 20.0, 21.0], [1, 1, 1])],
              "curves": {"baseline": {"step": [100, 200, 300], "mean": [9, 8, 7], "min": [9, 8, 7], "max": [9, 8, 7]},
                         "clause_ca_rule": {"step": [100, 200, 300], "mean": [9, 8, 7], "min": [9, 8, 7],
                                            "max": [9, 8, 7], "verdicts": {"100": "better", "200": "tie",
                                                                           "300": "better"},
                                            "verdict": "beats the baseline from step 300 on"}}}
    (tmp_path / "compare.json").write_text(json.dumps(report), encoding="utf-8")
    assert compare.main(["--report-only", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "compare.md").read_text(encoding="utf-8")
    assert "no verdict" in text and "beats the baseline from step 300" not in text  # 3 looks x 0.1 per look
    document = json.loads((tmp_path / "compare.json").read_text(encoding="utf-8"))
    assert document["rows"][1]["across_seeds"]["bleu"]["exact_p"] == 0.25
    assert document["curves"]["clause_ca_rule"]["family_p"] == pytest.approx(0.3)
    with pytest.raises(SystemExit):  # nothing is trained: a training option would be ignored
        compare.main(["--report-only", "--out", str(tmp_path), "--seeds", "4"])
    assert "--report-only takes only --out, not --seeds" in capsys.readouterr().err
    (tmp_path / "compare.json").write_text("{", encoding="utf-8")
    with pytest.raises(SystemExit, match="cannot read .*compare.json"):
        compare.main(["--report-only", "--out", str(tmp_path)])


def test_the_probe_is_reported_again_only_when_every_run_is_reused():
    """Nothing is estimated when all runs are finished, so the last report's probe stands in for a new one;
    a run still to train, or a config it did not probe, needs the probe."""
    previous = {"probe": {"a": {"step": 0.5, "valid": 2.0, "startup": 9.0}, "b": {"step": 0.7, "valid": 2.5,
                                                                              "startup": 9.5}}}
    assert compare.reused_probe(previous, ["a", "b"], True) == {"a": compare.Speed(0.5, 2.0, 9.0),
                                                                "b": compare.Speed(0.7, 2.5, 9.5)}
    assert compare.reused_probe(previous, ["a", "b"], False) is None
    assert compare.reused_probe(previous, ["a", "c"], True) is None
    assert compare.reused_probe(None, ["a"], True) is None
    assert compare.reused_probe({"probe": None}, ["a"], True) is None
