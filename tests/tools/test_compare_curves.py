"""The shared training-log reader, the plateau rule, the beats-the-baseline rule and the run estimate of
tools/compare.py, from fixed inputs (no training).

tests/fixtures/train_log_excerpt.txt is the ``-log_file`` of a real 20-step
run of yaml_configs/compare/baseline.yaml (``-valid_steps 10 -report_every
5``) with the model's printout cut out.
"""

import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from tools import compare
from tools import reproduce
from onmt_ext.runtime import train_log

FIXTURE = ROOT / "tests" / "fixtures" / "train_log_excerpt.txt"
TEXT = FIXTURE.read_text(encoding="utf-8")


def _without(text, *fragments):
    """The text without the lines that contain any of ``fragments``."""
    return "\n".join(line for line in text.splitlines() if not any(f in line for f in fragments)) + "\n"


# ---------------------------------------------------------------- the log reader


def test_real_log_gives_step_and_validation_records_and_the_parameter_count():
    log = train_log.read(FIXTURE)
    assert log.parameters == 5689032 and log.valid_every == 10
    assert [r.step for r in log.steps] == [5, 10, 15, 20]
    step10 = log.steps[1]
    assert (step10.total, step10.acc, step10.ppl, step10.xent, step10.lr) == (20, 0.1, 3122.6, 8.0, 0.00006)
    assert (step10.src_tok_s, step10.tgt_tok_s, step10.seconds) == (992.0, 1162.0, 11.0)
    assert [r.after_validation for r in log.steps] == [False, False, True, False]
    assert [(r.step, r.ppl, r.acc) for r in log.valid] == [(10, 2783.18, 1.56875), (20, 1844.45, 6.01866)]
    assert log.valid[0].seconds == pytest.approx(2.926345, abs=1e-6)
    assert log.valid_seconds() == pytest.approx((2.926345109939575 + 4.905939340591431) / 2)
    assert log.last_step() == 20


def test_speeds_leave_out_the_first_report_and_the_intervals_with_a_validation():
    log = train_log.read(FIXTURE)
    assert log.tokens_per_second() == (1162 + 781) / 2  # step 15's 499 tok/s include a validation
    # only 15 -> 20 qualifies: 08:30:55.457 to 08:31:00.425
    assert log.seconds_per_step() == pytest.approx(4.968 / 5)


def test_validations_between_reports_get_the_next_multiple_of_valid_steps():
    # as with report_every > valid_steps: no Step line at 10 (its validation follows the report of step 5)
    log = train_log.parse(_without(TEXT, "Step 10/"))
    assert [r.step for r in log.valid] == [10, 20]
    # two validations with no report between them: the second is one valid_steps later
    log = train_log.parse(_without(TEXT, "Step 10/", "Step 15/", "Step 20/"))
    assert [(r.step, r.ppl) for r in log.valid] == [(10, 2783.18), (20, 1844.45)]


def test_without_the_validate_every_line_a_validation_takes_the_last_reported_step():
    log = train_log.parse(_without(TEXT, "validate every"))
    assert log.valid_every is None and [r.step for r in log.valid] == [10, 20]
    assert train_log.parse(_without(TEXT, "validate every", "Step ")).valid == []


def test_a_resumed_log_keeps_the_last_values_of_a_step():
    resumed = TEXT + TEXT.replace("Validation perplexity: 1844.45", "Validation perplexity: 1800")
    log = train_log.parse(resumed)
    assert [r.step for r in log.steps] == [5, 10, 15, 20]
    assert [(r.step, r.ppl) for r in log.valid] == [(10, 2783.18), (20, 1800.0)]


def test_missing_or_foreign_text_gives_empty_records():
    assert train_log.read(FIXTURE.parent / "no_such.log") == train_log.TrainLog()
    log = train_log.parse("Traceback (most recent call last):\nValueError: x\n")
    assert log.steps == [] and log.valid == [] and log.parameters is None
    assert log.tokens_per_second() is None and log.seconds_per_step() is None and log.valid_seconds() is None


def test_the_tools_read_logs_through_the_shared_reader():
    curves = reproduce.parse_train_log(TEXT)
    assert curves["train"]["step"] == [5, 10, 15, 20] and curves["train"]["xent"] == [8.3, 8.0, 7.6, 7.4]
    assert curves["valid"] == {"step": [10, 20], "acc": [1.56875, 6.01866], "ppl": [2783.18, 1844.45]}
    log = train_log.parse(TEXT)  # what compare.score reads from each run's log
    assert log.tokens_per_second() == (1162 + 781) / 2 and log.parameters == 5689032


# ---------------------------------------------------------------- the plateau rule


def test_plateau_is_the_first_step_the_window_does_not_improve_enough():
    steps = [100, 200, 300, 400, 500, 600, 700, 800]
    values = [50.0, 20.0, 12.0, 10.0, 9.95, 9.92, 9.90, 9.89]
    # at 400 the next 200 steps reach 9.92, less than 1% below 10.0
    assert compare.find_plateau(steps, values, 200, 0.01, 1000) == (400, True)
    # with 0.4%: 400 -> 9.95 < 9.96 and 500 -> 9.90 < 9.9102 still count; 600 -> 9.89 > 9.88 does not
    assert compare.find_plateau(steps, values, 200, 0.004, 1000) == (600, True)


def test_plateau_waits_for_the_whole_window_and_stops_at_the_cap():
    steps, values = [100, 200, 300], [30.0, 20.0, 19.9]
    assert compare.find_plateau(steps, values, 200, 0.01, 1000) is None  # 200's window reaches 400
    assert compare.find_plateau([], [], 200, 0.01, 1000) is None
    falling = [100, 200, 300, 400, 500]
    assert compare.find_plateau(falling[:3], [50.0, 40.0, 30.0], 100, 0.01, 300) is None  # 300's window open
    assert compare.find_plateau(falling, [50.0, 40.0, 30.0, 20.0, 10.0], 100, 0.01, 300) == (300, False)
    assert compare.find_plateau(falling, [50.0, 40.0, 30.0, 20.0, 10.0], 100, 0.01, 400) == (400, False)
    # the cap itself may be the plateau once its window is seen
    assert compare.find_plateau(falling, [50.0, 40.0, 30.0, 20.0, 20.0], 100, 0.01, 400) == (400, True)


def test_a_rising_curve_plateaus_at_its_minimum():
    steps, values = [100, 200, 300, 400, 500], [10.0, 8.0, 7.0, 7.5, 8.0]
    assert compare.find_plateau(steps, values, 200, 0.01, 1000) == (300, True)


def test_mean_curve_uses_the_steps_every_seed_has():
    logs = [train_log.TrainLog(valid=[train_log.ValidRecord(s, p) for s, p in curve])
            for curve in ([(10, 5.0), (20, 4.0), (30, 3.0)], [(10, 7.0), (20, 6.0)])]
    assert compare.seed_curves(logs) == {10: [5.0, 7.0], 20: [4.0, 6.0]}
    assert compare.seed_curves([]) == {}


# ---------------------------------------------------------------- the beats-the-baseline rule


def test_a_config_beats_the_baseline_only_where_the_seed_ranges_do_not_overlap():
    base = {100: [10.0, 10.5, 11.0], 200: [8.0, 8.2, 8.4], 300: [7.0, 7.1, 7.2]}
    other = {100: [10.9, 12.0, 12.5], 200: [7.5, 7.9, 7.95], 300: [7.3, 7.4, 7.5], 400: [1.0, 1.0, 1.0]}
    assert compare.compare_at_steps(base, other) == {100: "tie", 200: "better", 300: "worse"}


def test_from_which_step_counts_only_a_lead_kept_to_the_end():
    verdicts = {100: "worse", 200: "tie", 300: "better", 400: "tie", 500: "better", 600: "better"}
    assert compare.sustained_from(verdicts, "better") == 500
    assert compare.sustained_from(verdicts, "worse") is None
    assert compare.verdict_text(verdicts) == \
        "beats the baseline from step 500 on, and earlier at step 300; behind the baseline at step 100"
    assert compare.verdict_text({100: "worse", 200: "worse"}) == "behind the baseline from step 100 on"
    assert compare.verdict_text({100: "better", 200: "better", 300: "tie"}) == \
        "beats the baseline at steps 100-200; not at the last step"
    assert compare.verdict_text({100: "better", 200: "tie", 300: "better", 400: "worse", 500: "tie"}) == \
        "beats the baseline at steps 100, 300; behind the baseline at step 400; not at the last step"
    assert compare.verdict_text({100: "tie"}).startswith("never apart")
    assert compare.verdict_text({}) == "no common validation step"


def test_the_rule_is_a_one_in_twenty_chance_for_three_seeds_each():
    # all three of one set below all three of the other, in a given direction, among the orderings of six runs
    assert 1 / math.comb(6, 3) == 0.05


def test_paper_claims_come_from_the_reproduce_tables():
    assert compare.paper_claim("li2019_em").startswith("+0.97 BLEU (27.31 -> 28.28)")
    assert compare.paper_claim("chen2019_mprhead").startswith("+1.10 BLEU (27.25 -> 28.35)")
    assert compare.paper_claim("chen2019_rpehead").startswith("+0.86 BLEU (27.25 -> 28.11)")
    assert "not legible" in compare.paper_claim("gret") and compare.paper_claim("baseline") == ""
    assert set(compare.PAPER_CLAIMS) == set(compare.CONFIGS) - {"baseline"}


# ---------------------------------------------------------------- the estimate


def _speeds(**steps):
    return {name: compare.Speed(step=s, valid=2.0, startup=10.0) for name, s in steps.items()}


def test_runs_are_scheduled_on_the_first_free_worker():
    assert compare.schedule_seconds([3.0, 3.0, 3.0], 2) == 6.0
    assert compare.schedule_seconds([5.0, 1.0, 1.0, 1.0], 2) == 5.0
    assert compare.schedule_seconds([], 2) == 0.0


def test_estimate_counts_the_baseline_search_and_the_other_runs():
    speeds = _speeds(baseline=0.3, other=0.5)
    est = compare.estimate(speeds, ["baseline", "other"], [1, 2, 3], 2, 1000, 400, 100, 20.0)
    # baseline: 3 seeds on 2 jobs -> 1.5 x (0.3 s x 1400 steps + 2 s x 14 validations) + 10 s start-up
    assert est["baseline"] == pytest.approx(10 + 1.5 * (0.3 * 1400 + 2 * 14))
    one = 10 + 0.5 * 1000 + 2 * 10 + 20.0
    assert est["others"] == pytest.approx(2 * one + 2 * 20.0)  # 3 runs on 2 slots, then 2 rounds of translation
    assert est["total"] == pytest.approx(est["baseline"] + est["others"])


def test_the_chosen_cap_is_the_largest_that_fits_the_budget():
    speeds = _speeds(baseline=0.3, other=0.5)
    args = (speeds, ["baseline", "other"], [1, 2, 3], 2, 400, 100, 20.0)
    cap = compare.choose_max_steps(*args, 3600.0)
    assert cap % 100 == 0
    assert compare.estimate(*args[:4], cap, *args[4:])["total"] <= 3600.0
    assert compare.estimate(*args[:4], cap + 100, *args[4:])["total"] > 3600.0
    assert compare.choose_max_steps(*args, 1.0) == 100  # never below one validation interval


# ---------------------------------------------------------------- the report


def _report():
    base = {"step": [100, 200, 300], "mean": [20.0, 12.0, 10.0], "min": [19.0, 11.5, 9.8], "max": [21.0, 12.5, 10.2],
            "seeds": {"1": [19.0, 11.5, 9.8], "2": [21.0, 12.5, 10.2]}}
    other = {"step": [100, 200, 300], "mean": [22.0, 11.0, 9.0], "min": [21.5, 10.8, 8.9], "max": [22.5, 11.2, 9.1],
             "seeds": {"1": [21.5, 10.8, 8.9], "2": [22.5, 11.2, 9.1]},
             "verdict": "beats the baseline from step 200 on", "paper": compare.paper_claim("li2019_em")}
    row = {"config": "x", "label": "x", "file": "f", "bleu_mean": 20.0, "bleu_sd": 0.5, "chrf_mean": 40.0,
           "chrf_sd": 0.2, "tok_per_s": 1.0, "parameters": 10, "speed_ratio": 1.0, "significant_better": 0,
           "significant_worse": 0, "seeds": [{"seed": 1, "bleu": 20.0}, {"seed": 2, "bleu": 20.0}]}
    return {"seeds": [1, 2], "train_steps": 300, "jobs": 2, "threads": 1, "test_sentences": 100,
            "wall_seconds": 60.0, "command": "python tools/compare.py", "estimate_text": "about 1 min",
            "plateau": {"rule": "r", "window": 200, "tolerance": 0.01, "valid_every": 100, "max_steps": 300,
                        "step": 300, "found": False, "valid_set": "build/tatoeba/valid.{zh,en}"},
            "rows": [row, dict(row, config="y", label="y")], "curves": {"baseline": base, "li2019_em": other}}


def test_report_states_the_rules_and_puts_the_papers_claim_beside_each_curve(tmp_path):
    text = compare.markdown(_report())
    assert "had not plateaued by step 300 (the cap)" in text and "by less than 1.0%" in text
    assert "![validation perplexity, mean and min-max over the seeds](curves.png)" in text
    assert "| li2019_em | 9.00 (8.90-9.10) | beats the baseline from step 200 on | +0.97 BLEU" in text
    assert "probability 2/C(4,2) = 0.333" in text  # two seeds each, either way
    compare.plot_curves(_report(), tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 10000


def test_a_finished_run_is_reused_only_when_its_log_holds_every_validation(tmp_path, monkeypatch):
    run = compare.Run("baseline", 1, tmp_path, 20)
    (tmp_path / "model_step_20.pt").write_bytes(b"")
    run.train_log.write_text(TEXT, encoding="utf-8")  # validations at 10 and 20
    started = []
    monkeypatch.setattr(compare, "_execute", lambda command, threads, log: started.append(command) or 1.0)
    compare.train_run(run, 1, 10, 5)
    assert started == []
    compare.train_run(run, 1, 5, 5)  # a log of another validation interval: trained again, from scratch
    assert len(started) == 1 and "-valid_steps" in started[0] and not run.train_log.exists()


def test_the_estimate_leaves_out_the_runs_an_invocation_reuses(tmp_path):
    speeds = _speeds(baseline=0.3, other=0.5)
    args = (speeds, ["baseline", "other"], [1, 2], 2, 1000, 0, 100, 20.0, False)
    one = {"baseline": 10 + 0.3 * 1000 + 2 * 10 + 20.0, "other": 10 + 0.5 * 1000 + 2 * 10 + 20.0}
    assert compare.estimate(*args)["total"] == pytest.approx(2 * one["other"])  # 2 slots: the others' runs last
    left = compare.estimate(*args, frozenset({("baseline", 1), ("other", 1), ("other", 2)}))
    assert left["total"] == pytest.approx(one["baseline"])  # baseline seed 2 alone
    for seed, hypotheses in ((1, True), (2, False)):  # seed 1: trained and translated; seed 2: trained only
        run = compare.Run("baseline", seed, tmp_path / "baseline" / f"seed{seed}", 20)
        run.directory.mkdir(parents=True)
        compare.checkpoint(run).write_bytes(b"")
        run.train_log.write_text(TEXT, encoding="utf-8")  # validations at 10 and 20
        if hypotheses:
            run.hypotheses.write_text("a\n", encoding="utf-8")
    assert compare.finished_runs(["baseline", "other"], [1, 2], tmp_path, 20, None, 10) == {("baseline", 1)}
    assert compare.finished_runs(["baseline"], [1], tmp_path, 20, None, 5) == frozenset()  # other validations
