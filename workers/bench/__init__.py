"""`ddpviz bench`: the one record of ddpviz's own performance (issue 10), as JSON and Markdown.

Figures, each measured in one run of the bench, never in a timed test:

1. event latency, rank -> Redis (`latency`, on real demo runs from `runs`)
2. event latency, Redis -> the Live page, in Chromium (`browser`)
3. publish throughput through the real forwarding path, every event accounted for (`flood`)
4. the app's data path on runs of 1 K, 10 K, 100 K events (`app.bench_app`, in its own process)
   and time to first chart in Chromium (`browser`), on runs from `synthetic`
5. memory samples per second per device (`measured`) and instrumented / plain DDP step time
   (`overhead`)
6. in-run bucket busbw / probe busbw (`measured`, through `engine.analysis`)
7. samples/s of single, DP and DDP and scaling efficiency (`throughput`)
8. footprint: Redis per 1,000 steps, the app's memory, Redis growth with and without retention
9. what attaching costs a script, by the script's own printed iteration times (`attach_cost`), and
   what a Redis stopped mid-run costs it (`attach_redis_loss`)
10. what ddpviz's DDP adds per bucket and per step, against plain torch DDP (`bucket_cost`); an
    attached script's per-bucket cost, `ddpviz run --bucket-timing hook` vs `recorder`
    (`attach_bucket_cost`, run on its own: ``python -m ddpviz.workers.bench.attach_bucket_cost``), and an
    attached small step under `ddpviz run` against plain, with ddpviz's own time on its training thread
    (`attach_step`, on its own: ``python -m ddpviz.workers.bench.attach_step``)

Layout: the bench is split by concept under `workers/bench/`; `figures` runs each figure and
`cli` orders them and writes the record (`report`). Imports keep pointing app -> workers ->
engine: the app-side figures need app code, which workers may not import, so they run as
``python -m ddpviz.app.bench_app`` (a subprocess fed the run ids, printing JSON) and as the real app
server driven by a browser. A process of its own is also what the app-memory figure needs.
"""
