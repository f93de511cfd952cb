"""The trace: oomload's first stage — what a replay sends, as lengths, timing and ids, never text.

Modules:

- ``model``: the trace file format (header and records), reading and writing it.
- ``streams``: a file opened as its readers parse it: decompressed as its first bytes say (gzip,
  zstd), a leading UTF-8 byte-order mark skipped.
- ``blockhash``: chained, salted block ids of prompts — the prefix structure without the text.
- ``pseudonyms``: salted pseudonyms of the names a trace carries (request ids, sessions, parents).
- ``prefix``: prefix reuse of a trace (what a prefix cache would hold) and its statistics.
- ``tally``: ``trace stats``' prefix reuse in bounded memory: exact up to a bound, then with a
  stated error.
- ``stats``: length-distribution statistics and the ``max_model_len`` a trace implies.
- ``synth``: synthetic traces from length-distribution specs, for users with no logs yet.

Logs become traces in ``oomload.ingest``; ``oomload.report.tracestats`` renders ``trace stats``.
"""
