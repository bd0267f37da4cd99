"""bnfold's benchmarks: one package, each part a script that prints its tables (never a test).

``run_all.py`` runs the parts listed in its ``PARTS`` table, each in its own process
(``python benchmarks/run_all.py [--quick] [--only A,D]``); every part also runs alone
(``python benchmarks/fold_real.py --quick``).  Shared pieces: ``common.py`` (timing, tables, the
machine, the batch norm counter that reads bnfold's op tables), ``models.py`` and
``real_models.py`` (the benchmark architectures).
"""
