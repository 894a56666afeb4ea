"""onmt_ext.integration.progress: onmt_translate's progress on stderr (issue 58); the clock is a stand-in, no timing."""

import pytest

from onmt_ext.integration import progress


@pytest.fixture
def clock(monkeypatch):
    """``progress``'s clock, set by the test: ``clock[0]`` seconds."""
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    return now


def _lines(capsys):
    return capsys.readouterr().err.splitlines()


def test_without_a_terminal_a_line_after_the_first_batch_then_every_interval_and_at_the_end(clock, capsys):
    shown = progress.Progress(100, terminal=False)
    clock[0] += 2
    shown.update(10)
    assert _lines(capsys) == ["onmt_translate: 10/100 sentences (10%), 5.00 sentences/s, 00:02 elapsed, about 00:18 "
                              "left"]
    clock[0] += progress.INTERVAL - 1
    shown.update(40)
    assert _lines(capsys) == []
    clock[0] += 1
    shown.update(10)
    assert _lines(capsys) == ["onmt_translate: 60/100 sentences (60%), 1.28 sentences/s, 00:47 elapsed, about 00:31 "
                              "left"]
    shown.update(40)
    shown.close()
    assert _lines(capsys) == ["onmt_translate: 100/100 sentences (100%), 2.13 sentences/s, 00:47 elapsed, about "
                              "00:00 left"]


def test_on_a_terminal_a_tqdm_bar(capsys):
    shown = progress.Progress(3, terminal=True)
    for _ in range(3):
        shown.update(1)
    shown.close()
    err = capsys.readouterr().err
    assert "onmt_translate: 100%|" in err and "3/3 sentences [" in err


class _Batches:
    """A stand-in of OpenNMT-py's translation iterator: batches of the given sizes, and an attribute."""

    bucket_size = 7

    def __init__(self, sizes, fail_after=None):
        self.sizes, self.fail_after = sizes, fail_after

    def __iter__(self):
        for index, size in enumerate(self.sizes):
            if index == self.fail_after:
                raise RuntimeError("a batch failed")
            yield {"srclen": [0] * size}, 0


class _Recorded:
    def __init__(self):
        self.updates, self.closed = [], None

    def update(self, sentences):
        self.updates.append(sentences)

    def close(self, last_line=True):
        self.closed = last_line


def test_each_batch_counts_once_translated_and_the_iterator_is_otherwise_unchanged():
    recorded = _Recorded()
    counted = progress._Counted(_Batches([4, 4, 2]), recorded)
    assert counted.bucket_size == 7  # OpenNMT-py's loop reads it
    seen = []
    for batch, _ in counted:
        seen.append(len(batch["srclen"]))
        assert sum(recorded.updates) == sum(seen[:-1])  # counted when the next one is asked for
    assert seen == [4, 4, 2] and recorded.updates == [4, 4, 2] and recorded.closed is True


def test_a_failed_translation_gets_no_last_line():
    recorded = _Recorded()
    with pytest.raises(RuntimeError):
        for _ in progress._Counted(_Batches([4, 4, 2], fail_after=2), recorded):
            pass
    assert recorded.updates == [4] and recorded.closed is False


def test_long_lines_are_counted_and_told_once_with_the_longest():
    long_lines = progress.LongLines(100, "in.zh", "m.pt")
    recorded = _Recorded()
    batches = [{"srclen": [5, 2000, 101], "cid_line_number": [0, 1, 2]},
               {"srclen": [100, 300], "cid_line_number": [3, 4]}]
    assert [len(batch["srclen"]) for batch, _ in progress._Counted(iter([(b, 0) for b in batches]), recorded,
                                                                    long_lines)] == [3, 2]
    assert (long_lines.count, long_lines.longest, long_lines.line) == (3, 2000, 2)  # 100 is not longer than 100
    message = long_lines.message(5)
    assert message.startswith("onmt_translate: warning: -src in.zh: 3 of 5 lines are longer than any source m.pt "
                              "was trained on (its filtertoolong kept -src_seq_length 100 tokens); the longest, "
                              "line 2, has 2000 tokens.")
    assert "split such lines" in message and "\n" not in message
    assert progress.LongLines(100, "in.zh", "m.pt").message(5) is None
    one = progress.LongLines(100, "in.zh", "m.pt")
    one.add({"srclen": [101]})  # no line numbers (a list of sentences): the longest is "one"
    assert "1 of 1 lines is longer" in one.message(1) and "the longest, one, has 101 tokens" in one.message(1)


def test_the_training_length_is_known_only_when_every_corpus_was_filtered():
    from argparse import Namespace

    filtered = {"corpus_1": {"path_src": "a"}, "valid": {"path_src": "v", "transforms": []}}
    assert progress.training_length(Namespace(transforms=["sentencepiece", "filtertoolong"], data=filtered,
                                              src_seq_length=100)) == 100
    assert progress.training_length(Namespace(transforms=["sentencepiece"], data=filtered, src_seq_length=100)) is None
    own = {"corpus_1": {"transforms": ["filtertoolong"]}, "corpus_2": {"transforms": []}}
    assert progress.training_length(Namespace(transforms=["filtertoolong"], data=own, src_seq_length=100)) is None
    own["corpus_2"]["transforms"] = ["filtertoolong"]
    assert progress.training_length(Namespace(transforms=[], data=own, src_seq_length=80)) == 80
    assert progress.training_length(None) is None


def test_the_time_left_comes_from_the_rate_so_far_and_leaves_a_slow_start_out():
    run = progress.TrainingRun(first_step=1, start=1000.0)
    assert run.left(100, 1000, 1100.0) == 900.0  # 100 steps in 100 s (start included), 900 to go
    run.reported(100, 1100.0)
    assert run.left(200, 1000, 1150.0) == 400.0  # since the first report: 100 steps in 50 s
    assert run.left(1000, 1000, 1550.0) is None and run.left(10, 0, 1100.0) is None  # done; no -train_steps
    resumed = progress.TrainingRun(first_step=501, start=0.0)
    assert resumed.left(600, 1000, 50.0) == 200.0  # 100 steps of this run in 50 s
    assert progress.eta_text(754) == "about 12:34 left" and progress.eta_text(3723) == "about 1:02:03 left"


def test_the_training_report_ends_in_the_time_left(onmt_active, monkeypatch, caplog):
    """Through the patched Statistics.output: the Step line ends in the time left, once the run's start is known."""
    import logging

    from onmt.utils import Statistics

    monkeypatch.setattr(progress, "_RUNS", {})
    stats = Statistics(loss=10.0, n_words=10, n_correct=5, n_sents=2)
    stats.n_src_words, stats.n_batchs = 10, 1
    now = progress.time.time()
    with caplog.at_level(logging.INFO, logger="onmt"):
        stats.output(100, 1000, 0.001, now - 100)  # a run not started by a Trainer: the stock line
        progress._RUNS[now - 100] = progress.TrainingRun(1, now - 100)
        stats.output(100, 1000, 0.001, now - 100)
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Step")]
    assert len(lines) == 2 and lines[0].endswith(" sec;")
    assert lines[1].split(" sec;")[1] in (" about 15:00 left;", " about 15:01 left;")  # 900 steps at 1 a second


def test_a_silent_training_writes_a_line_between_reports():
    """Steps of 20 s with a report every 10 steps: a line once 45 s passed without one, never on a report step."""
    run = progress.TrainingRun(first_step=1, start=0.0)
    lines = {step: progress.heartbeat(run, step, 50, 10, step * 20.0) for step in range(1, 10)}
    assert [step for step, line in lines.items() if line] == [3, 6, 9]
    assert lines[3] == "onmt-ext: at step 3/50, about 15:40 left (the next report is at step 10)"  # 47 steps of 20 s
    run.reported(10, 200.0)  # the Step line of step 10
    assert progress.heartbeat(run, 11, 50, 10, 220.0) is None and progress.heartbeat(run, 20, 50, 10, 400.0) is None
    assert progress.heartbeat(run, 12, 0, 10, 400.0) == "onmt-ext: at step 12 (the next report is at step 20)"
    assert progress.heartbeat(run, 50, 50, 7, 999.0) is None  # the last step (no report): training ends there
