"""docs/own-data.md run as written: its ``sh`` blocks, in order, on a small generated Chinese-English corpus.

The corpus is made from sentence templates (not the shipped Tatoeba sample), written raw to ``build/own/`` of a
scratch directory whose ``tools`` links to the repository's.  The one change to the page's commands: the 3000
training steps become 40 (so the model is barely trained; the test checks that every step runs and that raw
Chinese goes in and detokenized English comes out, not the quality).
"""

import itertools
import os
import random
import re
import subprocess

import pytest

import support

pytestmark = pytest.mark.slow

GUIDE = support.REPO / "docs" / "own-data.md"
STEPS, TEST_STEPS = "3000", "40"

SUBJECTS = [("我", "I", False), ("你", "you", False), ("他", "he", True), ("她", "she", True),
            ("我们", "we", False), ("他们", "they", False)]
VERBS = [("喜欢", "like"), ("想要", "want"), ("买了", "bought"), ("看见了", "saw")]
OBJECTS = [("一本书", "a book"), ("那只猫", "that cat"), ("这部电影", "this film"), ("一杯茶", "a cup of tea"),
           ("新车", "the new car"), ("我们的老师", "our teacher"), ("红色的花", "red flowers"),
           ("这个城市", "this city")]
WHEN = [("", ""), ("今天", " today"), ("昨天", " yesterday")]


def corpus():
    """All template pairs (raw Chinese, English), in a fixed shuffled order."""
    pairs = []
    for (zs, es, third), (zv, ev), (zo, eo), (zw, ew) in itertools.product(SUBJECTS, VERBS, OBJECTS, WHEN):
        verb = ev + "s" if third and ev in ("like", "want") else ev
        pairs.append((f"{zs}{zw}{zv}{zo}。", f"{es[0].upper()}{es[1:]} {verb} {eo}{ew}."))
    random.Random(0).shuffle(pairs)
    return pairs


def guide_script():
    """The ``sh`` blocks of the guide, joined, with the training steps cut to :data:`TEST_STEPS`."""
    blocks = re.findall(r"^```sh\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), flags=re.S | re.M)
    script = "\n".join(blocks)
    assert len(blocks) >= 4 and script.count(STEPS) >= 4, "the guide's commands changed: update this test"
    return script.replace(STEPS, TEST_STEPS)


def test_the_own_data_guide_runs_end_to_end(tmp_path):
    own = tmp_path / "build" / "own"
    own.mkdir(parents=True)
    (tmp_path / "tools").symlink_to(support.REPO / "tools")
    pairs = corpus()
    for split, part in (("train", pairs[:420]), ("valid", pairs[420:500]), ("test", pairs[500:])):
        for side, lang in ((0, "zh"), (1, "en")):
            (own / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in part), encoding="utf-8")
    env = support.cli_env(PATH=f"{support.BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                          VIRTUAL_ENV=str(support.BIN.parent),
                          PYTHONPATH=os.pathsep.join(filter(None, [str(support.REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", guide_script()], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    # the raw sentence went through the model's own jieba + sentencepiece, and came back as text
    applied = "onmt_translate: applying the model's preprocessing: -transforms jieba sentencepiece"
    assert result.stderr.count(applied) == 2, result.stderr[-4000:]
    raw_out = (own / "raw.en").read_text(encoding="utf-8").splitlines()
    hyps = (own / "test.hyp.en").read_text(encoding="utf-8").splitlines()
    assert len(raw_out) == 1 and len(hyps) == len(pairs) - 500
    assert not any("\u2581" in line for line in raw_out + hyps)
    assert (own / f"model_step_{TEST_STEPS}.pt").is_file()
    assert re.search(r"^bleu +BLEU\|.* = \d+\.\d+ ", result.stdout, flags=re.M), result.stdout[-2000:]
