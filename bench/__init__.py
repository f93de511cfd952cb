"""oomload benchmarks (``make bench``). Each ``bench_*.py`` module has a ``main()`` that prints ratios
against a baseline measured in the same run; absolute times drift on a shared machine."""
