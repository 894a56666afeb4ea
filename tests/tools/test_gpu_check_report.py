"""tools/gpu_check/report.py on hand-made results (no process, no device): the targets table of one part, the
line that names the other parts' targets, and the A/A control's names.

Section b's rows come from the real plan (:func:`plan.training_plan` of a part's options) with hand-made
speeds, through :func:`training.training_ratios`, as the dry run's would; section c's rows are written out.
"""

import torch

from tools.gpu_check import cases, cli, plan, report, training

DEVICE = {"name": "cpu", "torch": torch.__version__, "cuda": None, "python": "3"}


def _report(argv, mode="cpu-tiny", status=None, decoded=None, c=None):
    """The report of ``python -m tools.gpu_check --device cpu --tiny <argv>`` with every training row measured
    (the baseline's runs 100 tok/s, the A/A control's 100, the other rows 80; ``status``: ``{row key: (status,
    reason)}`` for the rows that were not) and section c's beam-4 rows of ``decoded`` (``[(case, mode)]``, each
    measured at 0.99) or ``c`` as given."""
    args = cli.parse_args(["--device", "cpu", "--tiny", *argv])
    chosen = [case for case in cases.MECHANISMS if plan.paper_of(case) in args.cases]
    entries = plan.training_plan(args, chosen) if "b" in args.sections else []
    rows = [row for *_, group in entries for row, *_ in group]
    for ended, row in enumerate(rows):
        row.update(status="measured", tokens_per_s=100.0 if not row["reference"] or row["control"] else 80.0,
                   ended=float(ended), peak_memory_mb=1.0, command=f"onmt_train -config {row['name']}.yaml",
                   syncs_per_step=0.0, first_step_s=1.0, startup_s=2.0, busy_share=0.5, busy_share_unprofiled=0.4,
                   measure_steps=[5, 8], interval_points=[[6, 100.0], [8, 110.0]])
        if row["key"] in (status or {}):
            row.update(status=status[row["key"]][0], reason=status[row["key"]][1], tokens_per_s=None)
    sections = {}
    if "a" in args.sections:
        sections["a"] = {"status": "passed", "seconds": 1.0, "budget_s": 60.0, "runs": []}
    if rows:
        sections["b"] = {"status": "ran", "rows": rows, "batch_tokens": [512, 2048], "case_batch_tokens": 512,
                         **training.training_ratios(rows, cuda=mode == "cuda")}
    if "c" in args.sections:
        sections["c"] = c or {"status": "ran", "groups": [], "rows": [
            {"case": case.label, "mode": mode_, "search": "beam 4", "group": f"translate-{mode_}", "control": False,
             "target": case.translate_target, "status": "measured", "ratio": 0.99, "runs": 3}
            for case in chosen if case.translate_target for mode_ in ("eager", "compiled")
            if (case.label, mode_) in (decoded or ())]}
    result = {"device": DEVICE, "date": "", "command": "python -m tools.gpu_check", "mode": mode, "seconds": 1.0,
              "compile_backend": "eager", "commit": "test", "part": args.part, "fresh": plan.named_fresh(args),
              "cases": ", ".join(args.cases), "settings": {"sections": args.sections}, "parts": [],
              "sections": sections, "targets": report.targets_table(sections, mode == "cuda", (512, 2048), args.part)}
    return result, report.markdown(result)


def _targets(text):
    """The Targets section's table rows (cells) and the lines after the table."""
    section = text.split("## Targets (issues 29 and 35)")[1]
    table = [[cell.strip() for cell in line.split("|")[1:-1]] for line in section.splitlines()
             if line.startswith("| ") and not line.startswith("| measure |")]
    return table, [line for line in section.splitlines() if line and not line.startswith("|")]


def test_a_parts_targets_table_holds_its_own_targets_and_one_line_names_the_others():
    """A report of one part lists the targets of that part, none "not measured", and one line names what the
    other parts measure and their options (it listed every other part's target "n/a (not measured)")."""
    result, text = _report(["--part", "train-cases"], mode="cuda")
    table, after = _targets(text)
    assert [row[0].split(",")[0] for row in table] == ["training ratio"] * 9 + ["peak memory over the baseline's"] * 2
    assert not [row for row in table if row[2] == "n/a"]
    elsewhere, = [line for line in after if line.startswith("Other parts measure")]
    for words in ("the onmt-ext baseline on the users' path (tok/s, busy share, syncs, first step) and over stock "
                  "OpenNMT-py (speed, start-up): `--part train-fresh`",
                  "the users' path over the in-process run: `--part train`",
                  "the onmt-ext baseline on binarised data: `--part train-fresh --fresh ext,bin`",
                  "the decoding ratios (beam 4), eager: `--part decode-beam-eager`",
                  "the decoding ratios (beam 4), compiled: `--part decode-beam-compiled`"):
        assert words in elsewhere, elsewhere
    assert "train-cases" not in elsewhere

    _, text = _report(["--part", "train-fresh", "--fresh", "ext,aa"])  # no stock process: no ratio over it
    table, after = _targets(text)
    assert [row[0].split(" (")[0] for row in table] == [
        "baseline target tok/s, 2048-token batches in one pass", "GPU busy share of the baseline's step",
        "GPU busy share of the baseline's step", "host-device synchronisations per step between report steps",
        "first step after the model is built, s"]
    assert all(row[3] == "n/a (not a GPU run)" for row in table)
    elsewhere, = [line for line in after if line.startswith("Other parts")]
    assert "the onmt-ext baseline over stock OpenNMT-py (speed, start-up): `--part train-fresh`;" in elsewhere
    assert "the training ratios and peak memory: `--part train-cases`" in elsewhere

    _, text = _report(["--part", "props"])
    table, after = _targets(text)
    assert not table and "This run measures none of them." in after
    assert len([line for line in after if line.startswith("Other parts")]) == 1


def test_a_target_of_the_part_that_was_not_measured_stays_with_why():
    """A row the part planned but could not measure (cut for budget, failed) keeps its target row, which says
    why, on a GPU and in the dry run alike; a ratio whose reference failed names the reference."""
    batch = 512
    gret = f"{plan.IN_PROCESS}|GRET|compiled|{batch}"
    stock = f"{plan.FRESH_STOCK}|{plan.STOCK_LABEL}|eager|{batch}"
    for mode in ("cuda", "cpu-tiny"):
        result, text = _report(["--part", "train"], mode=mode, status={
            gret: ("not run", "budget"), stock: ("failed", "exit status 1 (see work/train.log)")})
        table, _ = _targets(text)
        cells = {row[0]: row[2:] for row in table}
        assert cells[f"training ratio, GRET, default path: compiled ({batch} tokens)"] == [
            "n/a", "n/a (not measured: not run: budget)"]
        over_stock = cells[f"onmt-ext baseline over stock OpenNMT-py, target tok/s, {batch}-token batches, same "
                           "config and run"]
        assert over_stock == ["n/a", f"n/a (not measured: its reference, {plan.STOCK_LABEL} ({plan.FRESH_STOCK}), "
                                     "failed: exit status 1 (see work/train.log))"]
        startup = cells["start-up overhead of onmt-ext over stock, s (process start to the end of the first step)"]
        assert startup[1].startswith("n/a (not measured: stock's row failed")
        judged = [row for row in table if row[2] != "n/a"]
        assert judged and all(row[3] == ("met" if mode == "cuda" else "n/a (not a GPU run)")
                              or (mode == "cuda" and row[3] == "NOT met") for row in judged)
        gret_json, = [row for row in result["targets"] if row["measure"].startswith("training ratio, GRET")]
        assert gret_json["measured"] is None and gret_json["reason"] == "not run: budget"


def test_a_run_of_every_part_shows_every_target_and_no_other_parts_line():
    """``--part all`` with every fresh process: each training and decoding target is its own row, measured, and
    no line sends the reader elsewhere."""
    decoded = [(case.label, mode) for case in cases.MECHANISMS for mode in ("eager", "compiled")]
    result, text = _report(["--fresh", "ext,stock,bin,aa,layers"], decoded=decoded)
    table, after = _targets(text)
    decoding = sum(case.translate_target is not None for case in cases.MECHANISMS) * 2
    training_ratios = sum(case.train_target is not None for case in cases.MECHANISMS)
    # ext: tok/s, 2 busy shares, 2 over stock; bin: tok/s; layers: tok/s, 2 busy shares, 2 over stock; users' path
    # over the in-process run (ext, bin); syncs, first step, start-up overhead
    assert len(table) == 5 + 1 + 5 + 2 + 3 + training_ratios + len(cases.MEMORY_TARGETS) + decoding
    assert all(row[2] != "n/a" for row in table), [row for row in table if row[2] == "n/a"]
    assert not [line for line in after if line.startswith("Other parts")]


def test_a_decoding_part_lists_its_groups_targets_and_says_why_when_its_section_did_not_run():
    """``--part decode-beam-eager --cases li2019,cao2019``: the eager beam-4 targets of those papers; the line names
    the compiled group's part and the other papers' call.  A section c that made no rows says so in one row."""
    chosen = [case for case in cases.MECHANISMS if plan.paper_of(case) in ("li2019", "cao2019")]
    _, text = _report(["--part", "decode-beam-eager", "--cases", "li2019,cao2019"],
                      decoded=[(case.label, "eager") for case in chosen])
    table, after = _targets(text)
    assert [row[0] for row in table] == [f"decoding ratio (beam 4), {case.label}, eager" for case in chosen]
    elsewhere, = [line for line in after if line.startswith("Other parts")]
    assert ("the decoding ratios (beam 4), eager: `--part decode-beam-eager --cases clause,gret`; the decoding "
            "ratios (beam 4), compiled: `--part decode-beam-compiled`.") in elsewhere

    c = {"status": "not run", "reason": "section b trained no baseline checkpoint", "groups": [], "rows": []}
    _, text = _report(["--part", "decode-beam-eager"], c=c)
    (measure, _, shown, met), = _targets(text)[0]
    assert measure.startswith("decoding ratios (beam 4)") and shown == "n/a"
    assert met == "n/a (not measured: section c not run: section b trained no baseline checkpoint)"
    _, text = _report(["--part", "decode-greedy-eager"], c=c)  # (greedy decoding has no target)
    assert _targets(text)[0] == []


def test_each_aa_control_is_named_once_and_its_runs_apart():
    """The users'-path A/A control's rows said "again (A/A control)" twice (its case and its process); the
    in-process A/A control's three runs each listed the same config line."""
    _, text = _report(["--part", "train-fresh", "--fresh", "ext,aa"])
    named = [line for line in text.splitlines() if plan.FRESH_AA in line]
    assert len(named) == 2 + 2 + 2 + 2  # table, over time, sync sites, configs: at 512 and 2048 tokens
    assert all(line.count("A/A control") == 1 for line in named), named
    assert "\n- onmt-ext baseline (onmt-ext again (A/A control), fresh process), 512 tokens: " in text

    _, text = _report(["--part", "train-cases"])
    configs = text.split("Configs trained:")[1].split("\n\n")[1].splitlines()
    assert len(configs) == len(set(configs))
    aa = [line for line in configs if "A/A control" in line]
    assert aa == ["- baseline, again (A/A control) (runs 1, 2 and 3), eager, in one process, 512: "
                  "`onmt_train -config eager.yaml`"]
    runs = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| baseline, again")]
    assert runs == [f"baseline, again (A/A control) (run {run})" for run in (1, 2, 3)]
    assert all(line.count("A/A control") <= 1 for line in text.splitlines() if line.startswith(("| ", "- ")))
