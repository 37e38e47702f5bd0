"""Pure chart builders: `DataFrame -> alt.Chart`, one module per topic. No Streamlit.

Each takes the matching `app.frames` output and returns a chart with a title, axis titles that
carry units and a legend, so it is checked through `chart.to_dict()` without a browser.

    style     sizes, colours per category, the step axis, title and legend helpers
    steps     throughput curves, step-time split, bytes per device      live   Live's step-axis charts
    buckets   the bucket timeline     dp   DP phases and timeline       memory  memory curves
    fsdp, compare, theory, topology, scaleout, sweeps, cluster, tune: one per page
"""
