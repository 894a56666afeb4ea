"""onmt_ext.integration.checkpoints and onmt_ext.integration.command_line in process: the rules behind the one-line
errors."""

import argparse

import torch

import support


def _opt(tmp_path, **values):
    base = dict(train_from="ckpt.pt", train_steps=30, reset_optim="none", single_pass=False,
                save_model=str(tmp_path / "model"), overwrite_checkpoints=False)
    return argparse.Namespace(**{**base, **values})


def _touch(tmp_path, *steps):
    for step in steps:
        (tmp_path / f"model_step_{step}.pt").write_bytes(b"")


def test_resume_problems_follow_the_checkpoints_step(onmt_active, tmp_path):
    from onmt_ext.integration.checkpoints import checkpoint_step, resume_problems

    checkpoint = {"optim": {"training_step": 21, "decay_step": 21}}
    assert checkpoint_step(checkpoint) == 20 and checkpoint_step({"optim": None}) is None
    _touch(tmp_path, 10, 20)
    assert resume_problems(_opt(tmp_path), checkpoint) == []  # earlier steps and the checkpoint itself stay
    assert [p.split(":")[0] for p in resume_problems(_opt(tmp_path, train_steps=20), checkpoint)] == \
        ["-train_steps 20"]
    assert resume_problems(_opt(tmp_path, train_steps=20, single_pass=True), checkpoint) == []
    _touch(tmp_path, 40)
    problems = resume_problems(_opt(tmp_path), checkpoint)
    assert len(problems) == 1 and "step 21 or later" in problems[0] and "model_step_40.pt" in problems[0]
    assert "model_step_20.pt" not in problems[0]
    assert resume_problems(_opt(tmp_path, overwrite_checkpoints=True), checkpoint) == []
    # -reset_optim all starts at step 1: -train_steps is not compared, every checkpoint is later
    problems = resume_problems(_opt(tmp_path, train_steps=5, reset_optim="all"), checkpoint)
    assert len(problems) == 1 and "step 1 or later" in problems[0] and "model_step_10.pt" in problems[0]


def test_average_counts_a_tied_tensor_once(onmt_active, tmp_path):
    from onmt_ext.integration.checkpoints import average

    paths = []
    for i, value in enumerate((1.0, 3.0, 8.0)):
        shared = torch.full((2, 3), value)
        checkpoint = {"model": {"emb.weight": shared, "other": torch.full((2,), value)},
                      "generator": {"weight": shared, "bias": torch.full((2,), -value)},
                      "vocab": {"v": i}, "opt": argparse.Namespace(x=i), "optim": {"training_step": i}}
        paths.append(tmp_path / f"{i}.pt")
        torch.save(checkpoint, paths[-1])
    final = average(paths)
    assert torch.equal(final["model"]["emb.weight"], torch.full((2, 3), 4.0))
    assert torch.equal(final["generator"]["weight"], torch.full((2, 3), 4.0))
    assert torch.equal(final["model"]["other"], torch.full((2,), 4.0))
    assert torch.equal(final["generator"]["bias"], torch.full((2,), -4.0))
    assert final["optim"] is None and final["vocab"] == {"v": 0} and final["opt"].x == 0


def test_repeated_options_are_found_in_any_spelling(onmt_active):
    from onmt_ext.integration.command_line import repeated_option_messages

    parser = support.train_parser()
    argv = ["-config", "c.yaml", "-train_steps", "2", "-seed", "-1", "--train_steps=3", "-transforms", "a", "b"]
    (message,) = repeated_option_messages(parser, argv)
    assert message.startswith("-train_steps is given 2 times on the command line (-train_steps 2, --train_steps 3)")
    assert repeated_option_messages(parser, ["-seed", "-1", "-gret", "true", "-train_steps", "4"]) == []


def test_a_helpers_override_list_may_repeat_an_option(onmt_active):
    """Only a command's own command line is checked: tools append overrides after the user's (param_report)."""
    opt = support.load_train_opts("yaml_configs/smoke/foundation/ext_transformer.yaml", "-world_size", "1",
                                  "-world_size", "1")
    assert opt.world_size == 1
