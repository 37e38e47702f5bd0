"""How a run measures itself. Every figure names its source (docs/events.md).

    telemetry       events with the run's identity and a monotonic clock
    clocks          host and CUDA-event clocks for marks inside a step
    deferred        step figures read once the GPU reached them (loss, marks), never by a synchronize
    memory          readings cheap enough for a timer: process RSS, the CUDA allocator, NVML
    memory_timer    the timer: every device read 20 times a second, readings published as taken
    memory_sampler  the timer's readings and the traced steps: `memory` events
    ledger          the live-tensor ledger: bytes of every storage alive, per device and kind
    sync            checksums that tell whether copies of a model agree
    turns           turn-taking between jobs, so their step times are measured side by side
    gil             the GIL meter: a thread's lock wait from its CPU clock and schedstat run-queue wait
    gil_rank        the GIL meter on a DDP rank: metered step-clock marks and the rank's `gil` event
    own_threads     ddpviz's own threads named for the OS, and their CPU time read from /proc
    bootstrap       block-bootstrap intervals of medians of step times (the verdict, the overhead figure)
"""
