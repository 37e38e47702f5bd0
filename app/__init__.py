"""ddpviz web app (Streamlit + Altair). Imports no torch: it talks to runs through `workers.client`.

The map of this folder:
    main        the entry file: routes only (`st.navigation`); each page is a file under views/
    views/      the pages: launch, live, runs, compare, buckets, dp_timeline, theory, learn, sweeps,
                scaleout, cluster, tune
    frames/     events -> pandas DataFrames (pure: no Streamlit, no Altair)
    charts/     DataFrames -> Altair charts (pure: no Streamlit)
    panels, panels_fsdp, panels_memory   the Live page's panels    window, step_history   bounded reads of a run
    panels_buckets        bucket timelines (Live's, and side by side on the Bucket timeline and Tune pages)
    runsets     the set of runs the analysis pages look at      form, widgets   the Launch form
    explain     sentences beside the numbers                    exports   downloads of a run
    connection, outage    the one Redis client, and the banner when Redis is away
    navigation  which page the previous script run drew (an arrival vs a rerun)
    bench_app   figure 4 and the app half of figure 8 of ``ddpviz bench``
"""
