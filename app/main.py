"""Entry point: `streamlit run app/main.py`. Routes only; each page is a file under app/views/.

The folder is not called `pages/`: Streamlit treats a `pages/` folder next to the main script as
its older multipage mode, and a browser's first request for e.g. /live on a fresh server would
then run that file directly, bypassing this router and its page config.
"""

import streamlit as st

from ddpviz.app.navigation import note_page

st.set_page_config(page_title="ddpviz", layout="wide")
page = st.navigation({
    "Run": [
        st.Page("views/launch.py", title="Launch", icon=":material/rocket_launch:", default=True),
        st.Page("views/live.py", title="Live", icon=":material/monitoring:"),
        st.Page("views/runs.py", title="Runs", icon=":material/list:"),
    ],
    "See the difference": [
        st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:"),
        st.Page("views/buckets.py", title="Bucket timeline", icon=":material/view_timeline:"),
        st.Page("views/dp_timeline.py", title="DP timeline", icon=":material/hub:"),
        st.Page("views/theory.py", title="Theory vs measurement", icon=":material/functions:"),
        st.Page("views/learn.py", title="Learn: star, ring, shards", icon=":material/school:"),
    ],
    "Scale": [
        st.Page("views/sweeps.py", title="Sweeps", icon=":material/stacked_line_chart:"),
        st.Page("views/tune.py", title="Tune", icon=":material/tune:"),
        st.Page("views/scaleout.py", title="Scale-out", icon=":material/trending_up:"),
        st.Page("views/cluster.py", title="Cluster", icon=":material/dns:"),
    ],
})
note_page(st.session_state, page.url_path)  # lets a page tell an arrival from a rerun
page.run()
