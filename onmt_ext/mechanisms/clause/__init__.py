"""Clause attention from signal-word splitting: :mod:`.split` (the ``clause_split`` transform, sec. 3.1-3.2) marks
the clauses; :mod:`.attention` (sec. 3.3-3.4) attends within them."""
