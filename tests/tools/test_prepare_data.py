"""tools/prepare_data.py: resumable checksummed downloads, archive extraction, NIST SGML, tokenization, filtering,
progress bars."""

import dataclasses
import hashlib
import http.server
import json
import sys
import tarfile
import threading
import zipfile

import pytest

from tools import prepare_data as pd

PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves PAYLOAD at any path, honouring ``Range: bytes=N-``; counts the bytes of each body it sends."""

    sent = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        start = 0
        if self.headers.get("Range"):
            start = int(self.headers["Range"].split("=")[1].rstrip("-"))
            if start >= len(PAYLOAD):
                self.send_response(416)
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        else:
            self.send_response(200)
        body = PAYLOAD[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # Recorded before the body goes out: the client cannot finish reading before the count exists
        # (appending afterwards raced with the client's return, and failed CI once).
        _RangeHandler.sent.append(len(body))
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


SHA = hashlib.sha256(PAYLOAD).hexdigest()


def test_download_resumes_a_partial_file_and_checks_the_pinned_sum(server, tmp_path):
    archive = pd.Archive(f"{server}/corpus.tgz", SHA)
    (tmp_path / "corpus.tgz.part").write_bytes(PAYLOAD[:30000])
    _RangeHandler.sent.clear()
    path = pd.download(archive, tmp_path)
    assert path.read_bytes() == PAYLOAD
    assert _RangeHandler.sent == [len(PAYLOAD) - 30000]  # only the missing tail was sent
    assert not (tmp_path / "corpus.tgz.part").exists()
    _RangeHandler.sent.clear()
    pd.download(archive, tmp_path)  # already there and checked: nothing fetched
    assert _RangeHandler.sent == []


def test_a_complete_part_file_is_finished_without_refetching(server, tmp_path):
    (tmp_path / "corpus.tgz.part").write_bytes(PAYLOAD)
    _RangeHandler.sent.clear()
    assert pd.download(pd.Archive(f"{server}/corpus.tgz", SHA), tmp_path).read_bytes() == PAYLOAD
    assert _RangeHandler.sent == []


def test_a_wrong_sum_moves_the_file_aside_and_says_so(server, tmp_path):
    with pytest.raises(SystemExit, match="expected 0+; moved it to .*corpus.tgz.bad"):
        pd.download(pd.Archive(f"{server}/corpus.tgz", "0" * 64), tmp_path)
    assert (tmp_path / "corpus.tgz.bad").read_bytes() == PAYLOAD
    assert not (tmp_path / "corpus.tgz").exists()


def test_an_unpinned_file_is_recorded_and_checked_later(server, tmp_path, capsys):
    archive = pd.Archive(f"{server}/free.tgz")
    pd.download(archive, tmp_path)
    assert "no pinned SHA-256" in capsys.readouterr().err
    assert (tmp_path / "SHA256SUMS").read_text() == f"{SHA}  free.tgz\n"
    (tmp_path / "free.tgz").write_bytes(PAYLOAD[:-1] + b"x")  # damaged afterwards
    with pytest.raises(SystemExit, match="free.tgz has SHA-256"):
        pd.download(archive, tmp_path)


def test_an_unreachable_url_says_where_to_put_the_file(tmp_path):
    archive = pd.Archive("http://127.0.0.1:9/nowhere/big.tgz", "ab" * 32)
    with pytest.raises(SystemExit) as error:
        pd.download(archive, tmp_path, timeout=5)
    message = str(error.value)
    assert "cannot download http://127.0.0.1:9/nowhere/big.tgz" in message
    assert str(tmp_path / "big.tgz") in message and "ab" * 32 in message


def _tar(path, members):
    with tarfile.open(path, "w:gz") as archive:
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, __import__("io").BytesIO(data))


def test_members_are_found_by_path_or_by_file_name(tmp_path):
    _tar(tmp_path / "nc.tgz", {"other-top/news.de-en.en": "\ufeffHello .\r\nBye .\n",
                               "other-top/news.de-en.de": "Hallo .\nTschüss .\n"})
    corpus = pd.Parallel("nc.tgz", "training/news.de-en.{lang}")
    pd.ARCHIVES["nc.tgz"] = pd.Archive("https://example.invalid/nc.tgz")
    try:
        src, tgt = pd.corpus_lines(corpus, "de", "en", tmp_path)  # de->en: sides follow the task, not the file
    finally:
        del pd.ARCHIVES["nc.tgz"]
    assert src == ["Hallo .", "Tschüss ."] and tgt == ["Hello .", "Bye ."]
    with pytest.raises(SystemExit, match="has no member x.en"):
        list(pd._member_stream(tmp_path / "nc.tgz", "x.en"))


def test_zip_members_are_read(tmp_path):
    with zipfile.ZipFile(tmp_path / "setimes.zip", "w") as archive:
        archive.writestr("SETIMES.en-ro.ro", "Bună ziua .\n")
    assert list(pd._member_stream(tmp_path / "setimes.zip", "SETIMES.en-ro.ro")) == ["Bună ziua ."]


def test_text_that_is_not_utf8_names_the_file_and_line(tmp_path):
    bad = tmp_path / "train.zh"
    bad.write_bytes("好的\n".encode("utf-8") + "不好\n".encode("gb18030"))
    with pytest.raises(SystemExit, match=r"train.zh, line 2: not UTF-8"):
        list(pd._open_text(bad))


SRC_SGM = """<srcset setid="nist02" srclang="zh">
<doc docid="d1" genre="nw">
<seg id="1">他 来 了 。</seg>
<seg id="2">A &amp; B</seg>
</doc>
<doc docid="d2">
<seg id=1>再见</seg>
</doc>
</srcset>
"""


def _refs(order, systems=("r1", "r2", "r3", "r4"), drop=None):
    docs = {"d1": [("1", "He came ."), ("2", "A &amp; B")], "d2": [("1", "Goodbye")]}
    out = ['<refset setid="nist02" trglang="en">']
    for sysid in systems:
        for docid in order:
            out.append(f'<doc docid="{docid}" sysid="{sysid}">')
            out += [f'<seg id="{segid}"> {text} {sysid} </seg>' for segid, text in docs[docid]
                    if (sysid, docid, segid) != drop]
            out.append("</doc>")
    return "\n".join(out + ["</refset>"]) + "\n"


def test_nist_sgml_keeps_every_reference_aligned_to_the_source(tmp_path):
    (tmp_path / "nist02.src.sgm").write_text(SRC_SGM, encoding="utf-8")
    (tmp_path / "nist02.ref.sgm").write_text(_refs(["d2", "d1"]), encoding="utf-8")  # documents reordered
    sources, references = pd.nist_test_set(tmp_path)
    assert sources == ["他 来 了 。", "A & B", "再见"]
    assert len(references) == 4
    assert references[2] == ["He came . r3", "A & B r3", "Goodbye r3"]


def test_nist_references_in_separate_files_are_all_kept(tmp_path):
    (tmp_path / "nist02.src.sgm").write_text(SRC_SGM, encoding="utf-8")
    for number in range(4):
        (tmp_path / f"nist02.ref{number}.sgm").write_text(_refs(["d1", "d2"], systems=(f"ref{number}",)),
                                                         encoding="utf-8")
    _, references = pd.nist_test_set(tmp_path)
    assert [r[0] for r in references] == [f"He came . ref{n}" for n in range(4)]


def test_a_reference_missing_a_segment_is_named(tmp_path):
    (tmp_path / "nist02.src.sgm").write_text(SRC_SGM, encoding="utf-8")
    (tmp_path / "nist02.ref.sgm").write_text(_refs(["d1", "d2"], drop=("r3", "d2", "1")), encoding="utf-8")
    with pytest.raises(SystemExit, match=r"sysid 'r3'\) lacks 1 source segments, e.g. docid d2 seg 1"):
        pd.nist_test_set(tmp_path)


def test_nist_raw_step_writes_four_numbered_references(tmp_path, monkeypatch):
    nist = tmp_path / "ldc"
    nist.mkdir()
    (nist / "train.zh").write_text("你好\n谢谢\n", encoding="utf-8")
    (nist / "train.en").write_text("hello\nthanks\n", encoding="utf-8")
    for name in ("nist02", "nist03", "nist04", "nist06"):
        (nist / name).mkdir()
        (nist / name / f"{name}.src.sgm").write_text(SRC_SGM, encoding="utf-8")
        (nist / name / f"{name}.ref.sgm").write_text(_refs(["d1", "d2"]), encoding="utf-8")
    monkeypatch.setenv("NIST_DIR", str(nist))
    out = pd.raw("nist_zhen", out=tmp_path / "raw")
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["corpora.json", "train.zh", "train.en", "valid.zh", "valid.en", "test.zh", "test_nist03.zh",
                            "test_nist04.zh"] + [f"{t}.en{n}" for t in ("test", "test_nist03", "test_nist04")
                                                 for n in range(4)])
    assert (out / "test.en3").read_text(encoding="utf-8").splitlines()[1] == "A & B r4"


def test_missing_nist_dir_explains_the_layout(monkeypatch):
    monkeypatch.delenv("NIST_DIR", raising=False)
    with pytest.raises(SystemExit, match="NIST_DIR=/path(.|\n)*nist06/"):
        pd.fetch("nist_zhen")


def test_tokenization_uses_moses_for_latin_script_and_jieba_for_chinese():
    assert list(pd.tokenize_lines(["Hello, world! It's a well-known fact."], "en")) == [
        "Hello , world ! It 's a well @-@ known fact ."]
    [zh] = pd.tokenize_lines(["我们在北京学习中文。"], "zh")  # unpacking consumes the generator
    assert "".join(zh.split()) == "我们在北京学习中文。" and len(zh.split()) >= 4


def test_length_and_ratio_filter_follows_clean_corpus():
    assert pd.keep_pair("a b c", "x y z", max_len=3, ratio=1.5)
    assert not pd.keep_pair("a b c d", "x y z w", max_len=3, ratio=1.5)  # too long
    assert not pd.keep_pair("a b c", "x", max_len=250, ratio=1.5)  # ratio 3
    assert not pd.keep_pair("", "x", max_len=250, ratio=9)  # empty side
    assert pd.keep_pair("a b c", "x", max_len=250, ratio=9)


def test_every_task_names_its_languages_and_sources():
    for name, task in pd.TASKS.items():
        assert task.src != task.tgt
        if task.manual in ("NIST_DIR", "NIUTRANS_DIR"):
            continue
        for key in pd._archive_names(task):
            assert pd.ARCHIVES[key].url.startswith("https://"), key
        for test_set in (task.valid, task.test):
            assert isinstance(test_set, (pd.SacrebleuSet, pd.Parallel)), name


def test_joint_bpe_tasks_are_the_ones_whose_configs_share_a_vocabulary():
    import yaml

    for name, task in pd.TASKS.items():
        config = pd.REPO / "yaml_configs" / "baseline" / f"transformer_base_{name}.yaml"
        if not config.exists():
            config = next((pd.REPO / "yaml_configs" / "sample").glob(f"*_{name}_baseline.yaml"))
        values = yaml.safe_load(config.read_text(encoding="utf-8"))
        shared = values["src_vocab"] == values["tgt_vocab"]
        assert shared == task.joint_bpe, name
        assert values["src_vocab"].startswith(f"build/data/{name}/"), name


class _ShortHandler(_RangeHandler):
    """Announces the whole payload but closes the connection after a third of it."""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()
        self.wfile.write(PAYLOAD[: len(PAYLOAD) // 3])


def test_a_connection_cut_short_keeps_the_part_file_and_records_nothing(tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ShortHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        archive = pd.Archive(f"http://127.0.0.1:{httpd.server_address[1]}/cut.tgz")
        with pytest.raises(SystemExit, match=r"ended at byte 34133 of 102400; rerun to resume"):
            pd.download(archive, tmp_path, timeout=10)
    finally:
        httpd.shutdown()
    assert (tmp_path / "cut.tgz.part").stat().st_size == len(PAYLOAD) // 3
    assert not (tmp_path / "cut.tgz").exists() and not (tmp_path / "SHA256SUMS").exists()


def test_segments_without_ids_are_matched_by_position(tmp_path):
    (tmp_path / "n.src.sgm").write_text('<doc docid="a"><seg>一</seg><seg>二</seg></doc>\n', encoding="utf-8")
    (tmp_path / "n.ref.sgm").write_text('<doc docid="a" sysid="r1"><seg>one</seg><seg>two</seg></doc>\n'
                                        '<doc docid="a" sysid="r2"><seg>One</seg><seg>Two</seg></doc>\n',
                                        encoding="utf-8")
    sources, references = pd.nist_test_set(tmp_path)
    assert sources == ["一", "二"] and references == [["one", "two"], ["One", "Two"]]


def test_a_pretokenized_task_gets_a_detokenized_reference_for_sacrebleu(tmp_path, monkeypatch):
    monkeypatch.setattr(pd, "DATA", tmp_path)
    base = tmp_path / "sample_ende"
    for step in ("raw", "tok"):
        (base / step).mkdir(parents=True)
        (base / step / "test.de").write_text("Das ist &apos; gut &apos; , oder ?\n", encoding="utf-8")
        (base / step / "test.en").write_text("That is good .\n", encoding="utf-8")
    (base / "clean").mkdir()
    for lang in ("en", "de"):
        (base / "clean" / f"train.{lang}").write_text("das gute haus\nthe good house\n" * 20, encoding="utf-8")
    pd.bpe("sample_ende", merges=10)
    assert (base / "test.tok.de").read_text(encoding="utf-8") == "Das ist &apos; gut &apos; , oder ?\n"
    assert (base / "test.de").read_text(encoding="utf-8") == "Das ist 'gut', oder?\n"


# ---------------------------------------------------------------- progress bars
@pytest.fixture
def bars(monkeypatch):
    """Forces the bars on (as ``--progress``) and records every bar made, to read its counts afterwards."""
    made = []
    make = pd.progress_bar

    def recording(**kwargs):
        made.append(make(**kwargs))
        return made[-1]

    monkeypatch.setattr(pd, "PROGRESS", True)
    monkeypatch.setattr(pd, "progress_bar", recording)
    return made


def _bar(bars, desc):
    [bar] = [b for b in bars if b.desc.startswith(desc)]
    return bar


def test_a_download_reports_its_bytes(server, tmp_path, bars):
    pd.download(pd.Archive(f"{server}/corpus.tgz", SHA), tmp_path)
    bar = _bar(bars, "corpus.tgz")
    assert (bar.total, bar.n, bar.initial, bar.unit) == (len(PAYLOAD), len(PAYLOAD), 0, "B")
    assert _bar(bars, "sha256 corpus.tgz").n == len(PAYLOAD)  # the check that follows has its own bar


def test_a_resumed_download_starts_its_bar_at_the_bytes_already_there(server, tmp_path, bars):
    (tmp_path / "corpus.tgz.part").write_bytes(PAYLOAD[:30000])
    pd.download(pd.Archive(f"{server}/corpus.tgz", SHA), tmp_path)
    bar = _bar(bars, "corpus.tgz")
    assert (bar.initial, bar.n, bar.total) == (30000, len(PAYLOAD), len(PAYLOAD))


def test_bars_are_quiet_unless_stderr_is_a_terminal_or_progress_is_asked(monkeypatch, capsys):
    monkeypatch.setattr(pd, "PROGRESS", None)
    with pd.progress_bar(total=3) as bar:  # pytest's captured stderr is no terminal
        bar.update(3)
        shown = not bar.disable  # read before close(), which disables every bar
    assert not shown and capsys.readouterr().err == ""

    class Terminal(__import__("io").StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    with pd.progress_bar(total=3) as bar:
        bar.update(3)
        shown = not bar.disable
    assert shown and bar.n == 3 and sys.stderr.getvalue()
    monkeypatch.setattr(pd, "PROGRESS", False)  # --no-progress: quiet even on a terminal
    assert pd.progress_bar(total=1).disable


def test_the_progress_flag_sets_the_mode(monkeypatch, capsys):
    monkeypatch.setattr(pd, "PROGRESS", None)
    pd.main(["--list", "--progress"])
    assert pd.PROGRESS is True
    pd.main(["--list", "--no-progress"])
    assert pd.PROGRESS is False
    pd.main(["--list"])
    assert pd.PROGRESS is None
    capsys.readouterr()


def test_worker_processes_advance_one_line_bar_and_keep_the_order(monkeypatch, bars):
    monkeypatch.setattr(pd, "CHUNK_LINES", 2)  # five chunks for two workers, finishing in any order
    lines = [f"It's line {n}, isn't it?" for n in range(9)]
    assert list(pd.tokenize_lines(lines, "en", workers=2, desc="tok train.en")) == list(pd.tokenize_lines(lines, "en"))
    pooled, single = [b for b in bars if b.desc == "tok train.en"] + [b for b in bars if b.desc == "tok en"]
    assert (pooled.total, pooled.n) == (single.total, single.n) == (9, 9)


def test_a_line_bar_counts_its_file_only_when_it_is_shown(tmp_path, monkeypatch):
    text = tmp_path / "train.en"
    text.write_text("a\nb\nc\n", encoding="utf-8")
    monkeypatch.setattr(pd, "PROGRESS", True)
    assert pd.count_lines(text) == 3
    for quiet in (False, None):  # --no-progress, or automatic with pytest's captured stderr: no extra read
        monkeypatch.setattr(pd, "PROGRESS", quiet)
        assert pd.count_lines(text) is None


def test_learning_and_applying_bpe_report_merges_and_lines(tmp_path, bars):
    text = tmp_path / "train.en"
    text.write_text("the lower newer widest\n" * 30, encoding="utf-8")
    pd.learn_bpe([text], tmp_path / "codes", merges=5)
    merges = len((tmp_path / "codes").read_text(encoding="utf-8").splitlines()) - 1  # less the #version line
    learned = _bar(bars, "learn codes")
    assert learned.total == learned.n == merges == 5
    list(pd.apply_bpe(["the newer lower"] * 4, tmp_path / "codes", desc="bpe valid.en"))
    assert (_bar(bars, "bpe valid.en").n, _bar(bars, "bpe valid.en").total) == (4, 4)


def test_extracting_a_member_reports_its_bytes(tmp_path, bars):
    _tar(tmp_path / "nc.tgz", {"top/news.en": "Hello .\nBye .\n"})
    assert list(pd._member_stream(tmp_path / "nc.tgz", "news.en")) == ["Hello .", "Bye ."]
    bar = _bar(bars, "extract news.en")
    assert bar.n == bar.total == len("Hello .\nBye .\n")


def test_subword_nmt_draws_no_bar_of_its_own_on_a_log(tmp_path, monkeypatch, capsys):
    """subword-nmt's learn_bpe draws a tqdm bar even into a pipe; here it follows PROGRESS (auto: quiet)."""
    monkeypatch.setattr(pd, "PROGRESS", None)
    text = tmp_path / "train.en"
    text.write_text("the lower newer widest\n" * 30, encoding="utf-8")
    pd.learn_bpe([text], tmp_path / "codes", merges=5)
    assert capsys.readouterr().err == ""
    from subword_nmt import learn_bpe as module

    assert module.tqdm.__module__.startswith("tqdm")  # its own bar is back after the call


# ---------------------------------------------------------------- WMT17 Zh-En: the full corpus and the record
def _zip(path, members):
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)


def _wmt17_downloads(tmp_path, monkeypatch):
    """Every WMT17 Zh-En archive as a small stand-in under ``tmp_path/downloads`` (News Commentary: 3 pairs; UN: 2;
    each CWMT corpus: 1, but casict2011: two files a side, spelled ``_ch`` and ``_cn``), local dev/test sets and no
    recorded recipe; returns the downloads directory."""
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    _tar(downloads / pd.ARCHIVES["nc-v12"].filename,
         {"training/news-commentary-v12.zh-en.zh": "新闻一\n新闻二\n新闻三\n",
          "training/news-commentary-v12.zh-en.en": "news one\nnews two\nnews three\n"})
    _zip(downloads / pd.ARCHIVES["un-v1.0-en-zh"].filename,
         {"en-zh/UNv1.0.en-zh.zh": "联合国\n会议\n", "en-zh/UNv1.0.en-zh.en": "united nations\nmeeting\n"})
    for name in pd.CWMT_SUMS:
        members = {f"{name}/{name}_ch.txt": f"{name} 中文\n", f"{name}/{name}_en.txt": f"{name} english\n"}
        if name == "casict2011":  # two sub-corpora; sorted, B's files come after A's on both sides
            members = {f"{name}/casict-B_cn.txt": "乙\r\n", f"{name}/casict-A_ch.txt": "甲\n",
                       f"{name}/casict-A_en.txt": "A\n", f"{name}/casict-B_en.txt": "B\n"}
        _zip(downloads / pd.ARCHIVES[f"cwmt-{name}"].filename, members)
    for name, text in (("src", "你好\n"), ("ref", "hello\n")):
        (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.setattr(pd, "_sacrebleu_files", lambda test_set: (tmp_path / "src", [tmp_path / "ref"]))
    for variable in ("WMT17_EXTRA_DIR", "WMT17_SMALL_DATA"):
        monkeypatch.delenv(variable, raising=False)
    return downloads


def _corpora(out):
    return json.loads((out / "corpora.json").read_text(encoding="utf-8"))


def test_wmt17_raw_streams_every_part_of_the_full_corpus_and_records_it(tmp_path, monkeypatch):
    downloads = _wmt17_downloads(tmp_path, monkeypatch)
    out = pd.raw("wmt17_zhen", downloads, out=tmp_path / "full" / "raw")
    record = _corpora(out)
    assert [(e["name"], e["pairs"], e.get("extra", False)) for e in record["corpora"]] == [
        ("News Commentary v12", 3, False), ("UN Parallel Corpus v1.0", 2, True)] + [
        (f"CWMT {name}", 2 if name == "casict2011" else 1, True) for name in pd.CWMT_SUMS]
    assert record["pairs"] == 3 + 2 + 7
    zh = (out / "train.zh").read_text(encoding="utf-8").splitlines()
    en = (out / "train.en").read_text(encoding="utf-8").splitlines()
    assert zh[:6] == ["新闻一", "新闻二", "新闻三", "联合国", "会议", "casia2015 中文"]
    assert en[:6] == ["news one", "news two", "news three", "united nations", "meeting", "casia2015 english"]
    assert (zh[6:8], en[6:8]) == (["甲", "乙"], ["A", "B"])  # casict2011's files paired by their sorted names


def test_wmt17_downloads_every_part_unless_the_small_data_is_asked_for(monkeypatch, tmp_path):
    for variable in ("WMT17_EXTRA_DIR", "WMT17_SMALL_DATA"):
        monkeypatch.delenv(variable, raising=False)
    full = pd.recipes("wmt17_zhen")
    assert full["fetch"]["archives"] == ["nc-v12", "un-v1.0-en-zh"] + [f"cwmt-{name}" for name in pd.CWMT_SUMS]
    assert full["raw"]["WMT17_SMALL_DATA"] is False
    monkeypatch.setenv("WMT17_SMALL_DATA", "1")
    small = pd.recipes("wmt17_zhen")
    assert small["fetch"]["archives"] == ["nc-v12"] and small["raw"] != full["raw"]  # switching redoes the data
    monkeypatch.setenv("WMT17_SMALL_DATA", "0")
    assert pd.recipes("wmt17_zhen") == full
    monkeypatch.setenv("WMT17_SMALL_DATA", "yes")
    with pytest.raises(SystemExit, match="WMT17_SMALL_DATA=yes: set it to 1"):
        pd.recipes("wmt17_zhen")


def test_the_fetch_step_downloads_what_the_settings_train_on(tmp_path, monkeypatch):
    fetched = []
    monkeypatch.setattr(pd, "DATA", tmp_path / "data")  # no recorded recipe
    monkeypatch.setattr(pd, "download", lambda archive, downloads: fetched.append(archive.filename))
    monkeypatch.setattr(pd, "_sacrebleu_files", lambda test_set: None)
    for variable in ("WMT17_EXTRA_DIR", "WMT17_SMALL_DATA"):
        monkeypatch.delenv(variable, raising=False)
    pd.fetch("wmt17_zhen", tmp_path)
    assert fetched == ["training-parallel-nc-v12.tgz", "UNv1.0.en-zh.zip"] + [f"{n}.zip" for n in pd.CWMT_SUMS]
    fetched.clear()
    monkeypatch.setenv("WMT17_EXTRA_DIR", str(tmp_path))  # no train.zh there: stops before any download
    with pytest.raises(SystemExit, match="lacks train.zh, train.en"):
        pd.fetch("wmt17_zhen", tmp_path)
    assert fetched == []
    monkeypatch.delenv("WMT17_EXTRA_DIR")
    monkeypatch.setenv("WMT17_SMALL_DATA", "1")
    pd.fetch("wmt17_zhen", tmp_path)
    assert fetched == ["training-parallel-nc-v12.tgz"]


def test_the_full_corpus_archives_are_pinned_https_downloads():
    for corpus in pd.WMT17_FULL:
        archive = pd.ARCHIVES[corpus.archive]
        assert archive.url.startswith("https://huggingface.co/datasets/wmt/"), corpus
        assert len(archive.sha256) == 64 and int(archive.sha256, 16) >= 0, corpus
    assert len({pd.ARCHIVES[c.archive].filename for c in pd.WMT17_FULL}) == len(pd.WMT17_FULL)  # no clash on disk


def test_wmt17_small_data_takes_news_commentary_alone_and_says_so(tmp_path, monkeypatch, capsys):
    downloads = _wmt17_downloads(tmp_path, monkeypatch)
    monkeypatch.setenv("WMT17_SMALL_DATA", "1")
    out = pd.raw("wmt17_zhen", downloads, out=tmp_path / "small" / "raw")
    assert _corpora(out) == {"task": "wmt17_zhen", "corpora": [{"name": "News Commentary v12", "pairs": 3}],
                             "pairs": 3}
    assert "WMT17_SMALL_DATA=1: News Commentary v12 alone" in capsys.readouterr().err
    monkeypatch.setenv("WMT17_EXTRA_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match="WMT17_SMALL_DATA=1 leaves out the pairs WMT17_EXTRA_DIR holds"):
        pd.raw("wmt17_zhen", downloads, out=tmp_path / "small" / "raw")


def test_wmt17_extra_dir_replaces_the_downloaded_un_and_cwmt_parts(tmp_path, monkeypatch):
    downloads = _wmt17_downloads(tmp_path, monkeypatch)
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "train.zh").write_text("联合国\n会议\n", encoding="utf-8")
    monkeypatch.setenv("WMT17_EXTRA_DIR", str(extra))
    with pytest.raises(SystemExit, match=r"WMT17_EXTRA_DIR=.*extra lacks train\.en: WMT17_EXTRA_DIR, when set, is"):
        pd.raw("wmt17_zhen", downloads, out=tmp_path / "own" / "raw")
    assert pd.recipes("wmt17_zhen")["fetch"]["archives"] == ["nc-v12"]  # nothing else to download
    (extra / "train.en").write_text("united nations\nmeeting\n", encoding="utf-8")
    out = pd.raw("wmt17_zhen", downloads, out=tmp_path / "own" / "raw")
    assert _corpora(out)["corpora"][1] == {"name": f"WMT17_EXTRA_DIR ({extra}): UN v1.0 + CWMT", "pairs": 2,
                                           "extra": True}
    assert (out / "train.en").read_text(encoding="utf-8").splitlines()[-1] == "meeting"


def test_a_pattern_member_with_unequal_sides_names_its_files(tmp_path, monkeypatch):
    downloads = _wmt17_downloads(tmp_path, monkeypatch)
    _zip(downloads / "casia2015.zip", {"casia2015/casia2015_ch.txt": "一\n二\n",
                                       "casia2015/casia2015_en.txt": "one\n"})
    with pytest.raises(SystemExit, match=r"casia2015.zip \(casia2015/casia2015_ch.txt and casia2015/casia2015_en.txt"
                                         r"\): 2 source lines but 1 target lines"):
        pd.raw("wmt17_zhen", downloads, out=tmp_path / "raw")
    assert not (tmp_path / "raw" / "train.zh").exists()  # nothing half-written under the final name
    _zip(downloads / "casia2015.zip", {"casia2015/a_ch.txt": "一\n", "casia2015/b_ch.txt": "二\n",
                                       "casia2015/a_en.txt": "one\n"})
    with pytest.raises(SystemExit, match=r"casia2015.zip: 2 zh files .* but 1 en files"):
        pd.raw("wmt17_zhen", downloads, out=tmp_path / "raw")
    _zip(downloads / "casia2015.zip", {"other/a_zh.txt": "一\n"})
    with pytest.raises(SystemExit, match=r"has no member matching casia2015/\*_c\[hn\].txt"):
        pd.raw("wmt17_zhen", downloads, out=tmp_path / "raw")


def test_the_line_workers_read_a_bounded_way_ahead(monkeypatch):
    """A corpus streams through tokenization and BPE: the first lines come back before the input is all read."""
    monkeypatch.setattr(pd, "CHUNK_LINES", 2)
    read = []

    def lines():
        for number in range(200):
            read.append(number)
            yield f"line {number} ."

    for workers in (1, 2):
        read.clear()
        done = pd.map_lines(pd._tokenize_line, "en", lines(), workers=workers)
        assert next(done) == "line 0 ." and len(read) <= 2 * 4 * workers
        assert list(done)[-1] == "line 199 ." and len(read) == 200


def test_every_raw_step_names_its_corpora(tmp_path, monkeypatch):
    monkeypatch.chdir(pd.REPO)  # the sample is read from the repository
    out = pd.raw("sample_ende", out=tmp_path / "raw")
    [entry] = json.loads((out / "corpora.json").read_text(encoding="utf-8"))["corpora"]
    assert entry["name"] == "data/wmt14-ende-sample/train.*" and entry["pairs"] > 1000


def test_merges_belongs_to_the_bpe_step_and_is_not_ignored_elsewhere(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(pd, "STEPS", {name: lambda task, **options: calls.append(options) for name in pd.STEPS})
    monkeypatch.chdir(pd.REPO)
    with pytest.raises(SystemExit) as exit_info:
        pd.main(["tok", "sample_ende", "--merges", "10"])
    assert exit_info.value.code == 2 and "--merges is an option of the bpe step" in capsys.readouterr().err
    assert pd.main(["bpe", "sample_ende", "--merges", "10", "--workers", "1"]) == 0
    assert calls == [{"workers": 1, "merges": 10}]


# ---------------------------------------------------------------- recipes (what make redoes)
def _recipe_times(directory):
    return {step: (directory / f".recipe.{step}").stat().st_mtime_ns for step in pd.STEP_VERSIONS}


def test_recipes_are_rewritten_only_for_the_steps_whose_settings_changed(tmp_path, monkeypatch, capsys):
    directory = tmp_path / "sample_ende"
    pd.write_recipes("sample_ende", directory)
    assert capsys.readouterr().err == ""  # nothing made yet: nothing to say
    first = _recipe_times(directory)
    assert json.loads((directory / ".recipe.bpe").read_text(encoding="utf-8"))["merges"] == 1000
    pd.write_recipes("sample_ende", directory)
    assert _recipe_times(directory) == first  # unchanged: make sees nothing newer
    for step in pd.STEP_VERSIONS:
        (directory / f".{step}").touch()  # every step done
    task = pd.TASKS["sample_ende"]
    monkeypatch.setitem(pd.TASKS, "sample_ende", dataclasses.replace(task, ratio=2.0))
    pd.write_recipes("sample_ende", directory)
    after = _recipe_times(directory)
    assert [step for step in after if after[step] != first[step]] == ["clean"]
    assert capsys.readouterr().err == (f"prepare_data.py: {directory}: step clean is redone with the steps after it: "
                                       "its ratio changed\n")


def test_a_merges_override_is_recorded_so_that_make_redoes_the_bpe_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pd, "DATA", tmp_path)
    directory = tmp_path / "sample_ende"
    pd.write_recipes("sample_ende", directory)
    (directory / "clean").mkdir()
    for lang in ("en", "de"):
        (directory / "clean" / f"train.{lang}").write_text("das gute haus\nthe good house\n" * 20, encoding="utf-8")
    (directory / "tok").mkdir()
    pd.bpe("sample_ende", merges=10)
    assert json.loads((directory / ".recipe.bpe").read_text(encoding="utf-8"))["merges"] == 10
    (directory / ".bpe").touch()
    before = _recipe_times(directory)
    pd.write_recipes("sample_ende", directory)  # make's recipe step: the task's 1000 merges again
    after = _recipe_times(directory)
    assert [step for step in after if after[step] != before[step]] == ["bpe"]
    assert json.loads((directory / ".recipe.bpe").read_text(encoding="utf-8"))["merges"] == 1000
    assert capsys.readouterr().err.endswith("step bpe is redone with the steps after it: its merges changed\n")


def test_a_step_done_by_an_earlier_version_without_a_recipe_is_redone_and_said(tmp_path, capsys):
    directory = tmp_path / "sample_ende"
    directory.mkdir()
    (directory / ".tok").touch()
    pd.write_recipes("sample_ende", directory)
    assert capsys.readouterr().err == (f"prepare_data.py: {directory}: step tok is redone with the steps after it: "
                                       "it has no recorded recipe (made by an earlier onmt-ext)\n")


def test_a_data_directory_counts_once_set_and_stands_when_left_unset(tmp_path, monkeypatch):
    directory = tmp_path / "wmt17_zhen"
    monkeypatch.delenv("WMT17_EXTRA_DIR", raising=False)
    pd.write_recipes("wmt17_zhen", directory)
    assert json.loads((directory / ".recipe.raw").read_text(encoding="utf-8"))["WMT17_EXTRA_DIR"] == ""
    monkeypatch.setenv("WMT17_EXTRA_DIR", str(tmp_path / "extra"))
    pd.write_recipes("wmt17_zhen", directory)
    recorded = json.loads((directory / ".recipe.raw").read_text(encoding="utf-8"))["WMT17_EXTRA_DIR"]
    assert recorded == str((tmp_path / "extra").resolve())
    before = _recipe_times(directory)
    monkeypatch.delenv("WMT17_EXTRA_DIR")  # a later make without it keeps the full data
    pd.write_recipes("wmt17_zhen", directory)
    assert _recipe_times(directory) == before


def test_the_steps_read_the_directory_the_data_were_made_from(tmp_path, monkeypatch):
    """A step redone later (a changed recipe) without NIST_DIR or NIUTRANS_DIR set uses the recorded one, as the
    recipes do, instead of stopping for want of the variable."""
    monkeypatch.setattr(pd, "DATA", tmp_path / "data")
    plain = tmp_path / "niutrans"
    plain.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "zh"):
            (plain / f"{split}.{lang}").write_text("x\n", encoding="utf-8")
    monkeypatch.setenv("NIUTRANS_DIR", str(plain))
    pd.write_recipes("niutrans_enzh")
    monkeypatch.delenv("NIUTRANS_DIR")
    assert pd._manual_dir("niutrans_enzh") == plain.resolve()
    out = pd.raw("niutrans_enzh")
    assert _corpora(out)["corpora"] == [{"name": f"NIUTRANS_DIR ({plain.resolve()})", "pairs": 1}]
    (plain / "valid.zh").write_text("x\ny\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"valid.en and valid.zh: 1 source lines but 2 target lines"):
        pd.raw("niutrans_enzh")
    monkeypatch.delenv("NIST_DIR", raising=False)
    monkeypatch.setenv("NIST_DIR", str(tmp_path / "ldc"))
    pd.write_recipes("nist_zhen")
    monkeypatch.delenv("NIST_DIR")
    with pytest.raises(SystemExit, match=f"NIST_DIR={tmp_path / 'ldc'} lacks"):  # the recorded one, checked
        pd.fetch("nist_zhen")


def test_tokenizer_versions_are_part_of_the_tokenization_recipe():
    zhen, ende, sample = (pd.recipes(name)["tok"] for name in ("wmt17_zhen", "wmt14_ende", "sample_ende"))
    assert set(zhen) >= {"jieba", "sacremoses"} and "jieba" not in ende and "sacremoses" in ende
    assert "jieba" not in sample and "sacremoses" not in sample  # released tokenized: not tokenized again
    assert pd.recipes("sample_ende")["bpe"]["sacremoses"] == ende["sacremoses"]  # its references are detokenized


def test_clean_names_tokenized_sides_of_different_lengths(tmp_path, monkeypatch):
    monkeypatch.setattr(pd, "DATA", tmp_path)
    name, task = next(iter(pd.TASKS.items()))
    tok = tmp_path / name / "tok"
    tok.mkdir(parents=True)
    (tok / f"train.{task.src}").write_text("a b\nc d\ne f\n", encoding="utf-8")
    (tok / f"train.{task.tgt}").write_text("a b\nc d\n", encoding="utf-8")
    with pytest.raises(pd.PrepareError, match=r"differ in length \(line 3 is in one only\)"):
        pd.clean(name)


def test_an_output_left_by_an_error_or_an_interruption_leaves_no_tmp_file(tmp_path):
    for error in (ValueError, KeyboardInterrupt):
        with pytest.raises(error):
            with pd._text_output(tmp_path / "out.txt") as out:
                out.write("half\n")
                raise error
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    with pd._text_output(tmp_path / "out.txt") as out:
        out.write("whole\n")
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
