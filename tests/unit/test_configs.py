"""The shipped YAML configs: all parse strictly, and every paper config has a smoke twin."""

import pytest
import yaml

import support

CONFIG_ROOT = support.REPO / "yaml_configs"
PAPER_CONFIGS = sorted(
    p.relative_to(CONFIG_ROOT)
    for p in CONFIG_ROOT.rglob("*.yaml")
    if p.relative_to(CONFIG_ROOT).parts[0] not in ("smoke", "demo", "compare", "sample")
)
ALL_CONFIGS = sorted(p.relative_to(support.REPO) for p in CONFIG_ROOT.rglob("*.yaml"))

# What a smoke twin may change: data and paths, sizes, schedule, hardware.
SIZE_AND_RUN_KEYS = {
    "save_data", "save_model", "src_vocab", "tgt_vocab", "src_vocab_size", "tgt_vocab_size", "share_vocab",
    "share_embeddings", "data", "transforms", "src_subword_model", "tgt_subword_model", "hidden_size",
    "word_vec_size", "transformer_ff", "heads", "enc_layers", "dec_layers", "layers", "dropout",
    "attention_dropout", "warmup_steps", "train_steps", "valid_steps", "save_checkpoint_steps",
    "keep_checkpoint", "report_every", "learning_rate", "batch_size", "valid_batch_size", "accum_count", "accum_steps",
    "world_size", "gpu_ranks", "model_dtype", "bucket_size", "num_workers", "src_seq_length", "tgt_seq_length",
    "routing_compile",  # torch.compile of the routing: speed only, same model
    "chen2019_dim",  # d_r scales with the model width (two of the four toy heads)
    "train_from", "override_opts", "reset_optim",  # GRET's fine-tuning start (the twins train from scratch)
    "batch_type",  # the clause paper counts its batches in sentences
    # the clause twins split the sample's Chinese source on the fly (jieba, a tagger trained on it); the paper
    # configs read English sources split beforehand
    "clause_lang", "clause_tagger_model", "clause_presplit",
}


def test_there_are_paper_configs():
    assert len(PAPER_CONFIGS) >= 10


@pytest.mark.parametrize("config", PAPER_CONFIGS, ids=[str(p) for p in PAPER_CONFIGS])
def test_every_paper_config_has_a_faithful_smoke_twin(config):
    twin = CONFIG_ROOT / "smoke" / config
    assert twin.exists(), f"missing smoke twin yaml_configs/smoke/{config}"
    paper = yaml.safe_load((CONFIG_ROOT / config).read_text(encoding="utf-8"))
    smoke = yaml.safe_load(twin.read_text(encoding="utf-8"))
    for key in sorted((set(paper) | set(smoke)) - SIZE_AND_RUN_KEYS):
        assert paper.get(key) == smoke.get(key), f"{key}: paper {paper.get(key)!r} != smoke {smoke.get(key)!r}"


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=[str(p) for p in ALL_CONFIGS])
def test_config_parses_strictly(config, onmt_active):
    opt = support.load_train_opts(config)
    assert opt.encoder_type in ("transformer", "ext_transformer")
