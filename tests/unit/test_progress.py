"""onmt_ext.progress: onmt_translate's progress on stderr (issue 58); the clock is a stand-in, no timing."""

import pytest

from onmt_ext import progress


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
    assert _lines(capsys) == ["onmt_translate: 60/100 sentences (60%), 0.97 sentences/s, 01:02 elapsed, about 00:41 "
                              "left"]
    shown.update(40)
    shown.close()
    assert _lines(capsys) == ["onmt_translate: 100/100 sentences (100%), 1.61 sentences/s, 01:02 elapsed, about "
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
