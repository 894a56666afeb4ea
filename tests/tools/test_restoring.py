"""The tools change OpenNMT-py only for the block that needs it, and put back exactly what was there (issue 60).

gpu_check's Meter and common.recording_training wrap OpenNMT-py's trainer, saver and builders, some of them
targets that onmt-ext's registry (onmt_ext.patches) wraps already: inside the block the tool's wrapper calls the
registry's, after it every target is the very object it was before (identity, not equality).
"""

import json
import time

import pytest

from tools import common
from tools.gpu_check import child, meter


def targets():
    """Every attribute of OpenNMT-py that the tools replace, as the objects the class or module holds."""
    from onmt import model_builder, train_single
    from onmt.models import model as models
    from onmt.models import model_saver
    from onmt.trainer import Trainer
    from onmt.utils.statistics import Statistics

    found = {f"Trainer.{name}": Trainer.__dict__[name] for name in ("_accum_batches", "_gradient_accumulation")}
    found.update({f"train_single.{name}": getattr(train_single, name)
                  for name in ("build_model", "build_dynamic_dataset_iter")})
    found.update({f"{cls.__name__}.count_parameters": cls.__dict__["count_parameters"]
                  for cls in (models.BaseModel, models.NMTModel, models.LanguageModel)})
    found["ModelSaverBase.save"] = model_saver.ModelSaverBase.__dict__["save"]
    found["Statistics.output"] = Statistics.__dict__["output"]
    found["model_builder.load_test_model"] = model_builder.load_test_model
    return found


def assert_same(before, after):
    changed = [name for name in before if after[name] is not before[name]]
    assert not changed, f"not put back: {changed}"


def test_the_meter_replaces_its_targets_inside_the_block_and_puts_back_the_same_objects(onmt_active):
    before = targets()
    with meter.Meter(cuda=False):
        inside = targets()
    assert_same(before, targets())
    replaced = {name for name in before if inside[name] is not before[name]}
    assert replaced == set(before) - {"model_builder.load_test_model"}  # (section c's, not the Meter's)


def test_the_meter_puts_back_its_targets_when_the_block_fails(onmt_active):
    before = targets()
    with pytest.raises(ZeroDivisionError):
        with meter.Meter(cuda=False):
            1 / 0
    assert_same(before, targets())


def test_the_meter_wraps_what_is_there_and_leaves_it_there(onmt_active, monkeypatch):
    """A target the registry wraps (train_single.build_model): the Meter's wrapper calls that wrapper, and it is
    there again after the block."""
    from onmt import train_single

    calls = []

    def registry_wrapper(*args, **kwargs):
        calls.append(args)
        return "model"

    monkeypatch.setattr(train_single, "build_model", registry_wrapper)
    with meter.Meter(cuda=False) as instrument:
        instrument.began = time.perf_counter()
        assert train_single.build_model is not registry_wrapper
        assert train_single.build_model("opt") == "model" and calls == [("opt",)]
        assert instrument.build_s is not None  # the Meter's own wrapper timed it
    assert train_single.build_model is registry_wrapper


def test_the_training_process_puts_back_every_target_when_it_returns(onmt_active, tmp_path):
    """child_train_many, the process that trains section b's rows, with a run that fails: its Meter is gone
    when it returns."""
    jobs = [{"key": "missing", "config": str(tmp_path / "missing.yaml"), "weight": 1.0, "deadline": 1e12,
             "tables_s": 0.0, "replay": False}]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    runs = tmp_path / "runs.jsonl"
    before = targets()
    child.child_train_many(tmp_path / "done.json", [tmp_path / "jobs.json", runs, 0.0, "cpu"], [])
    assert_same(before, targets())
    assert [entry["status"] for entry in common.read_json_lines(runs) if "status" in entry] == ["failed"]


def test_recording_training_records_inside_the_block_only(onmt_active):
    from onmt.utils.statistics import Statistics

    before, reports, parameters = targets(), [], {}
    with common.recording_training(reports, parameters):
        Statistics(loss=1.0, n_batchs=1, n_sents=1, n_words=7).output(3, 10, 0.1, time.time())
    Statistics(loss=1.0, n_batchs=1, n_sents=1, n_words=9).output(4, 10, 0.1, time.time())
    assert_same(before, targets())
    assert [(report["step"], report["tgt_tokens"]) for report in reports] == [(3, 7)]
