"""Strategies over one recurrence: interchangeable, faster ways of solving a level of it.

The recurrence is the plain one in ``pipeboard.trainer.plan.recurrence`` (the reference's loops,
the definition of the optimum, and itself the strategy ``plain``). ``pipeboard.trainer.plan.solve``
chooses a strategy per level (``choose``) and runs them innermost first (``solve_levels``); each
strategy exploits what its level needs and forms every candidate with the same cost formulas
(``pipeboard.trainer.plan.formulas``), so none changes the numbers:

- ``top_row``: the outermost level, row 0 only, machine count outermost;
- ``all_rows``: a level below the top, every block start at once;
- ``two_machine_top``: the level just below a two-machine top level;
- ``capped_chain``, with its bounds in ``chain_caps``: the levels below the top of a chain,
  within caps from a bound on the optimum, in a loop numba compiles when it is installed;
- ``arrays``: the NumPy views of a state chain and the solved table they share.

Tests hold them to the plain recurrence:

- ``tests/trainer/test_plan_strategies.py``: ``top_row``'s rows and ``all_rows``' tables equal
  the plain recurrence's entry for entry, ``two_machine_top`` every entry the top level reads,
  ``capped_chain`` (interpreted and compiled) the plain optimum, and every valid mix of the
  strategies and ``plain`` gives the same Plan;
- ``tests/trainer/test_plan_capped_chain.py``: ``capped_chain`` on longer chains against the
  uncapped strategies (``all_rows``, ``top_row``), and on one chain against the plain recurrence;
- ``tests/trainer/test_plan_arrays.py``: ``arrays``' views against their plain forms, and a
  table ``top_row`` solved read out to the plain recurrence's choices.

``tests/trainer/test_plan_exact.py`` also checks the strategies the planner picks against a brute
force with its own formulas. The strategies import NumPy and load only when ``solve`` picks one;
this package imports none of them, so a plan solved by ``plain`` never loads NumPy.
"""
