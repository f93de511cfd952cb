"""``oomload tune``: start the user's server with candidate memory settings and prove the one that carries
the traffic (docs/tune.md).

* ``search``   — which settings to start next and which one wins (pure; its docstring has every rule);
* ``ladder``   — the ladders searched when the user names none: utilization, ``max_num_seqs`` (pure);
* ``stops``    — why a search ended without a winner: no evidence, or a death no setting answers (pure);
* ``guide``    — the trace's odds on a candidate's pool: onsets, the first guess, the evidence (pure);
* ``evidence`` — whether a replay held the target, or a capped candidate its cap (pure);
* ``startup``  — a failed start classified from the server's own log (pure);
* ``context``  — a tune's configuration and what every candidate of it shares;
* ``rate``     — ``--target-rate``: the concurrency a request rate needs, measured on the server (pure);
* ``record``   — ``tune.json`` (schema ``oomload.tune/1``), one typed value per candidate (pure);
* ``prove``    — one candidate's replay and what it proves (I/O);
* ``run``      — the runner: per candidate start → pool → odds → replay → proof (I/O); it returns
  the record, which the CLI renders (``oomload.report.tune``).

The user's ``--serve`` line with a candidate's flags is ``oomload.realvllm.servecmd``.

Nothing is imported here: the pure modules stay importable without the runner's I/O.
"""
