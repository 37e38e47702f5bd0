"""ddpviz engine: single-device, DP, DDP and FSDP training, instrumented. Imports no Redis, no app.

The map of this folder (arrows point at what a module imports; nothing imports upward):

    run ──► runner ──► modes/ (one folder per parallelism) ──► measure/, components/
      └──► result                      predict/ and harness/ sit beside modes/, never under them

Top level — the run's contracts and entry point:
    config     `RunConfig`, validated before anything runs (no torch)
    events     event shapes and the sinks that carry them out of a run
    batching   a process's events written by a background thread, in batches (BatchingSink, Later)
    run        `run_training`: one job, reported through a sink (the workers' entry point)
    runner     does the work: pre-flight, `run_started`, the mode, `run_finished`
    result     `RunResult` (no torch)          stages   where a run failed (no torch)
    data       real datasets and the per-rank batch plan     models, plugins   the model registry
    summary    a run's summary from its events (no torch)    analysis  derived measures (no torch)
    export     JSONL, CSV and Chrome-trace exports (no torch)
    verdict    DP vs DDP from two summaries: who is ahead, the gap in measured parts (no torch)
    tune       `ddpviz tune`: candidates, predicted and measured ratios, the verdict (no torch)

Folders:
    components/  what every mode shares: training pieces, the step loop, pre-flight, devices, faults
    modes/       single, the launcher and rank bootstrap, and dp/, ddp/, fsdp/ (no mode imports another)
    measure/     telemetry, clocks, memory readings, the memory sampler and ledger, replica checksums, turns
    predict/     the scale-out predictor (no torch)
    harness/     runs that measure ddpviz itself or several runs side by side: compare, overhead, GPU checks
    attach/      instruments a script ddpviz did not launch (`ddpviz run -- torchrun ... train.py`)

`engine.plugins`, `engine.data` and `engine.models` are the plugin API: their paths stay put.
"""
