"""``oomload tune``: start the user's server with candidate memory settings and prove the one that carries
the traffic (docs/tune.md).

* ``search``   — which settings to start next and which one wins (pure; its docstring has every rule);
* ``startup``  — a failed start classified from the server's own log (pure);
* ``servecmd`` — the user's ``--serve`` line with a candidate's flags added or replaced (pure);
* ``record``   — ``tune.json`` (schema ``oomload.tune/1``), one typed value per candidate (pure);
* ``run``      — the runner: per candidate start → pool → odds → replay → proof (I/O).

Nothing is imported here: the pure modules stay importable without the runner's I/O.
"""
