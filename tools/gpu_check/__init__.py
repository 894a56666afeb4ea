"""The GPU check (``python -m tools.gpu_check``; docs/gpu-check.md): decoding properties, training and translation
speed of every mechanism on one CUDA GPU, and its CPU dry run (``--device cpu --tiny``).

cli.py       the command: its options, the stages in order within their budgets, the report written
plan.py      the budget scheduler: parts, stages, the plan's estimate, the rows that fit (pure functions)
cases.py     what is measured: section a's configs, the cases and their targets, the A/A control
properties.py, training.py, translation.py   sections a, b and c on the parent's side
meter.py     the instruments of a training run inside OpenNMT-py's trainer (restored when done)
child.py     the child processes that train and translate
report.py    the Markdown report
"""
