"""The capacity model: what a KV-cache pool holds, and the schedule that probes it (pure).

Modules:

- ``blocks``: KV-block arithmetic — how many requests of given lengths a block pool holds.
- ``scheduler``: vLLM V1's scheduler as a model (admission, preemption, prefix hits), shared by
  the odds and the simulated vLLM.
- ``odds``: the trace's own odds — how often ``c`` requests drawn from a trace preempt on a pool.
- ``schedule``: the rising-concurrency step schedule — which level next, when the run stops.
"""
