"""The shipped YAML configs: all parse strictly with their values, and every paper config has a faithful
smoke twin."""

import ast

import pytest
import yaml

import support

from tools import paper_configs

CONFIG_ROOT = support.REPO / "yaml_configs"
PAPER_CONFIGS = sorted(
    p.relative_to(CONFIG_ROOT)
    for p in CONFIG_ROOT.rglob("*.yaml")
    if p.relative_to(CONFIG_ROOT).parts[0] not in ("smoke", "demo", "compare", "sample")
)
ALL_CONFIGS = sorted(p.relative_to(support.REPO) for p in CONFIG_ROOT.rglob("*.yaml"))
# tools/paper_configs.py writes these configs and their smoke twins from one row each; test_paper_tools checks
# that the committed files are what it writes.  The others (the baselines the rows start from) are hand-written.
GENERATED = {path.relative_to(CONFIG_ROOT) for path in paper_configs.generated()}
HAND_WRITTEN = [config for config in PAPER_CONFIGS if config not in GENERATED]

# What a smoke twin may change: data and paths, sizes, schedule, hardware.
SIZE_AND_RUN_KEYS = {
    "save_data", "save_model", "src_vocab", "tgt_vocab", "src_vocab_size", "tgt_vocab_size", "share_vocab",
    "share_embeddings", "data", "transforms", "src_subword_model", "tgt_subword_model", "hidden_size",
    "word_vec_size", "transformer_ff", "heads", "enc_layers", "dec_layers", "layers", "dropout",
    "attention_dropout", "warmup_steps", "train_steps", "valid_steps", "save_checkpoint_steps",
    "keep_checkpoint", "report_every", "learning_rate", "adam_eps", "batch_size", "valid_batch_size", "accum_count",
    "accum_steps",
    "world_size", "gpu_ranks", "model_dtype", "bucket_size", "num_workers", "src_seq_length", "tgt_seq_length",
    "ext_compile",  # torch.compile of the mechanisms: speed only, same model
    "chen2019_dim",  # d_r scales with the model width (two of the four toy heads)
    "train_from", "override_opts", "reset_optim",  # GRET's fine-tuning start (the twins train from scratch)
    "decay_method", "learning_rate_decay",  # and its schedule: GRET's fine-tuning holds the baseline's final rate
    "batch_type",  # the clause paper counts its batches in sentences
    # the clause twins split the sample's Chinese source on the fly (jieba, a tagger trained on it); the paper
    # configs read English sources split beforehand
    "clause_lang", "clause_tagger_model", "clause_presplit",
}


def _unfaithful_keys(paper, smoke):
    """Keys outside SIZE_AND_RUN_KEYS on which a smoke twin differs from its paper config, with both values."""
    return [f"{key}: paper {paper.get(key)!r} != smoke {smoke.get(key)!r}"
            for key in sorted((set(paper) | set(smoke)) - SIZE_AND_RUN_KEYS) if paper.get(key) != smoke.get(key)]


def test_the_generator_writes_most_paper_configs_and_the_baselines_are_hand_written():
    assert len(GENERATED & set(PAPER_CONFIGS)) >= 100
    assert HAND_WRITTEN and all(config.parts[0] == "baseline" for config in HAND_WRITTEN)


@pytest.mark.parametrize("config", HAND_WRITTEN, ids=[str(p) for p in HAND_WRITTEN])
def test_every_hand_written_paper_config_has_a_faithful_smoke_twin(config):
    twin = CONFIG_ROOT / "smoke" / config
    assert twin.exists(), f"missing smoke twin yaml_configs/smoke/{config}"
    paper = yaml.safe_load((CONFIG_ROOT / config).read_text(encoding="utf-8"))
    smoke = yaml.safe_load(twin.read_text(encoding="utf-8"))
    assert not _unfaithful_keys(paper, smoke)


def test_the_generators_smoke_twins_change_only_size_and_run_settings():
    """On the generator's own output (whether the files match it is test_paper_tools' check)."""
    texts = {path.relative_to(CONFIG_ROOT): text for path, text in paper_configs.generated().items()}
    papers = [config for config in texts if config.parts[0] != "smoke"]
    assert len(papers) >= 100
    problems = []
    for config in papers:
        twin = texts.get("smoke" / config)
        if twin is None:
            problems.append(f"{config}: the generator writes no smoke twin")
            continue
        problems += [f"{config}: {line}" for line in _unfaithful_keys(yaml.safe_load(texts[config]),
                                                                     yaml.safe_load(twin))]
    assert not problems, "\n".join(problems)


def test_every_config_parses_strictly_with_the_values_it_sets(onmt_active):
    """Each shipped config parses as onmt_train parses it (an unknown or misspelt key exits), and every key it
    sets reaches the options with the value written: the parser neither drops nor rewrites one."""
    problems = []
    for config in ALL_CONFIGS:
        try:
            opt = support.load_train_opts(config)
        except SystemExit as exc:
            problems.append(f"{config}: refused by the parser (exit {exc.code})")
            continue
        for key, value in support.read_yaml(config).items():
            parsed = getattr(opt, key, "<no such option>")
            if key == "data" and isinstance(parsed, str):  # OpenNMT-py keeps the corpora as the text of a dict
                parsed = ast.literal_eval(parsed)
            if parsed != value:
                problems.append(f"{config}: {key}: written {value!r}, parsed {parsed!r}")
    assert len(ALL_CONFIGS) > 300
    assert not problems, "\n".join(problems)


def test_the_readme_quickstart_training_reports_progress():
    """The quickstart's short training prints progress lines: -report_every below its -train_steps (the demo
    config reports every 100 steps, after the 50 steps had ended)."""
    config = yaml.safe_load((support.REPO / "yaml_configs/demo/tatoeba_zhen.yaml").read_text(encoding="utf-8"))
    readme = (support.REPO / "README.md").read_text(encoding="utf-8")
    commands = [line.split() for line in readme.splitlines() if line.startswith("onmt_train -config build/quickstart")]
    assert commands, "no quickstart onmt_train command in README.md"
    for words in commands:
        steps = int(words[words.index("-train_steps") + 1]) if "-train_steps" in words else config["train_steps"]
        every = int(words[words.index("-report_every") + 1]) if "-report_every" in words else config["report_every"]
        assert every < steps, " ".join(words)
