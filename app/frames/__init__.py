"""Pure transforms: run events (docs/events.md) -> pandas DataFrames. No Streamlit, no Altair.

    base      of_type, run labels, the newest complete step        steps    throughput, split, bytes
    runs      the Runs table                                        buckets  the bucket timeline
    dp        DP phases, idle gaps                                  memory   within-step memory curves
    fsdp      FSDP units and memory                                 compare  one row of measures per run
    theory    the all-reduce probe and fits                         topology who talks to whom (Learn)
    scaleout  the Scale-out report                                  sweeps   sweeps; cluster  workers
    tune      a stored `ddpviz tune` report: trials table, ratios, the runs of each round
    detail    which step a one-step view opens on (the typical one) and how it is named
"""
