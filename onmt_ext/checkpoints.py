"""What ``-train_from`` and ``onmt_average_models`` would silently lose or misread, refused in one line.

* :func:`resume_problems`: a resumed run continues at the checkpoint's step + 1 (step 1 with
  ``-reset_optim all``); a ``-train_steps`` at or below the checkpoint's step trains one step and exits 0,
  and the run overwrites ``<save_model>_step_N.pt`` files of later steps.  Both are refused (the second
  unless ``-overwrite_checkpoints``) before anything is trained.
* :func:`replaced_tensor_problem`: a mechanism that *replaces* a stock sub-module (li2019's aggregation
  stands where ``final_linear`` was) cannot start from a checkpoint without it; the error says so instead of
  blaming the checkpoint's version (:func:`vocabulary_problem`: likewise clause attention, whose transform
  changes the vocabularies).  Mechanisms that only *add* tensors (GRET, cao2019) fine-tune from a baseline
  (:func:`onmt_ext.gret.load_with_new_parameters`).
* :func:`average_problems`: ``onmt_average_models`` on a missing file, a non-checkpoint, or checkpoints of
  different models; :func:`average` averages tied tensors once (stock: twice).
"""

import os

from onmt_ext.patches import FIX, patch

#: Mechanisms that replace a stock sub-module: the onmt-ext module that holds the class -> what it replaces
#: and why the checkpoint's tensors cannot seed it.
REPLACING = {
    "onmt_ext.li2019": (
        "li2019's routing aggregation (-li2019_enc_self/-li2019_dec_self/-li2019_enc_dec) replaces the "
        "attention's output projection final_linear (W^O, eq. 4) by per-head capsule maps (eq. 5-6); no rule "
        "maps W^O onto them and Li et al. (2019) train it from scratch, not from a baseline"),
    "onmt_ext.disan": (
        "DiSAN (-disan_enc) replaces the encoder's self-attention by its directional one, and onmt-ext maps "
        "none of the checkpoint's attention tensors onto it"),
}


def checkpoint_step(checkpoint):
    """The step at which ``checkpoint`` was saved, or None when it records none (an averaged checkpoint).

    OpenNMT-py stores the *next* step, ``training_step = step + 1``.
    """
    optim = checkpoint.get("optim") if isinstance(checkpoint, dict) else None
    step = optim.get("training_step") if isinstance(optim, dict) else None
    return step - 1 if isinstance(step, int) else None


def resume_problems(opt, checkpoint):
    """Messages for a ``-train_from`` run (``opt``) from ``checkpoint`` that would train nothing or overwrite.

    The run's first step is ``s + 1`` for a checkpoint of step ``s`` (``1`` with ``-reset_optim all`` or a
    checkpoint without optimiser state).  Refused: ``-train_steps <= s`` (unless ``-single_pass``), and
    ``<save_model>_step_N.pt`` files with ``N`` at or after the first step, unless ``-overwrite_checkpoints``.
    """
    from onmt_ext.plugin import step_checkpoints

    step = checkpoint_step(checkpoint)
    if getattr(opt, "reset_optim", "none") == "all":
        step = None
    problems = []
    train_steps = getattr(opt, "train_steps", 0)
    if step is not None and not getattr(opt, "single_pass", False) and train_steps <= step:
        problems.append(f"-train_steps {train_steps}: at or below the step of -train_from {opt.train_from} "
                        f"({step}); a resumed run counts on from it, so give the total (above {step}), or "
                        f"-reset_optim all to fine-tune from step 1")
    first = 1 if step is None else step + 1
    later = [path for number, path in step_checkpoints(getattr(opt, "save_model", "model")) if number >= first]
    if later and not getattr(opt, "overwrite_checkpoints", False):
        shown = ", ".join(later[:3]) + (", …" if len(later) > 3 else "")
        problems.append(f"-save_model {opt.save_model}: holds checkpoints of step {first} or later ({shown}) "
                        f"that this run, starting at step {first}, would overwrite; resume from the last one, "
                        "pass -overwrite_checkpoints to train over them, or choose another -save_model")
    return problems


def _resume_checked(stock, opt, checkpoint=None):
    """``train_single._get_model_opts``: refuse a resumed run that trains nothing or overwrites later steps."""
    if checkpoint is not None:
        problems = resume_problems(opt, checkpoint)
        if problems:
            from onmt_ext.plugin import UsageError

            raise UsageError("\n".join(problems))
    return stock(opt, checkpoint)


def _mechanism_of(model, name):
    """The Python module (``onmt_ext.<name>``) of the onmt-ext mechanism module of ``model`` that holds the path
    of tensor ``name``, or None when the path lies in stock modules only."""
    parts = name.split(".")[:-1]
    for end in range(len(parts), 0, -1):
        try:
            owner = type(model.get_submodule(".".join(parts[:end]))).__module__
        except AttributeError:  # the path goes on below what the model has
            continue
        if owner.startswith("onmt_ext.") and owner != "onmt_ext.transformer":
            return owner
    return None


def replaced_tensor_problem(model, checkpoint):
    """Why ``checkpoint``'s tensors cannot seed ``model`` because a mechanism replaced their module, or None.

    Applies when every tensor of the checkpoint that the model lacks lies where the model now has an
    onmt-ext mechanism module (any other mismatch is left to the stock error).
    """
    names = set(checkpoint["model"]) | {f"generator.{k}" for k in (checkpoint.get("generator") or {})}
    own = {name for name, _ in model.named_parameters(remove_duplicate=False)}  # tied generator.weight too
    own |= {name for name, _ in model.named_buffers(remove_duplicate=False)}
    extra = sorted(names - own)
    kinds = {_mechanism_of(model, name) for name in extra}
    if not extra or None in kinds:
        return None
    what = "; ".join(REPLACING.get(kind, f"{kind} replaces a stock module") for kind in sorted(kinds))
    shown = ", ".join(extra[:2]) + (f" and {len(extra) - 2} more" if len(extra) > 2 else "")
    return (f"this model cannot be fine-tuned from a checkpoint without its mechanism: {what}; the checkpoint's "
            f"{shown} have no place in it. Train it from scratch (without -train_from), or resume a checkpoint "
            "that has the mechanism")


def vocabulary_problem(model, checkpoint):
    """Why ``checkpoint``'s tensors do not fit ``model`` when only the vocabulary sizes differ, or None.

    With ``-train_from``, OpenNMT-py rebuilds the vocabularies from ``-src_vocab``/``-tgt_vocab`` when the
    transforms differ from the checkpoint's, e.g. ``clause_split`` added for clause attention (its clause
    markers are new words): the embedding and generator rows then no longer match.
    """
    shapes = {name: tuple(t.shape) for name, t in model.named_parameters(remove_duplicate=False)}
    saved = {**checkpoint["model"], **{f"generator.{k}": v for k, v in (checkpoint.get("generator") or {}).items()}}
    differing = {name: (tuple(saved[name].shape)[0], shapes[name][0]) for name in saved
                 if name in shapes and tuple(saved[name].shape) != shapes[name]}
    if not differing or any(tuple(saved[name].shape)[1:] != shapes[name][1:] or not
                            ("emb_luts" in name or name.startswith("generator.")) for name in differing):
        return None
    sizes = {("source" if name.startswith("encoder.") else "target"): size for name, size in differing.items()}
    shown = "; ".join(f"{side}: {theirs} words in the checkpoint, {mine} here" for side, (theirs, mine) in
                      sorted(sizes.items()))
    return (f"the vocabularies differ from the checkpoint's ({shown}): OpenNMT-py rebuilds them when -transforms "
            "differ from the checkpoint's (clause_split adds its clause markers), and onmt-ext maps no word "
            "embeddings across vocabularies; train with the checkpoint's transforms, or from scratch (the clause "
            "attention paper describes no fine-tuning from a baseline)")


def _load_state_dict_checked(stock, self, checkpoint, *args, strict=True, **kwargs):
    """``BaseModel.load_state_dict``: one true line when a mechanism replaced the checkpoint's module or the
    vocabularies differ."""
    if strict and isinstance(checkpoint, dict) and "model" in checkpoint:
        problem = replaced_tensor_problem(self, checkpoint) or vocabulary_problem(self, checkpoint)
        if problem:
            from onmt_ext.plugin import UserError

            raise UserError(problem)
    return stock(self, checkpoint, *args, strict=strict, **kwargs)


# --------------------------------------------------------------------------
# onmt_average_models


def _load_lazily(path):
    """``torch.load`` of ``path`` on the CPU, memory-mapped where the format allows (only names and shapes are
    read)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", mmap=True)
    except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
        return torch.load(path, map_location="cpu")


def _signature(checkpoint):
    """``(architecture and mechanism options, {tensor name: shape})`` of a checkpoint."""
    from onmt_ext.options import OPTION_SPECS
    from onmt_ext.plugin import ARCHITECTURE_OPTIONS

    opt = checkpoint["opt"]
    defaults = {spec.name: spec.default for spec in OPTION_SPECS}
    options = {name: getattr(opt, name, defaults.get(name)) for name in ARCHITECTURE_OPTIONS + tuple(defaults)}
    options.pop("ext_compile", None)  # how it runs, not what it is
    shapes = {f"model.{k}": tuple(v.shape) for k, v in checkpoint["model"].items()}
    shapes.update({f"generator.{k}": tuple(v.shape) for k, v in (checkpoint.get("generator") or {}).items()})
    return options, shapes


def average_problems(paths):
    """Messages for ``onmt_average_models -models paths`` that stock would end in a traceback (empty: none).

    Every file must exist and be an OpenNMT-py checkpoint, and all must be of one model: the same
    architecture and mechanism options and the same tensor names and shapes as the first.
    """
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        return [f"-models {path}: no such checkpoint file" for path in missing]
    problems, first = [], None
    for path in paths:
        try:
            checkpoint = _load_lazily(path)
        except Exception as error:  # UnpicklingError, RuntimeError (zip), EOFError, ...
            problems.append(f"-models {path}: not an OpenNMT-py checkpoint ({type(error).__name__})")
            continue
        if not (isinstance(checkpoint, dict) and {"model", "generator", "opt"} <= set(checkpoint)):
            problems.append(f"-models {path}: not an OpenNMT-py checkpoint (no model, generator and options)")
            continue
        options, shapes = _signature(checkpoint)
        if first is None:
            first = (path, options, shapes)
            continue
        differing = [f"-{name} {value!r} (in {first[0]}: {first[1][name]!r})"
                     for name, value in options.items() if value != first[1][name]]
        if differing:
            problems.append(f"-models {path}: another model than {first[0]}: {'; '.join(differing)}; average "
                            "checkpoints of one run")
        elif shapes != first[2]:
            odd = sorted(set(shapes) ^ set(first[2])) or sorted(k for k in shapes if shapes[k] != first[2][k])
            problems.append(f"-models {path}: its tensors differ from those of {first[0]} ({odd[0]}"
                            f"{' and more' if len(odd) > 1 else ''}); average checkpoints of one run")
    return problems


def average(model_files, fp32=False):
    """The mean of the checkpoints ``model_files`` in stock ``onmt_average_models``' layout (``optim`` None).

    The running mean ``m_i = (i m_{i-1} + x_i) / (i + 1)`` is taken once per *stored* tensor: a tied pair
    (``-share_decoder_embeddings``: the generator's weight and the target embeddings share storage) is
    one tensor.  Stock updates it once per name, so its tied weights came out as ``a/4 + 3b/4`` for two
    checkpoints.
    """
    import torch

    final = None
    for i, path in enumerate(model_files):
        checkpoint = torch.load(path, map_location="cpu")
        parts = {"model": checkpoint["model"], "generator": checkpoint["generator"] or {}}
        if fp32:
            parts = {part: {k: v.float() for k, v in tensors.items()} for part, tensors in parts.items()}
        if final is None:
            final = {"vocab": checkpoint["vocab"], "opt": checkpoint["opt"], "optim": None, **parts}
            continue
        done = set()
        for part in ("model", "generator"):
            for key, tensor in final[part].items():
                where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
                if where not in done:
                    done.add(where)
                    tensor.mul_(i).add_(parts[part][key]).div_(i + 1)
    return final


def _average_checked(stock, model_files, fp32=False):
    """``onmt.bin.average_models.average_models``: :func:`average_problems`, then :func:`average` (stock's loop
    averages tied tensors twice)."""
    problems = average_problems(model_files)
    if problems:
        from onmt_ext.plugin import UsageError

        raise UsageError("\n".join(problems))
    return average(model_files, fp32)


def install():
    """Register the checks (the ``load_state_dict`` check as the first layer, before onmt_ext.plugin's)."""
    import onmt.train_single as train_single
    from onmt.bin import average_models
    from onmt.models.model import BaseModel

    from onmt_ext.plugin import _run_main

    patch(train_single, "_get_model_opts", _resume_checked, kind=FIX, order=1,  # after the options' check
          reason="-train_from with -train_steps at or below the checkpoint's step trains one step and exits 0; a "
                 "resumed run overwrites the same run's checkpoints of later steps without a word",
          test="tests/integration/test_checkpoints_cli.py::test_a_resumed_run_never_overwrites_later_checkpoints")
    patch(BaseModel, "load_state_dict", _load_state_dict_checked, kind=FIX, order=0,  # before plugin's two layers
          reason="fine-tuning li2019 (or DiSAN, or clause attention) from a checkpoint without it ends in 'was it "
                 "written by another version ... or altered?' although the mechanism replaced the checkpoint's "
                 "final_linear (clause_split: the vocabularies were rebuilt)",
          test="tests/integration/test_checkpoints_cli.py::test_li2019_from_a_baseline_says_why_in_one_line")
    patch(average_models, "average_models", _average_checked, kind=FIX,
          reason="a missing file, a non-checkpoint or checkpoints of different models end in a FileNotFoundError "
                 "or KeyError traceback (or average unrelated tensors); tied weights (-share_decoder_embeddings) "
                 "are averaged twice, so the target embeddings and generator come out wrong",
          test="tests/integration/test_checkpoints_cli.py::test_average_models_mistakes_get_one_line")
    patch(average_models, "main", _run_main, kind=FIX, reason="onmt_average_models' errors end in one line",
          test="tests/integration/test_checkpoints_cli.py::test_average_models_mistakes_get_one_line")
