"""The judging pipeline: from a run directory to the verdict, its recommendation and the gate (pure).

Read in this order:

1. ``runview`` — the run directory as plain values: its steps with the requests, ``/metrics`` scrapes
   and GPU samples measured during each (the one module here that reads files);
2. ``death`` — the engine's death and its casualties, found first from the raw run; ``deathcause`` — of
   what it died (cuda_oom, cpu_oom, oom_killed, killed, crash, no_cause) from the server's log, exit
   status and memory; ``deathlog`` — that log read: the root-cause line, its consequences kept out;
3. ``stepfacts`` — one ``StepFacts`` per step: counts, latencies, KV and queue peaks (sustained ones
   from ``gauges``), the server's side (``oomload.rundir.serverside``), whether the step can be trusted;
   ``stepsummary`` — a step's ``StepFacts`` from its requests, scrapes and samples;
   ``loadgen`` — whether a step that did not hold its level had a starved load generator;
   ``prefixrate`` — which prompt shape the run measured, and the server's prefix-cache hit rate;
   ``servermem`` — the server's own host memory over the run;
   ``rates`` — per 100 requests, per second, the mean in flight: one definition of each;
4. ``prediction`` — the block arithmetic's onset band, compared with the observed onset;
   ``replayed`` — the trace's requests the run replayed (``--only-fitting``, ``--tail-percentile``),
   from which every prediction from the trace draws;
5. ``confidence`` — the caveats and the confidence level;
6. ``levels`` — each level over its steps: the onsets, the first unsafe and the last safe level;
   ``runinfo`` — the run as a whole: cut short where, context overflow;
7. ``verdict`` — puts them together in the ``Verdict`` (its module docstring states every rule);
   ``failures`` — the most common reason of each failed outcome, named beside its count;
8. ``recommend`` — the serving flags the verdict supports; ``deathadvice`` — what an engine death asks
   of them;
9. ``gate`` — CI rules judged against the verdict; ``gatesignals`` — what a rule can name;
   ``gateresult`` — a rule's result; ``relative`` — rules bounded by a baseline run's verdict, with
   ``shift`` — whether an onset or a latency moved between two runs beyond noise (the statistics);
   ``lastsafe`` — the range the true last safe level lies in, and a rule on it judged over that range;
10. ``trend`` — a soak's memory series: growing, levelled off, flat, shrinking or inconclusive, and when
    it meets its limit; ``trendfit`` — the line through its bin means and its noise model; ``studentt``
    — Student's t (cdf, quantile) for its interval, exact, without scipy.

The trace's odds (``oomload.capacity.odds``) and the statistics (``oomload.trace.stats``) live on
the floors below: the live schedule uses them too. This package re-exports the verdict's public names.
"""

from oomload.verdict.verdict import (
    DEFAULT_MIN_REQUESTS,
    KV_SATURATED,
    UNSAFE_OUTCOMES,
    ConfidenceNote,
    ContextOverflow,
    EngineDeath,
    LatencyStats,
    LevelOnset,
    LevelSummary,
    Prediction,
    PreemptionOnset,
    RunInfo,
    StepFacts,
    Verdict,
    build_verdict,
    first_unsafe_concurrency,
    kv_peak_text,
    kv_percent,
    last_safe_concurrency,
)

__all__ = [
    "DEFAULT_MIN_REQUESTS",
    "KV_SATURATED",
    "UNSAFE_OUTCOMES",
    "ConfidenceNote",
    "ContextOverflow",
    "EngineDeath",
    "LatencyStats",
    "LevelOnset",
    "LevelSummary",
    "Prediction",
    "PreemptionOnset",
    "RunInfo",
    "StepFacts",
    "Verdict",
    "build_verdict",
    "first_unsafe_concurrency",
    "kv_peak_text",
    "kv_percent",
    "last_safe_concurrency",
]
