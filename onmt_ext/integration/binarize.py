"""``onmt_ext_binarize -config <training config>``: the training corpora as token ids, for ``-ext_binarized``.

Reads the config as ``onmt_train`` does (the same options, strictly parsed and validated), then
:func:`onmt_ext.runtime.binarized.build` writes the directory that the config's ``-ext_binarized`` names, where
``onmt_train`` with the same config then reads its training batches (with ``-ext_binarized_cache ROOT``: the
directory under ROOT that ``onmt_train`` would otherwise binarise into at its start). Errors end in one line
(:func:`onmt_ext.integration.commands.run_main`). docs/binarized-data.md.
"""

import sys

from onmt_ext.errors import UsageError

PROG = "onmt_ext_binarize"


def binarize(argv=None):
    """Parse ``argv`` (default: the command line) as ``onmt_train`` would, and binarise its training corpora."""
    from onmt.utils.logging import init_logger, logger
    from onmt.utils.parse import ArgumentParser

    from onmt_ext.integration.commands import log_file_problems, missing_vocabularies
    from onmt_ext.integration.parsing import train_parser
    from onmt_ext.runtime import binarized

    parser = train_parser()
    parser.prog = PROG
    parser.add("--processes", "-processes", type=int, default=0,
               help="onmt_ext_binarize: processes that binarise a corpus side by side, each a share of its lines; "
                    "0: one per 100,000 lines, at most the CPUs available and 16")
    opt, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    options = binarized.BinarizedOptions.from_opt(opt)
    if not (options.binarized or options.binarized_cache):
        raise UsageError("-ext_binarized: name the directory to write (in the config, where onmt_train reads it), "
                         "or -ext_binarized_cache the directory to write under")
    problems = log_file_problems(opt)  # (init_logger: a traceback on a directory, log lines into an input)
    if problems:
        raise UsageError("\n".join(problems))
    init_logger(opt.log_file or None)
    ArgumentParser.validate_train_opts(opt)
    missing = missing_vocabularies(opt)
    if missing:
        raise UsageError("\n".join(missing))
    if opt.processes < 0:
        raise UsageError(f"-processes {opt.processes}: must be >= 0")
    if options.binarized_cache:
        directory = binarized.build_cached(opt, options.binarized_cache, say=logger.info, processes=opt.processes)
        logger.info(f"{directory} holds these training batches: onmt_train with -ext_binarized_cache "
                    f"{options.binarized_cache} and this config reads them")
        return
    binarized.build(opt, options.binarized, overwrite=opt.overwrite, say=logger.info, processes=opt.processes)
    logger.info(f"onmt_train with -ext_binarized {options.binarized} reads these training batches")


def main(argv=None):
    """The console script ``onmt_ext_binarize``."""
    import onmt  # noqa: F401  (activates onmt-ext)

    from onmt_ext.integration import binarize as command  # this module by name also under python -m
    from onmt_ext.integration.commands import run_main

    return run_main(command.binarize, argv)


if __name__ == "__main__":
    main()
