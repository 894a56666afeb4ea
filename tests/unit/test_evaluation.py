"""onmt_ext.integration.evaluation, in-process: readers, metrics, paired bootstrap, BLEU by source length.

The comparisons of the scores with sacreBLEU's own command line (``python -m sacrebleu``, run on the same files
inside the test) and the tests of tools/evaluate.py's command line are in tests/integration/test_evaluation_cli.py,
which imports this module's test corpus, ``_write`` and ``files`` fixture.
"""

import math

import pytest

from onmt_ext.integration import evaluation as ev

REF1 = [
    "The cat sat on the mat.",
    "It is raining heavily in Paris today.",
    "She bought three apples and a loaf of bread.",
    "We will meet at the station at noon.",
    "Could you please close the window?",
    "He has lived in this town for ten years.",
    "The meeting was postponed until next week.",
    "I don't know what you're talking about.",
    "My brother plays the guitar every evening.",
    "The museum is closed on Mondays.",
    "They arrived late because of the traffic.",
    "Please send me the report by Friday.",
]
REF2 = [
    "A cat was sitting on the mat.",
    "Today it is raining hard in Paris.",
    "She purchased three apples and some bread.",
    "We'll meet at noon at the station.",
    "Would you close the window, please?",
    "He's been living in this town for a decade.",
    "The meeting has been put off until next week.",
    "I have no idea what you are talking about.",
    "Every evening my brother plays guitar.",
    "On Mondays the museum is closed.",
    "Because of the traffic, they came late.",
    "Send me the report by Friday, please.",
]
# Third references of segments 2, 5, 8 and 11 only (for the variable-reference TSV).
REF3 = {
    2: "She got three apples and a loaf of bread.",
    5: "He has been in this town for ten years.",
    8: "My brother plays his guitar each evening.",
    11: "Please send the report to me by Friday.",
}
HYP_A = [
    "The cat sat on a mat.",
    "It is raining a lot in Paris today.",
    "She bought three apples and bread.",
    "We meet at the station at noon.",
    "Can you close the window, please?",
    "He lived in this town for ten years.",
    "The meeting was delayed until next week.",
    "I don't know what you talk about.",
    "My brother plays guitar every evening.",
    "The museum is closed on Monday.",
    "They came late because of traffic.",
    "Please send the report by Friday.",
]
HYP_B = [
    "Cat sits on mat.",
    "Rain in Paris today.",
    "She buys apples and bread.",
    "We meet station noon.",
    "You close window?",
    "He lives in town ten years.",
    "Meeting postponed next week.",
    "I don't know what you say.",
    "Brother plays guitar evening.",
    "Museum closed Monday.",
    "They late because traffic.",
    "Send report Friday.",
]
# HYP_A with its first two segments as bad as HYP_B: a borderline difference
# whose p-value depends on the bootstrap seed.
HYP_A2 = HYP_B[:2] + HYP_A[2:]
# Source lengths (whitespace tokens) of the 12 segments.
SOURCE_LENGTHS = [3, 7, 12, 15, 22, 8, 9, 55, 4, 6, 31, 10]
SOURCES = [" ".join(f"w{j}" for j in range(n)) for n in SOURCE_LENGTHS]


def _write(path, lines):
    """Write segments as a UTF-8 file, one per line; return the path."""
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _tsv_refs(i):
    """References of segment i in the variable-reference TSV: 1, 2 or 3 of them."""
    refs = [REF1[i], REF2[i], REF3.get(i)]
    return [r for r in refs[: i % 3 + 1] if r is not None]


def _write_tsv(path):
    """Write SOURCES and the variable references as source<TAB>ref1<TAB>...; return the path."""
    return _write(path, ["\t".join([SOURCES[i]] + _tsv_refs(i)) for i in range(len(REF1))])


@pytest.fixture
def files(tmp_path):
    """The test corpus written to disk."""
    return {
        "ref1": _write(tmp_path / "ref1.txt", REF1),
        "ref2": _write(tmp_path / "ref2.txt", REF2),
        "hyp_a": _write(tmp_path / "hyp_a.txt", HYP_A),
        "hyp_b": _write(tmp_path / "hyp_b.txt", HYP_B),
        "hyp_a2": _write(tmp_path / "hyp_a2.txt", HYP_A2),
        "src": _write(tmp_path / "src.txt", SOURCES),
        "tsv": _write_tsv(tmp_path / "test.refs.tsv"),
    }


# --------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------

def test_read_hypotheses_strips_bom_and_line_ends_only(tmp_path):
    path = tmp_path / "out.txt"
    path.write_bytes("\ufeff  Hello,  world  \nsecond\r\n\nlast without newline".encode("utf-8"))
    assert ev.read_hypotheses(path) == ["  Hello,  world  ", "second", "", "last without newline"]


def test_read_hypotheses_bom_does_not_change_the_score(tmp_path):
    path = tmp_path / "out.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(h + "\n" for h in HYP_A).encode("utf-8"))
    hyps = ev.read_hypotheses(path)
    assert hyps == HYP_A
    assert ev.nist_bleu(hyps, [REF1, REF2]).score == ev.nist_bleu(HYP_A, [REF1, REF2]).score


def test_read_hypotheses_splits_on_newline_only(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("a\u2028b\x0cc\u0085d\nsecond\n", encoding="utf-8")
    assert ev.read_hypotheses(path) == ["a\u2028b\x0cc\u0085d", "second"]


def test_read_hypotheses_missing_file(tmp_path):
    with pytest.raises(ev.EvaluationError, match=r"hypothesis file .*nothere\.txt: no such file"):
        ev.read_hypotheses(tmp_path / "nothere.txt")


@pytest.mark.parametrize("content", [b"", b"\xef\xbb\xbf"], ids=["empty", "bom-only"])
def test_read_hypotheses_empty_file(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(ev.EvaluationError, match=r"empty\.txt is empty \(0 lines\)"):
        ev.read_hypotheses(path)


def test_read_hypotheses_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("ok\nfine\ncaf\u00e9 latin-1\nmore\n".encode("latin-1"))
    with pytest.raises(ev.EvaluationError) as info:
        ev.read_hypotheses(path)
    message = str(info.value)
    assert "latin1.txt" in message
    assert "line 3" in message
    assert "byte 0xe9 at byte 4 of the line" in message


def test_read_references_layout(files):
    assert ev.read_references([files["ref1"], files["ref2"]]) == [REF1, REF2]
    assert ev.read_references(files["ref1"]) == [REF1]


def test_a_tsv_given_as_plain_references_is_refused_naming_ref_tsv(tmp_path):
    tsv = _write(tmp_path / "refs.tsv", ["源 一\tthe cat\ta cat", "源 二\tthe dog", "plain line"])
    with pytest.raises(ev.EvaluationError, match=r"refs\.tsv: 2 of its 3 lines hold a tab \(first: line 1\).*--ref-tsv"):
        ev.read_references([tsv])
    plain = _write(tmp_path / "plain.txt", ["one\ttab in a real reference", "two", "three"])
    assert ev.read_references([plain]) == [["one\ttab in a real reference", "two", "three"]]


def test_read_references_unequal_files_names_files_and_counts(tmp_path, files):
    short = _write(tmp_path / "short.txt", REF2[:-1])
    with pytest.raises(ev.EvaluationError) as info:
        ev.read_references([files["ref1"], short])
    message = str(info.value)
    assert f"{files['ref1']} has 12" in message
    assert f"{short} has 11" in message


def test_read_reference_tsv_pads_with_none(tmp_path):
    path = _write(tmp_path / "refs.tsv", [
        "src one\tr1a",
        "src two\tr2a\tr2b\tr2c",
        "src three\tr3a\t\tr3b",  # an empty column is not a reference
        "src four\tr4a\tr4b",
    ])
    assert ev.read_reference_tsv(path) == [
        ["r1a", "r2a", "r3a", "r4a"],
        [None, "r2b", "r3b", "r4b"],
        [None, "r2c", None, None],
    ]
    assert ev.read_reference_tsv(path, skip_columns=0)[0] == ["src one", "src two", "src three", "src four"]
    assert ev.read_sources_from_tsv(path) == ["src one", "src two", "src three", "src four"]


def test_read_reference_tsv_seventeen_references(tmp_path):
    path = _write(tmp_path / "refs.tsv", ["s\ta\tb", "s\t" + "\t".join(f"r{k}" for k in range(17))])
    refs = ev.read_reference_tsv(path)
    assert len(refs) == 17
    assert [stream[0] for stream in refs] == ["a", "b"] + [None] * 15
    assert ev.references_per_segment(refs) == {"min": 2, "max": 17}


@pytest.mark.parametrize("bad_line", ["source only", "source\t", "source\t \t"])
def test_read_reference_tsv_line_without_reference(tmp_path, bad_line):
    path = _write(tmp_path / "refs.tsv", ["s1\tref", "s2\tref\tref b", bad_line, "s4\tref"])
    with pytest.raises(ev.EvaluationError, match=r"refs\.tsv, line 3: no reference"):
        ev.read_reference_tsv(path)


# --------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------

def test_tokenized_bleu_differs_from_nist_bleu_where_tokenization_matters():
    hyps = ["Hello, world!", "It costs $5."]
    refs = [["Hello , world !", "It costs $ 5 ."]]
    assert ev.nist_bleu(hyps, refs).score == pytest.approx(100.0)
    assert ev.tokenized_bleu(hyps, refs).score == 0.0
    # On identically tokenized text the two differ only by smoothing.
    assert ev.tokenized_bleu(refs[0], refs).score == pytest.approx(100.0)


def test_bleu_is_case_sensitive():
    refs = [["The cat sat on the mat ."]]
    assert ev.nist_bleu(["the cat sat on the mat ."], refs).score < 100.0
    assert ev.tokenized_bleu(["THE CAT SAT ON THE MAT ."], refs).score == 0.0


@pytest.mark.parametrize("metric", [ev.nist_bleu, ev.tokenized_bleu, ev.chrf])
def test_perfect_hypothesis_scores_100(metric):
    # The hypothesis equals the second reference stream, not the first.
    assert metric(REF2, [REF1, REF2]).score == pytest.approx(100.0)
    assert metric(HYP_A, [REF1, REF2]).score < 100.0


def test_length_mismatch_names_counts():
    with pytest.raises(ev.EvaluationError, match="hypotheses has 11 segments, references has 12"):
        ev.nist_bleu(HYP_A[:-1], [REF1, REF2])
    with pytest.raises(ev.EvaluationError, match=r"references \(stream 2\) has 11 segments"):
        ev.chrf(HYP_A, [REF1, REF2[:-1]])


def test_segment_without_any_reference_is_rejected():
    with pytest.raises(ev.EvaluationError, match="segment 2 has no reference"):
        ev.nist_bleu(["a b", "c d"], [["a b", None], [None, None]])


def test_unknown_metric():
    with pytest.raises(ev.EvaluationError, match="unknown metric 'ter'"):
        ev.compute_metric("ter", HYP_A, [REF1])


# --------------------------------------------------------------------------
# Paired bootstrap
# --------------------------------------------------------------------------

@pytest.mark.parametrize("p_value, marker", [(0.0009, "‡"), (0.0099, "‡"), (0.01, "†"), (0.0499, "†"),
                                             (0.05, ""), (0.8, "")])
def test_significance_marker(p_value, marker):
    assert ev.significance_marker(p_value) == marker


def test_bootstrap_identical_systems_not_significant():
    result = ev.paired_bootstrap(HYP_A, list(HYP_A), [REF1, REF2], n_samples=200)
    assert result.p_value == 1.0
    assert result.marker == ""
    assert result.delta == 0.0


@pytest.mark.parametrize("metric", ev.METRIC_NAMES)
def test_bootstrap_clearly_better_system(metric):
    refs = [REF1, REF2]
    result = ev.paired_bootstrap(HYP_B, HYP_A, refs, metric=metric, n_samples=1000, seed=12345)
    assert result.p_value < 0.05
    assert result.marker in ("†", "‡")
    assert result.system_score == pytest.approx(ev.compute_metric(metric, HYP_A, refs).score)
    assert result.baseline_score == pytest.approx(ev.compute_metric(metric, HYP_B, refs).score)
    assert result.delta > 10
    assert "bs:1000|seed:12345|" in result.signature
    assert ev.paired_bootstrap(HYP_B, HYP_A, refs, metric=metric, n_samples=1000, seed=12345) == result


@pytest.mark.parametrize("kwargs, message", [
    ({"seed": 0}, "seed must be a positive integer"),
    ({"n_samples": 0}, "number of bootstrap samples must be a positive integer"),
    ({"metric": "ter"}, "unknown metric"),
])
def test_bootstrap_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ev.EvaluationError, match=message):
        ev.paired_bootstrap(HYP_B, HYP_A, [REF1], **kwargs)


def test_bootstrap_length_mismatch():
    with pytest.raises(ev.EvaluationError, match="baseline hypotheses has 11 segments"):
        ev.paired_bootstrap(HYP_B[:-1], HYP_A, [REF1])


# --------------------------------------------------------------------------
# BLEU by source length
# --------------------------------------------------------------------------

def test_bleu_by_length_buckets():
    refs = [REF1, REF2]
    buckets = ev.bleu_by_length(HYP_A, refs, SOURCES)
    assert [b.label for b in buckets] == ["0-10", "11-20", "21-30", "31-40", "41-50", "51+"]
    assert [b.count for b in buckets] == [7, 2, 1, 1, 0, 1]
    assert [(b.min_length, b.max_length) for b in buckets][0] == (0, 10)
    assert buckets[-1].max_length is None
    assert buckets[4].score is None and buckets[4].signature is None
    first = [i for i, n in enumerate(SOURCE_LENGTHS) if n <= 10]
    expected = ev.nist_bleu([HYP_A[i] for i in first], [[s[i] for i in first] for s in refs])
    assert buckets[0].score == pytest.approx(expected.score)
    assert buckets[0].signature == expected.signature
    assert all(b.score is not None for b in buckets if b.count)


def test_bleu_by_length_boundaries_and_custom_buckets():
    hyps = ["a b c d e"] * 6
    refs = [["a b c d e"] * 6]
    sources = ["", "x", "x " * 5, "x " * 6, "x " * 7, "x " * 40]
    buckets = ev.bleu_by_length(hyps, refs, sources, buckets=(5, 6))
    assert [(b.label, b.count) for b in buckets] == [("0-5", 3), ("6-6", 1), ("7+", 2)]
    assert all(b.score == pytest.approx(100.0) for b in buckets)


@pytest.mark.parametrize("buckets", [(), (10, 10), (20, 10), (0, 10), (1.5,)])
def test_bleu_by_length_rejects_bad_buckets(buckets):
    with pytest.raises(ev.EvaluationError, match="length buckets"):
        ev.bleu_by_length(HYP_A, [REF1], SOURCES, buckets=buckets)


def test_bleu_by_length_source_mismatch():
    with pytest.raises(ev.EvaluationError, match="sources has 11 segments, hypotheses has 12"):
        ev.bleu_by_length(HYP_A, [REF1], SOURCES[:-1])


# --------------------------------------------------------------------------
# Comparison by source length, Chinese BLEU
# --------------------------------------------------------------------------

def test_compare_by_length_is_a_paired_bootstrap_per_bucket(tmp_path):
    refs = [REF1, REF2]
    comparisons = ev.compare_by_length(HYP_B, HYP_A, refs, SOURCES, buckets=(10, 20), n_samples=100, seed=5)
    assert [(c.label, c.count) for c in comparisons] == [("0-10", 7), ("11-20", 2), ("21+", 3)]
    for comparison in comparisons:
        members = [i for i, n in enumerate(SOURCE_LENGTHS)
                   if comparison.min_length <= n and (comparison.max_length is None or n <= comparison.max_length)]
        expected = ev.paired_bootstrap([HYP_B[i] for i in members], [HYP_A[i] for i in members],
                                       [[s[i] for i in members] for s in refs], n_samples=100, seed=5)
        assert comparison.bootstrap == expected
    empty = ev.compare_by_length(HYP_B, HYP_A, refs, SOURCES, buckets=(40, 50), n_samples=50)
    assert empty[1].count == 0 and empty[1].bootstrap is None
    plot = tmp_path / "by_length.png"
    ev.plot_by_length(comparisons, plot, "test", ("base", "sys"))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bleu_zh_uses_the_chinese_tokenizer():
    """Characters are BLEU's tokens: 8 each side, of which 2 differ (北京, 上海); 13a sees one token each side."""
    hyps, refs = ["我们明天去北京。"], [["我们明天去上海。"]]
    result = ev.compute_metric("bleu-zh", hyps, refs)
    # n-gram precisions by hand: 6/8, 4/7, 3/6, 2/5; both 8 characters long, so no brevity penalty
    expected = 100 * math.exp(sum(math.log(p) for p in (6 / 8, 4 / 7, 3 / 6, 2 / 5)) / 4)
    assert result.score == pytest.approx(expected, abs=1e-6) and "tok:zh" in result.signature
    assert ev.compute_metric("bleu", hyps, refs).score < 1  # 13a: no unigram in common
