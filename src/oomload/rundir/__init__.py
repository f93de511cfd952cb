"""The run directory: the contract between the processes that write a run and the verdict that reads
it. ``io`` writes and reads its files (the table of files is in its docstring); ``records`` types
their lines (``servermemory`` those of ``server_memory.jsonl``); ``loadgenrecord`` types a step end
line's ``loadgen`` entries (the load generator's own figures); ``provenance`` is what a comparison of
two runs needs (``provenance.json``); ``serverside`` reads what the server itself held from its
counters (pure); ``summary`` reads ``summary.json`` back as typed values (every reader of a run's
verdict goes through it)."""

from oomload.rundir.io import (
    RUN_SCHEMA_VERSION,
    SERVER_DEAD_MARKER,
    STREAMS,
    RunReader,
    RunWriter,
    check_run_dir_creatable,
    json_object,
    mark_server_dead,
    new_run_dir,
    run_dir_error,
    server_marked_dead,
)

__all__ = [
    "RUN_SCHEMA_VERSION",
    "SERVER_DEAD_MARKER",
    "STREAMS",
    "RunReader",
    "RunWriter",
    "check_run_dir_creatable",
    "json_object",
    "mark_server_dead",
    "new_run_dir",
    "run_dir_error",
    "server_marked_dead",
]
