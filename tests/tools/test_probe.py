"""tools/probe.py: li2019's Table 1 probing tasks, on small probing sets generated in SentEval's format."""

import json
import random

import pytest
import torch

from tools import probe


def write_task(path, make, sizes=(("tr", 240), ("va", 60), ("te", 60)), seed=0):
    """A probing file in SentEval's format; ``make(rng)`` gives one ``(label, words)``."""
    rng = random.Random(seed)
    lines = [f"{part}\t{label}\t{' '.join(words)}" for part, n in sizes for label, words in (make(rng) for _ in
                                                                                            range(n))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def sentence_length(rng):
    """SeLen-like: the label is the length bin of a sentence of 2-13 random words."""
    length = rng.randint(2, 13)
    return str((length - 2) // 4), [f"w{rng.randrange(20)}" for _ in range(length)]


def word_content(rng):
    """WC-like: which of four target words the sentence holds (once, among filler words)."""
    target = rng.choice(("alpha", "bravo", "charlie", "delta"))
    words = [f"f{rng.randrange(10)}" for _ in range(rng.randint(3, 8))]
    words.insert(rng.randrange(len(words) + 1), target)
    return target, words


def test_reader_splits_partitions_and_keeps_the_last_field_as_sentence(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("tr\tPAST\textra\tHe walked .\ntr\tPRES\tHe walks .\n\nva\tPAST\tI ran\nte\tPRES\tI run\n",
                    encoding="utf-8")
    splits = probe.read_task(path)
    assert splits["tr"] == ([["He", "walked", "."], ["He", "walks", "."]], ["PAST", "PRES"])
    assert splits["va"] == ([["I", "ran"]], ["PAST"]) and splits["te"] == ([["I", "run"]], ["PRES"])
    labels, classes = probe.encode_labels(splits)
    assert classes == ["PAST", "PRES"] and labels["tr"].tolist() == [0, 1] and labels["te"].tolist() == [1]


@pytest.mark.parametrize("text, said", [
    ("tr\tA\tok\nxx\tA\tbad partition\n", "t.txt:2: expected"),
    ("tr\tA\tok\nva\tonly two fields\n", "t.txt:2: expected"),
    ("tr\tA\tok\nva\tA\tok\n", "no te lines"),
    ("tr\tA\tok\nva\tA\tok\nte\tB\tunseen label\n", "labels ['B'] occur in va/te but not in tr"),
])
def test_reader_refuses_a_malformed_file_in_one_line_naming_it(tmp_path, text, said):
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit) as error:
        probe.read_task(path)
    message = str(error.value)
    assert said in message and str(path) in message and "\n" not in message


def features(labels, informative, seed=0):
    """Vectors that carry the label (its one-hot, plus noise) or do not (one constant vector)."""
    generator = torch.Generator().manual_seed(seed)
    if not informative:
        return torch.ones(len(labels), 8)
    return torch.nn.functional.one_hot(labels, 8).float() + 0.2 * torch.randn(len(labels), 8, generator=generator)


def feature_data(informative, classes=4):
    generator = torch.Generator().manual_seed(1)
    labels = {p: torch.randint(0, classes, (n,), generator=generator) for p, n in (("tr", 400), ("va", 200),
                                                                                   ("te", 200))}
    return {p: (features(y, informative, seed=i), y) for i, (p, y) in enumerate(labels.items())}


QUICK = {"epoch_size": 2, "tenacity": 2, "max_epochs": 20, "lr": 1e-2}


def make_mlp(nhid, dropout):
    return probe.make_probe(None, 8, nhid, 4, dropout)


def test_a_representation_carrying_the_label_is_probed_well_a_constant_one_at_chance():
    good = probe.grid_search(make_mlp, feature_data(True), [(20, 0.0, 0.0)], **QUICK)
    constant = probe.grid_search(make_mlp, feature_data(False), [(20, 0.0, 0.0)], **QUICK)
    assert good["test"] > 90
    assert constant["test"] < 40  # four balanced classes: 25% expected, the majority class at most ~32%


def test_the_grid_search_chooses_by_validation_accuracy_whatever_the_order():
    # an L2 of 10 pins the weights near zero (chance); the search must pick the unregularised setting
    for grid in ([(20, 0.0, 10.0), (20, 0.0, 0.0)], [(20, 0.0, 0.0), (20, 0.0, 10.0)]):
        result = probe.grid_search(make_mlp, feature_data(True), grid, **QUICK)
        valids = {entry["l2"]: entry["valid"] for entry in result["grid"]}
        assert valids[0.0] > valids[10.0] + 30
        assert result["chosen"] == {"nhid": 20, "dropout": 0.0, "l2": 0.0}
        assert result["valid"] == max(valids.values())


def test_li2019_model_learns_sentence_length_and_the_report_sits_beside_the_paper(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_task(data / "sentence_length.txt", sentence_length)
    write_task(data / "word_content.txt", word_content, seed=1)
    out = tmp_path / "out"
    argv = ["run", "--data", str(data), "--out", str(out), "--tasks", "SeLen,WC", "--models", "base",
            "--d-model", "16", "--layers", "1", "--nhid", "20", "--dropout", "0", "--l2", "0", "--lr", "1e-2",
            "--epoch-size", "1", "--tenacity", "2", "--max-epochs", "8", "--device", "cpu"]
    assert probe.main(argv) == 0
    report = json.loads((out / "probe.json").read_text(encoding="utf-8"))
    selen, wc = report["results"]["base"]["SeLen"], report["results"]["base"]["WC"]
    assert selen["test"] > 70 and selen["classes"] == 3  # chance: about 33%
    assert wc["test"] > 70 and wc["classes"] == 4 and wc["chosen"]["nhid"] == 0  # SentEval: WC is linear
    table = (out / "probe.md").read_text(encoding="utf-8")
    row = next(line for line in table.splitlines() if line.startswith("| li2019: base |"))
    assert row.split(" | ")[1:3] == ["97.22", "97.92"] and "44.48" in row and row.endswith("68.77 |")
    ours = next(line for line in table.splitlines() if line.startswith("| ours: base |"))
    assert f"{selen['test']:.2f}" in ours and ours.count("n/a") == 8
    # a rerun with the same setup keeps the finished results instead of training again
    (out / "probe.json").write_text(json.dumps({**report, "results": {"base": {"SeLen": {**selen, "test": 1.0},
                                                                               "WC": wc}}}), encoding="utf-8")
    probe.main(argv)
    assert json.loads((out / "probe.json").read_text(encoding="utf-8"))["results"]["base"]["SeLen"]["test"] == 1.0


def test_the_em_routing_model_learns_sentence_length_too(tmp_path):
    """A probing model whose heads are aggregated by EM routing learns, as the concatenating one does (an earlier
    toy run on 240 sentences at lr 1e-4 stayed at the majority class: too few steps, not a defect)."""
    data = tmp_path / "data"
    data.mkdir()
    write_task(data / "sentence_length.txt", sentence_length)
    out = tmp_path / "out"
    argv = ["run", "--data", str(data), "--out", str(out), "--tasks", "SeLen", "--models", "em",
            "--d-model", "16", "--layers", "1", "--nhid", "20", "--dropout", "0", "--l2", "0", "--lr", "1e-2",
            "--epoch-size", "1", "--tenacity", "2", "--max-epochs", "8", "--device", "cpu"]
    assert probe.main(argv) == 0
    selen = json.loads((out / "probe.json").read_text(encoding="utf-8"))["results"]["em"]["SeLen"]
    assert selen["test"] > 70 and selen["classes"] == 3  # chance: about 33%; the majority class about 40%


def test_the_routing_models_build_and_run_on_padded_batches():
    for method in ("simple", "em"):
        encoder = probe.build_encoder(30, 0, method, 1, 16, 4, 32, 0.0, 16, 3)
        model = probe.make_probe(encoder, 16, 10, 3, 0.0)
        logits = model(probe._batch([[2, 3, 4], [5]], [0, 1], 0, "cpu"))
        assert logits.shape == (2, 3) and torch.isfinite(logits).all()


def test_paper_numbers_are_li2019_table_1():
    assert [column for column, _, _ in probe.TASKS] == ["SeLen", "WC", "TrDep", "ToCo", "BShif", "Tense", "SubNm",
                                                        "ObjNm", "SOMO", "CoIn"]
    assert probe.PAPER["em"][2] == 47.72 and probe.PAPER["simple"][5] == 88.22 and probe.PAPER["base"][9] == 68.77
    assert all(len(row) == 10 for row in probe.PAPER.values())


def test_git_blob_id_is_what_git_hash_object_gives(tmp_path):
    (tmp_path / "f").write_bytes(b"hello\n")
    assert probe.git_blob_id(tmp_path / "f") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_fetch_fails_in_one_line_when_the_site_cannot_be_reached(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "URL", "http://127.0.0.1:9/{commit}/{file}")  # the discard port: refused
    with pytest.raises(SystemExit) as error:
        probe.main(["fetch", "--data", str(tmp_path)])
    message = str(error.value)
    assert "cannot download http://127.0.0.1:9/" in message and "sentence_length.txt" in message
    assert "\n" not in message


def test_fetch_checks_a_file_against_senteval_git_blob_id(tmp_path):
    path = write_task(tmp_path / "sentence_length.txt", sentence_length)
    probe.fetch(tmp_path, tasks=[("SeLen", path.name, probe.git_blob_id(path))])  # present and right: kept
    with pytest.raises(SystemExit, match=r"is not SentEval's sentence_length.txt .*delete it and rerun"):
        probe.fetch(tmp_path, tasks=[("SeLen", path.name, "0" * 40)])


def test_unknown_task_or_model_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="unknown Colour"):
        probe.main(["run", "--data", str(tmp_path), "--tasks", "Colour"])
    with pytest.raises(SystemExit, match=r"no probing data at .*sentence_length.txt"):
        probe.main(["run", "--data", str(tmp_path), "--tasks", "SeLen", "--device", "cpu", "--out",
                    str(tmp_path / "o")])


def test_the_checkpoint_helpers_name_the_calling_tool_and_its_option(tmp_path, capsys):
    """gret_probe.py's helpers, shared by probe.py, say which tool and which option: one line, exit 2."""
    from tools import gret_probe

    missing = tmp_path / "missing.pt"
    for call, said in ((lambda: probe.load_checkpoint(str(missing)), f"probe.py: error: --checkpoint {missing}: "),
                       (lambda: gret_probe.main(["-model", str(missing), "-src", str(missing), "-tgt", "t",
                                                 "-test_src", "s", "-test_tgt", "t"]),
                        f"gret_probe.py: error: -src {missing}: cannot read")):
        with pytest.raises(SystemExit) as error:
            call()
        err = capsys.readouterr().err
        assert error.value.code == 2 and err.count("\n") == 1 and err.startswith(said), err
