"""tools/compare.py: log parsing, run naming and the report, from fixed inputs (no training)."""

import json
from pathlib import Path

import pytest

import compare
from onmt_ext import train_log

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
    assert "| 2 / 0 | — | 0.64 |" in text  # no across-seeds test in these rows
    text = compare.markdown({**report, "rows": compare.add_seed_tests(report["rows"])})
    assert "| 2 / 0 | +3.00 (2 / 0), p 0.500 | 0.64 |" in text
    assert "ignores the variance between seeds" in text and "smallest possible p is 0.500" in text
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
    assert test["deltas"] == [1.0, 1.0, 1.0] and test["p_value"] == 0.25 == test["min_p"]
    assert (test["better"], test["worse"]) == (3, 0)
    # deltas (2, 1, -1), |sum| 2: of the 8 sign patterns only (+2, -1, +1) and (-2, +1, -1) sum to 0, the
    # other six reach |sum| >= 2 (counted by hand): p = 6/8
    test = compare.seed_test([10.0, 10.0, 10.0], [12.0, 11.0, 9.0])
    assert test["p_value"] == 0.75 and (test["better"], test["worse"]) == (2, 1)
    assert test["mean_delta"] == 2 / 3
    # six seeds all better in the same direction can reach the 5% level (2/64); a bootstrap count cannot
    assert compare.seed_test([0.0] * 6, [1.0, 2.0, 0.5, 1.5, 1.0, 0.7])["p_value"] == 2 / 64
    assert compare.seed_test([0.0] * 2, [1.0, -1.0])["p_value"] == 1.0


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
    assert "beats the baseline from step 300 on, and earlier at step 100" in text
    assert "+1.00 (3 / 0), p 0.250" in text
    document = json.loads((tmp_path / "compare.json").read_text(encoding="utf-8"))
    assert document["rows"][1]["across_seeds"]["p_value"] == 0.25
    with pytest.raises(SystemExit):  # nothing is trained: a training option would be ignored
        compare.main(["--report-only", "--out", str(tmp_path), "--seeds", "4"])
    assert "--report-only takes only --out, not --seeds" in capsys.readouterr().err
    (tmp_path / "compare.json").write_text("{", encoding="utf-8")
    with pytest.raises(SystemExit, match="cannot read .*compare.json"):
        compare.main(["--report-only", "--out", str(tmp_path)])
